//! Holds the trybuild suites (see `tests/`); no library code.
