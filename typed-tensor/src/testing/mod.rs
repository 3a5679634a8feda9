//! The backend conformance suite (feature `testing`). It owns:
//!
//! - [`reference`]: a naive f64 interpreter of every primitive of the op table, the
//!   definition each backend is held to;
//! - [`formulas`]: direct f64 definitions of the composite ops;
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

pub mod composites;
pub mod errors;
pub mod formulas;
pub mod harness;
pub mod primitives;
pub mod reference;
pub mod strategy;
pub mod tolerance;

pub use harness::{check_op, run_property, OpCase};
pub use reference::{eval, RefTensor};
pub use strategy::{Domain, Input};
pub use tolerance::{compare, Tol};

use crate::dtype::DType;

/// What a backend runs the suite with.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// The dtypes the backend implements; cases use only these.
    pub dtypes: Vec<DType>,
    /// Overrides every property's own case count when set.
    pub cases: Option<u32>,
}

impl Config {
    /// Every dtype, each property with its own case count.
    pub fn all() -> Self {
        Config {
            dtypes: DType::ALL.to_vec(),
            cases: None,
        }
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

/// Expands to one `#[test]` per op family of the conformance suite, for backend `$B`
/// on device `$device` (an expression, evaluated in each test), optionally with a
/// [`Config`](crate::testing::Config).
#[macro_export]
macro_rules! conformance_tests {
    ($backend:ty, $device:expr $(,)?) => {
        $crate::conformance_tests!($backend, $device, $crate::testing::Config::all());
    };
    ($backend:ty, $device:expr, $config:expr $(,)?) => {
        $crate::conformance_tests!(@each $backend, $device, $config;
            primitives: unary, binary, compare, select_where, reduce, views, concat, pad,
                matmul, gather, scatter_add, cast, unfold2d, fold2d, full, iota, rand,
                rand_device_seed;
            composites: softmax, norms, activations, cross_entropy, mse, linear, conv2d,
                pool2d, embedding, dropout;
            errors: bad_shapes;
        );
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
