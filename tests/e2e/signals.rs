//! End-to-end tests: signals.
