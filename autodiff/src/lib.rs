//! # kiln-autodiff
//!
//! Owns differentiation: [`rules::vjp`], one vector-Jacobian rule per primitive op of
//! the op table, written over `kiln_tensor::Builder` so the `#[model]` macro runs them
//! symbolically at build time and [`Tape`] runs them on the dynamic path.
//!
//! ```
//! use kiln_autodiff::Tape;
//! use kiln_tensor::{BuilderExt, RawTensor};
//! # fn demo<B: kiln_tensor::Backend>(dev: B::Device) -> kiln_tensor::Result<()> {
//! let mut tape = Tape::<B>::new(dev.clone());
//! let x = tape.leaf(RawTensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3], &dev)?);
//! let y = tape.square(&x)?;
//! let loss = tape.sum_all(&y)?;
//! let grads = tape.gradients(&loss)?;
//! assert_eq!(grads.get(&x).unwrap().to_vec::<f32>()?, vec![2.0, 4.0, 6.0]);
//! # Ok(()) }
//! ```

pub mod gradcheck;
pub mod rules;
pub mod tape;

pub use gradcheck::{gradcheck, Tolerance};
pub use rules::{unbroadcast, vjp, InputGrads};
pub use tape::{Gradients, Tape, Var};
