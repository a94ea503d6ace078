//! The command line: every clap definition keyward parses.

pub mod backup;
