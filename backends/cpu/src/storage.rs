//! `CpuStorage`: one `Vec` per dtype, and the element traits the kernels are generic
//! over (how each dtype loads into and stores from its compute type).

use half::{bf16, f16};
use kiln_tensor::{DType, Element, HostData};

/// A CPU buffer: a vector of one dtype.
#[derive(Clone, Debug, PartialEq)]
pub enum CpuStorage {
    /// f32 values.
    F32(Vec<f32>),
    /// f64 values.
    F64(Vec<f64>),
    /// f16 values.
    F16(Vec<f16>),
    /// bf16 values.
    BF16(Vec<bf16>),
    /// i32 values.
    I32(Vec<i32>),
    /// u32 values.
    U32(Vec<u32>),
    /// bool values.
    Bool(Vec<bool>),
}

impl CpuStorage {
    /// The dtype.
    pub fn dtype(&self) -> DType {
        match self {
            CpuStorage::F32(_) => DType::F32,
            CpuStorage::F64(_) => DType::F64,
            CpuStorage::F16(_) => DType::F16,
            CpuStorage::BF16(_) => DType::BF16,
            CpuStorage::I32(_) => DType::I32,
            CpuStorage::U32(_) => DType::U32,
            CpuStorage::Bool(_) => DType::Bool,
        }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        match self {
            CpuStorage::F32(v) => v.len(),
            CpuStorage::F64(v) => v.len(),
            CpuStorage::F16(v) => v.len(),
            CpuStorage::BF16(v) => v.len(),
            CpuStorage::I32(v) => v.len(),
            CpuStorage::U32(v) => v.len(),
            CpuStorage::Bool(v) => v.len(),
        }
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Moves host data into a buffer.
    pub fn from_host(h: HostData) -> Self {
        match h {
            HostData::F32(v) => CpuStorage::F32(v),
            HostData::F64(v) => CpuStorage::F64(v),
            HostData::F16(v) => CpuStorage::F16(v),
            HostData::BF16(v) => CpuStorage::BF16(v),
            HostData::I32(v) => CpuStorage::I32(v),
            HostData::U32(v) => CpuStorage::U32(v),
            HostData::Bool(v) => CpuStorage::Bool(v),
        }
    }

    /// Moves a buffer out as host data.
    pub fn into_host(self) -> HostData {
        match self {
            CpuStorage::F32(v) => HostData::F32(v),
            CpuStorage::F64(v) => HostData::F64(v),
            CpuStorage::F16(v) => HostData::F16(v),
            CpuStorage::BF16(v) => HostData::BF16(v),
            CpuStorage::I32(v) => HostData::I32(v),
            CpuStorage::U32(v) => HostData::U32(v),
            CpuStorage::Bool(v) => HostData::Bool(v),
        }
    }
}

/// Runs `$body` with `$v` bound to the vector in a `CpuStorage` and `$T` to its type.
macro_rules! with_storage {
    ($s:expr, $v:ident, $T:ident => $body:expr) => {
        match $s {
            $crate::storage::CpuStorage::F32($v) => {
                type $T = f32;
                $body
            }
            $crate::storage::CpuStorage::F64($v) => {
                type $T = f64;
                $body
            }
            $crate::storage::CpuStorage::F16($v) => {
                type $T = half::f16;
                $body
            }
            $crate::storage::CpuStorage::BF16($v) => {
                type $T = half::bf16;
                $body
            }
            $crate::storage::CpuStorage::I32($v) => {
                type $T = i32;
                $body
            }
            $crate::storage::CpuStorage::U32($v) => {
                type $T = u32;
                $body
            }
            $crate::storage::CpuStorage::Bool($v) => {
                type $T = bool;
                $body
            }
        }
    };
}
pub(crate) use with_storage;

/// Like `with_storage!` for the float dtypes; `$other` runs for the rest.
macro_rules! with_float_storage {
    ($s:expr, $v:ident, $T:ident => $body:expr, $other:expr) => {
        match $s {
            $crate::storage::CpuStorage::F32($v) => {
                type $T = f32;
                $body
            }
            $crate::storage::CpuStorage::F64($v) => {
                type $T = f64;
                $body
            }
            $crate::storage::CpuStorage::F16($v) => {
                type $T = half::f16;
                $body
            }
            $crate::storage::CpuStorage::BF16($v) => {
                type $T = half::bf16;
                $body
            }
            _ => $other,
        }
    };
}
pub(crate) use with_float_storage;

/// An element a CPU kernel can hold: wraps a `Vec` of itself as storage.
pub trait CpuElement: Element {
    /// Wraps a vector as storage.
    fn wrap(v: Vec<Self>) -> CpuStorage;
}

macro_rules! cpu_element {
    ($($t:ty => $v:ident),*) => {$(
        impl CpuElement for $t {
            fn wrap(v: Vec<Self>) -> CpuStorage {
                CpuStorage::$v(v)
            }
        }
    )*};
}
cpu_element!(f32 => F32, f64 => F64, f16 => F16, bf16 => BF16, i32 => I32, u32 => U32, bool => Bool);

/// A float dtype and the type it computes in (f32 for the 16-bit floats).
pub trait FloatKernel: CpuElement {
    /// The compute type.
    type C: crate::math::Real;
    /// Widens to the compute type.
    fn load(self) -> Self::C;
    /// Narrows from the compute type (round to nearest).
    fn store(c: Self::C) -> Self;
}

impl FloatKernel for f32 {
    type C = f32;
    #[inline(always)]
    fn load(self) -> f32 {
        self
    }
    #[inline(always)]
    fn store(c: f32) -> Self {
        c
    }
}

impl FloatKernel for f64 {
    type C = f64;
    #[inline(always)]
    fn load(self) -> f64 {
        self
    }
    #[inline(always)]
    fn store(c: f64) -> Self {
        c
    }
}

impl FloatKernel for f16 {
    type C = f32;
    #[inline(always)]
    fn load(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    fn store(c: f32) -> Self {
        f16::from_f32(c)
    }
}

impl FloatKernel for bf16 {
    type C = f32;
    #[inline(always)]
    fn load(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    fn store(c: f32) -> Self {
        bf16::from_f32(c)
    }
}

/// Like `with_storage!` for the dtypes that sum (floats and integers); `$other` runs
/// for bool.
macro_rules! with_sum_storage {
    ($s:expr, $v:ident, $T:ident => $body:expr, $other:expr) => {
        match $s {
            $crate::storage::CpuStorage::I32($v) => {
                type $T = i32;
                $body
            }
            $crate::storage::CpuStorage::U32($v) => {
                type $T = u32;
                $body
            }
            other => $crate::storage::with_float_storage!(other, $v, $T => $body, $other),
        }
    };
}
pub(crate) use with_sum_storage;

/// An element that sums into an accumulator: floats in their compute type (so f16 and
/// bf16 round once, at the end), integers with two's-complement wrapping.
pub trait Accumulate: CpuElement {
    /// The running sum.
    type Acc: Copy + Send + Sync;
    /// The empty sum.
    fn zero() -> Self::Acc;
    /// `acc + x`.
    fn add(acc: Self::Acc, x: Self) -> Self::Acc;
    /// The sum as an element.
    fn finish(acc: Self::Acc) -> Self;
}

macro_rules! accumulate_float {
    ($($t:ty),*) => {$(
        impl Accumulate for $t {
            type Acc = <$t as FloatKernel>::C;
            #[inline(always)]
            fn zero() -> Self::Acc {
                num_traits::Zero::zero()
            }
            #[inline(always)]
            fn add(acc: Self::Acc, x: Self) -> Self::Acc {
                acc + x.load()
            }
            #[inline(always)]
            fn finish(acc: Self::Acc) -> Self {
                <$t as FloatKernel>::store(acc)
            }
        }
    )*};
}
accumulate_float!(f32, f64, f16, bf16);

macro_rules! accumulate_int {
    ($($t:ty),*) => {$(
        impl Accumulate for $t {
            type Acc = $t;
            #[inline(always)]
            fn zero() -> $t {
                0
            }
            #[inline(always)]
            fn add(acc: $t, x: $t) -> $t {
                acc.wrapping_add(x)
            }
            #[inline(always)]
            fn finish(acc: $t) -> $t {
                acc
            }
        }
    )*};
}
accumulate_int!(i32, u32);
