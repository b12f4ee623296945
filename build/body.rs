//! Which body of an exercise a build runs: the learner's code, the reference
//! leaned on in its place, the reference in place of a file that does not
//! parse, or the shipped stub. The build script decides it with this rule,
//! and the workbook's tool and trainer report it with it, so that every
//! report tells the four apart the same way.

// Each program that compiles this file uses part of it.
#![allow(dead_code)]

/// Which body of an exercise a build runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    /// The learner's code in `exercises/`.
    Yours,
    /// The reference in `solutions/`, compiled in place of the learner's file.
    Leaned,
    /// The learner's file does not parse: the reference in `solutions/` is
    /// compiled in its place until it does, so the other exercises still build.
    DoesNotParse,
    /// The learner's file still holds its shipped `todo!`: not started.
    NotStarted,
}

impl Body {
    /// Leaning wins whatever the file holds: edits there stay, unused. A file
    /// that does not parse cannot be compiled, stub or not.
    pub fn of(leaned: bool, parses: bool, holds_stub: bool) -> Self {
        match (leaned, parses, holds_stub) {
            (true, _, _) => Body::Leaned,
            (false, false, _) => Body::DoesNotParse,
            (false, true, true) => Body::NotStarted,
            (false, true, false) => Body::Yours,
        }
    }

    /// Whether the build compiles the reference body from `solutions/` in
    /// place of the learner's file.
    pub fn compiles_reference(self) -> bool {
        matches!(self, Body::Leaned | Body::DoesNotParse)
    }
}
