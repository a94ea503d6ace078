//! The command line: every clap definition keyward parses.

pub(crate) mod backup;
