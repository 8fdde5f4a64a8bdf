//! End-to-end tests: bad_input.
