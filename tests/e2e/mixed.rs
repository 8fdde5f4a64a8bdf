//! End-to-end tests: mixed.
