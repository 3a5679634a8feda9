//! # kiln-tensor
//!
//! Owns Kiln's tensor types and the op table: dims (`Const<N>`, `Dyn`), shapes of rank
//! 0 to 6, dtypes (f32, f64, f16, bf16, i32, u32, bool), [`Op`], the one declaration of
//! every primitive with its shape and dtype rules, the [`Backend`] trait, the untyped
//! [`RawTensor`] with its eager executor, [`Builder`] with the composite ops written
//! once over it, and the typed [`Tensor`].
//!
//! ## What is checked when
//!
//! | mistake | found by |
//! | --- | --- |
//! | two `Const` dims that must be equal differ (matmul inner dims, elementwise operands, labels vs logits batch) | `cargo check`: a `SameDim`/`SameShape`/`MatMulShape` error naming both |
//! | reducing an axis a tensor does not have | `cargo check` (`ReduceAxis`) |
//! | a reshape whose element counts differ, a broadcast of incompatible dims, a conv/pool whose output type is wrong or whose kernel is larger than its input, a static constructor on a `Dyn` shape | `cargo build`/`cargo test` only: these are post-monomorphization const assertions (`checks`), which `cargo check` never evaluates |
//! | anything involving a `Dyn` dim | at run time: an [`Error::Shape`] naming both shapes |
//!
//! Inside `#[model]` the macro checks the arithmetic cases itself, at `cargo check`
//! time, with spanned errors; the table above is for the typed API used directly.

pub mod anomaly;
pub mod attention;
pub mod backend;
pub mod binary;
pub mod builder;
pub mod checks;
pub mod collective;
pub mod compare;
pub mod dim;
pub mod dtype;
pub mod error;
pub mod fused;
pub mod guard;
pub mod ir;
pub mod layout;
pub mod methods;
pub mod nn;
pub mod op;
pub mod precision;
pub mod raw;
pub mod real;
pub mod rng;
pub mod rows;
pub mod shape;
pub mod simd;
pub mod tensor;
#[cfg(feature = "testing")]
pub mod testing;
pub mod unary;

pub use attention::{AttentionDropout, AttentionInput, AttentionSpec};
pub use backend::{Backend, FoldInto, ProductOperand, Replay, View, WindowView};
pub use builder::{Builder, BuilderExt, Conv2dOptions};
pub use collective::Collective;
pub use dim::{Const, Dim, Dyn, SameDim};
pub use dtype::{DType, Element, FloatElement, HostData};
pub use error::{Error, Result};
pub use guard::{Guard, SameShapeOp};
pub use half::{bf16, f16};
pub use layout::Layout;
pub use methods::{Form, Method, MethodArgs};
pub use op::{
    Arity, BinaryOp, CmpOp, Op, OpClass, RandDist, ReduceOp, SymDim, TensorMeta, UnaryOp, Window2d,
};
pub use precision::{Precision, INT8_SCALE_SUFFIX};
pub use raw::{fit_product_operand, fit_views, Eager, RawTensor};
pub use shape::{
    Batch, Dims, LastDim, Rank0, Rank1, Rank2, Rank3, Rank4, ReduceAxis, SameShape, Shape,
};
pub use tensor::{Kernel, MatMulShape, Padding, Stride, Tensor};
