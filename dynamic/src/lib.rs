//! # kiln-dynamic
//!
//! Owns Kiln's dynamic path, for models whose shapes or control flow are only known
//! at run time: [`LazyTensor`] records ops instead of running them ([`lazy`]); a read
//! or [`eval`] plans what is pending with the planner `#[model]` uses at build time and
//! runs it as a `kiln_fusion::Program`, cached by the graph's structure with its sizes
//! symbolic ([`jit`]); [`LazyTensor::backward`] records the gradient graph from the
//! same rules, planned and fused with the forward pass ([`grad`]); [`Param`], [`Layer`]
//! and [`DynamicModule`] make modules that optimizers and checkpoints accept
//! ([`module`]); a `#[model]` holds one in a `#[dynamic]` field and its plan calls
//! out to it ([`parts`]). Where the backend captures (CUDA), a cached program seen
//! again at the same sizes is captured as a graph and replayed ([`replay`]).
//!
//! ```
//! use kiln_cpu::{Cpu, CpuDevice};
//! use kiln_dynamic::{LazyTensor, Param};
//! use kiln_tensor::RawTensor;
//! let dev = CpuDevice;
//! let w = Param::new(RawTensor::<Cpu>::from_vec(vec![1.0f32, 2.0, 3.0], &[3], &dev)?);
//! let x = LazyTensor::from_vec(vec![0.5f32, 0.5, 0.5], &[3], &dev)?;
//! let loss = w.get().mul(&x)?.mul(&x)?.sum_all()?; // recorded, not run
//! let grads = loss.backward()?;                      // one planned program
//! assert_eq!(loss.scalar_value()?, 1.5);
//! assert_eq!(w.grad(&grads)?.to_vec::<f32>()?, vec![0.25, 0.25, 0.25]);
//! # Ok::<(), kiln_tensor::Error>(())
//! ```

pub mod grad;
pub mod jit;
pub mod lazy;
pub mod module;
pub mod parts;
pub mod replay;

pub use grad::{value_and_grad, Gradients};
pub use jit::{cache_stats, clear_cache, eval, set_cache_capacity, CacheStats};
pub use lazy::{eager, no_grad, set_eager, Lazy, LazyTensor};
pub use module::{DynamicModule, Layer, ModuleList, Param};
pub use parts::{PartCalls, PartForward};
pub use replay::{replay_enabled, set_replay};
