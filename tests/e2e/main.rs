//! End-to-end tests that drive the built `sortie` binary.
