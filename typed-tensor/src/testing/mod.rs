//! The backend conformance suite (feature `testing`). It owns:
//!
//! - [`reference`]: a naive f64 interpreter of every primitive of the op table, the
//!   definition each backend is held to;
//! - [`formulas`]: direct f64 definitions of the composite ops;
//! - [`attention`]: attention's reference, formulas and family;
//! - [`tolerance`]: tolerances per dtype and the element-by-element comparison;
//! - [`strategy`]: proptest strategies for shapes, values and input views;
//! - [`primitives`], [`composites`], [`errors`]: the properties, one generic function
//!   per op family, each `fn(&B::Device, &Config)` running proptest cases;
//! - [`conformance_tests!`](crate::conformance_tests): one `#[test]` per family for a
//!   backend.
//!
//! A backend's integration test instantiates the whole suite in one line:
//!
//! ```text
//! kiln_tensor::conformance_tests!(kiln_cpu::Cpu, kiln_cpu::CpuDevice);
//! ```
//!
//! A backend without some dtypes passes a [`Config`] that leaves them out:
//! `conformance_tests!(MyBackend, device(), Config::all().without(DType::F64))`.
//! The `PROPTEST_CASES` environment variable overrides every property's case count.

pub mod attention;
pub mod composites;
pub mod errors;
pub mod formulas;
pub mod harness;
pub mod primitives;
pub mod reference;
pub mod rows;
pub mod strategy;
pub mod tolerance;

pub use harness::{check_op, run_property, OpCase};
pub use reference::{eval, RefTensor};
pub use strategy::{Domain, Input};
pub use tolerance::{compare, Tol};

use crate::dtype::DType;
use crate::op::UnaryOp;

/// What a backend runs the suite with.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// The dtypes the backend computes with; cases use only these (every backend holds
    /// int8 weights for `matmul_int8` besides).
    pub dtypes: Vec<DType>,
    /// Overrides every property's own case count when set.
    pub cases: Option<u32>,
    /// Tolerances that replace a unary op's own on this backend, where the device's
    /// specification allows a larger error (each justified in DESIGN.md).
    pub unary_tolerances: Vec<(UnaryOp, Tol)>,
}

impl Config {
    /// Every dtype, each property with its own case count and tolerance.
    pub fn all() -> Self {
        Config {
            dtypes: DType::ALL
                .into_iter()
                .filter(|d| !d.is_storage_only())
                .collect(),
            cases: None,
            unary_tolerances: Vec::new(),
        }
    }

    /// What a backend on Vulkan (wgpu) is held to: the dtypes its compute shaders
    /// hold (f32, i32, u32, bool; int8 weights besides), and `sin` and `cos` to the absolute error Vulkan
    /// allows their SPIR-V instructions (2^-11, DESIGN.md): drivers may compute them
    /// with the GPU's fast approximations (NVIDIA's missed the f32 tolerance by a few
    /// ulps at arguments near ±100).
    pub fn vulkan() -> Self {
        let trig = Tol {
            rtol: Tol::for_dtype(DType::F32).rtol,
            atol: 1.0 / 2048.0,
        };
        Config::all()
            .without(DType::F64)
            .without(DType::F16)
            .without(DType::BF16)
            .with_unary_tolerance(UnaryOp::Sin, trig)
            .with_unary_tolerance(UnaryOp::Cos, trig)
    }

    /// The same with `op` held to `tol` instead of its own tolerance.
    pub fn with_unary_tolerance(mut self, op: UnaryOp, tol: Tol) -> Self {
        self.unary_tolerances.retain(|(u, _)| *u != op);
        self.unary_tolerances.push((op, tol));
        self
    }

    /// The tolerance this backend is held to for `op`, where it replaces the op's own.
    pub fn unary_tolerance(&self, op: UnaryOp) -> Option<Tol> {
        self.unary_tolerances
            .iter()
            .find(|(u, _)| *u == op)
            .map(|(_, t)| *t)
    }

    /// The same without `dtype`.
    pub fn without(mut self, dtype: DType) -> Self {
        self.dtypes.retain(|d| *d != dtype);
        self
    }

    /// The case count of a property whose own default is `default`.
    pub fn cases(&self, default: u32) -> u32 {
        self.cases.unwrap_or(default)
    }

    /// The float dtypes among `dtypes`.
    pub fn floats(&self) -> Vec<DType> {
        self.dtypes
            .iter()
            .copied()
            .filter(|d| d.is_float())
            .collect()
    }
}

impl Default for Config {
    fn default() -> Self {
        Config::all()
    }
}

/// The conformance suite's families, the one list of them: passes
/// `module: name, ..;` for each module of `kiln_tensor::testing` to `$callback`, after
/// `$args` and a `;`.
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_families {
    (($($callback:tt)*) $($args:tt)*) => {
        $($callback)*! { $($args)*;
            primitives: unary, binary, compare, select_where, reduce, views, concat, pad,
                matmul, matmul_int8, gather, scatter_add, cast, unfold2d, fold2d, full, iota, rand,
                rand_device_seed;
            composites: softmax, norms, activations, cross_entropy, mse, linear, conv2d,
                pool2d, embedding, dropout;
            attention: attention;
            errors: bad_shapes;
        }
    };
}

/// Every family of the conformance suite for backend `$backend`, as `(name, property)`
/// pairs: what a program runs in a loop (`conformance_tests!` makes them tests).
#[macro_export]
macro_rules! conformance_families {
    ($backend:ty $(,)?) => {
        $crate::__conformance_families!(($crate::conformance_families) @list $backend)
    };
    (@list $backend:ty; $($module:ident: $($name:ident),*;)*) => {
        ::std::vec![$($(
            (
                ::core::stringify!($name),
                $crate::testing::$module::$name::<$backend>
                    as fn(&<$backend as $crate::Backend>::Device, &$crate::testing::Config),
            ),
        )*)*]
    };
}

/// Expands to one `#[test]` per op family of the conformance suite, for backend `$B`
/// on device `$device` (an expression, evaluated in each test), optionally with a
/// [`Config`](crate::testing::Config).
#[macro_export]
macro_rules! conformance_tests {
    ($backend:ty, $device:expr $(,)?) => {
        $crate::conformance_tests!($backend, $device, $crate::testing::Config::all());
    };
    ($backend:ty, $device:expr, $config:expr $(,)?) => {
        $crate::__conformance_families!(($crate::conformance_tests) @each $backend, $device, $config);
    };
    (@each $backend:ty, $device:expr, $config:expr; $($module:ident: $($name:ident),*;)*) => {
        $($(
            #[test]
            fn $name() {
                $crate::testing::$module::$name::<$backend>(&$device, &$config);
            }
        )*)*
    };
}

/// A `dims` tensor of f32 values in [-1, 1) from a 64-bit linear congruential
/// generator seeded with `seed`: cheap, reproducible inputs for kernel tests and
/// benchmarks that compare two paths over the same values.
pub fn lcg_tensor<B: crate::Backend>(
    dims: &[usize],
    seed: u64,
    device: &B::Device,
) -> crate::Result<crate::RawTensor<B>> {
    let n: usize = dims.iter().product();
    let step = |s: u64| {
        s.wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407)
    };
    let mut s = step(seed);
    let values = (0..n)
        .map(|_| {
            s = step(s);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect();
    crate::RawTensor::from_vec(values, dims, device)
}
