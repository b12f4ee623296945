//! Where `cargo xtask verify` puts its planted mistakes: copies of reference
//! solutions, each with a mistake written in, under `target/planted/` (the
//! same paths as in the repository), never in the tracked files. The build
//! compiles such a copy in place of the reference for each exercise that
//! `WORKBOOK_PLANTED` lists, so a verify that is killed leaves every tracked
//! file as it was.

/// The exercises whose planted copy the build compiles, as `WORKBOOK_LEAN` lists them.
pub const PLANTED_VARIABLE: &str = "WORKBOOK_PLANTED";
