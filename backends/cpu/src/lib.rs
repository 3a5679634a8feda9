//! CPU backend.
