//! Which body of an exercise a build runs: the learner's code, the reference
//! leaned on in its place, or the shipped stub. The build script decides it
//! with this rule, and the workbook's tool and trainer report it with it, so
//! that every report tells the three apart the same way.

/// Which body of an exercise a build runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    /// The learner's code in `exercises/`.
    Yours,
    /// The reference in `solutions/`, compiled in place of the learner's file.
    Leaned,
    /// The learner's file still holds its shipped `todo!`: not started.
    NotStarted,
}

impl Body {
    /// Leaning wins whatever the file holds: edits there stay, unused.
    pub fn of(leaned: bool, holds_stub: bool) -> Self {
        match (leaned, holds_stub) {
            (true, _) => Body::Leaned,
            (false, true) => Body::NotStarted,
            (false, false) => Body::Yours,
        }
    }
}
