//! The `cachalot` command line.

fn main() {}
