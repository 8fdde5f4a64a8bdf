//! End-to-end tests: crash.
