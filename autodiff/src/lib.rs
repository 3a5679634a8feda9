//! # kiln-autodiff
//!
//! Owns the vector-Jacobian rules of the op table's primitives (one rule each) and the
//! runtime tape that applies them on the dynamic path.
