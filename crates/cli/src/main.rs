//! The `sortie` binary.

fn main() {}
