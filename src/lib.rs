//! # Kiln
//!
//! The face users import. It re-exports the tensor types, the op table, autodiff and
//! fusion, and the backends chosen by features: `cpu` (default), `wgpu`, `cuda`;
//! [`device`] picks one at run time (a binary's `--device`).
//!
//! ```
//! use kiln::prelude::*;
//! let dev = CpuDevice;
//! let a = Tensor::<Cpu, Rank2<2, 3>>::from_slice(&[1., 2., 3., 4., 5., 6.], &dev)?;
//! let b = Tensor::<Cpu, Rank2<3, 1>>::from_slice(&[1., 1., 1.], &dev)?;
//! assert_eq!(a.matmul(&b)?.to_vec()?, vec![6., 15.]);
//! # Ok::<(), kiln::Error>(())
//! ```

pub use kiln_autodiff as autodiff;
pub use kiln_data as data;
pub use kiln_dynamic as dynamic;
pub use kiln_fusion as fusion;
pub use kiln_tensor as tensor;
pub use kiln_tensor::{Error, Result};
pub use kiln_train as train;

#[cfg(feature = "cpu")]
pub use kiln_cpu as cpu;

pub use kiln_cubecl as cubecl;

pub mod device;

pub use kiln_macros::{embed, model, Module};

#[doc(hidden)]
pub mod __private {
    pub use kiln_macros::model_impl;

    /// Met by no model: the bound of the `<name>_and_grad` an instance that does not
    /// train (int8) keeps, so that calling it is a compile error saying so.
    #[diagnostic::on_unimplemented(
        message = "`{Self}` is an instance for inference (int8): it has no training entry such as `loss_and_grad`",
        label = "this instance evaluates only",
        note = "train the f32 model (its `loss_and_grad`, or the Learner) and quantise its checkpoint with kiln-quantize; an int8 instance's losses evaluate, as `loss`"
    )]
    pub trait Trains {}
}

/// Everything a model author needs in scope.
pub mod prelude {
    pub use crate::model;
    pub use kiln_tensor::nn::{Mode, Module};
    pub use kiln_tensor::{
        bf16, f16, Backend, Batch, Builder, BuilderExt, Const, DType, Dim, Dyn, Element, Error,
        FloatElement, Kernel, Padding, Rank0, Rank1, Rank2, Rank3, Rank4, RawTensor, Result, Shape,
        Stride, Tensor,
    };

    #[cfg(feature = "cpu")]
    pub use kiln_cpu::{Cpu, CpuDevice};
    #[cfg(feature = "cuda")]
    pub use kiln_cubecl::{Cuda, CudaDevice};
    #[cfg(feature = "wgpu")]
    pub use kiln_cubecl::{Wgpu, WgpuDevice};
}
