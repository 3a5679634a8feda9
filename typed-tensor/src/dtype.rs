//! Element types: the run-time `DType` tag, the `Element` trait that ties Rust types to
//! it, and `HostData`, the typed host buffer that crosses the host/device boundary.

use half::{bf16, f16};
use std::fmt;

/// The run-time tag of a tensor's element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// 32-bit IEEE float.
    F32,
    /// 64-bit IEEE float (CPU; used by gradient checks).
    F64,
    /// 16-bit IEEE float.
    F16,
    /// bfloat16.
    BF16,
    /// 32-bit signed integer (labels, indices).
    I32,
    /// 32-bit unsigned integer (labels, indices).
    U32,
    /// Boolean (comparison results, masks).
    Bool,
    /// 8-bit signed integer: quantised weights. A storage dtype: views, copies, gathers,
    /// casts to floats and [`crate::Op::MatMulInt8`] take it, no arithmetic op does.
    I8,
}

impl DType {
    /// Every dtype, in declaration order.
    pub const ALL: [DType; 8] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::U32,
        DType::Bool,
        DType::I8,
    ];

    /// Bytes per element as stored.
    pub const fn size_in_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F64 => 8,
            DType::F16 | DType::BF16 => 2,
            DType::Bool | DType::I8 => 1,
        }
    }

    /// Whether this dtype is only stored, never computed with: ops other than views,
    /// copies, casts to a float and the int8 product refuse it ([`DType::I8`]).
    pub const fn is_storage_only(self) -> bool {
        matches!(self, DType::I8)
    }

    /// Whether this is a 16-bit float (bf16 or f16): the dtypes of mixed precision,
    /// which fused kernels read and write only at their edges.
    pub const fn is_half(self) -> bool {
        matches!(self, DType::BF16 | DType::F16)
    }

    /// Whether this is a floating-point dtype.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }

    /// The largest finite value of a float dtype (`None` for the others).
    pub const fn finite_max(self) -> Option<f64> {
        match self {
            DType::F32 => Some(f32::MAX as f64),
            DType::F64 => Some(f64::MAX),
            DType::F16 => Some(65504.0),
            DType::BF16 => Some(3.389_531_389_251_535_5e38),
            _ => None,
        }
    }

    /// Whether this is an integer dtype.
    pub const fn is_int(self) -> bool {
        matches!(self, DType::I32 | DType::U32)
    }

    /// The lower-case name used in messages and checkpoints (`f32`, `bf16`...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::U32 => "u32",
            DType::Bool => "bool",
            DType::I8 => "i8",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust type that can be a tensor element.
pub trait Element: Copy + Default + PartialEq + fmt::Debug + Send + Sync + 'static {
    /// The matching run-time tag.
    const DTYPE: DType;
    /// Converts to f64 (exact for every supported type).
    fn to_f64(self) -> f64;
    /// Converts from f64, rounding (floats) or truncating toward zero (integers).
    fn from_f64(v: f64) -> Self;
    /// Wraps a vector of this type as `HostData`.
    fn into_host(v: Vec<Self>) -> HostData;
    /// Unwraps `HostData` of this type (None for another dtype).
    fn from_host(h: HostData) -> Option<Vec<Self>>;
}

/// Floating-point elements: the dtypes that carry gradients.
pub trait FloatElement: Element {}

macro_rules! element {
    ($t:ty, $dt:ident, $to:expr, $from:expr) => {
        impl Element for $t {
            const DTYPE: DType = DType::$dt;
            #[inline]
            fn to_f64(self) -> f64 {
                let to: fn($t) -> f64 = $to;
                to(self)
            }
            #[inline]
            fn from_f64(v: f64) -> Self {
                let from: fn(f64) -> $t = $from;
                from(v)
            }
            fn into_host(v: Vec<Self>) -> HostData {
                HostData::$dt(v)
            }
            fn from_host(h: HostData) -> Option<Vec<Self>> {
                match h {
                    HostData::$dt(v) => Some(v),
                    _ => None,
                }
            }
        }
    };
}

element!(f32, F32, |x| x as f64, |v| v as f32);
element!(f64, F64, |x| x, |v| v);
element!(f16, F16, |x| x.to_f64(), f16_from_f64);
element!(bf16, BF16, |x| x.to_f64(), bf16_from_f64);
element!(i32, I32, |x| x as f64, |v| v as i32);
element!(u32, U32, |x| x as f64, |v| v as u32);
element!(i8, I8, |x| x as f64, |v| v as i8);
element!(bool, Bool, |x| if x { 1.0 } else { 0.0 }, |v| v != 0.0);

/// f64 to f16, rounded to nearest (ties to even). `half`'s own `from_f64` misrounds
/// inputs just above a rounding tie (half-rs issue #151), and a plain `v as f32` first
/// would round twice; rounding to odd first and then to f16 rounds correctly.
fn f16_from_f64(v: f64) -> f16 {
    f16::from_f32(f32_round_to_odd(v))
}

/// f64 to bf16, rounded to nearest (ties to even), for the same reasons as f16.
fn bf16_from_f64(v: f64) -> bf16 {
    bf16::from_f32(f32_round_to_odd(v))
}

/// `v` as f32, rounded to odd: exact values are kept and inexact ones take the
/// neighbour whose last bit is 1, so a second rounding to a format at least two bits
/// narrower (f16, bf16) gives the correctly rounded result of `v` itself.
fn f32_round_to_odd(v: f64) -> f32 {
    let f = v as f32;
    if !f.is_finite() || f as f64 == v || f.to_bits() & 1 == 1 {
        return f;
    }
    let (sign, mag) = (f.to_bits() & 0x8000_0000, f.to_bits() & 0x7fff_ffff);
    let toward_v = if f.abs() as f64 > v.abs() {
        mag - 1
    } else {
        mag + 1
    };
    f32::from_bits(sign | toward_v)
}

impl FloatElement for f32 {}
impl FloatElement for f64 {}
impl FloatElement for f16 {}
impl FloatElement for bf16 {}

/// A contiguous host buffer of one dtype: what `Backend::upload` takes and
/// `Backend::download` returns.
#[derive(Clone, Debug, PartialEq)]
pub enum HostData {
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
    /// i8 values (quantised weights).
    I8(Vec<i8>),
}

/// Runs `$body` with `$v` bound to the vector inside a `HostData`, whatever its dtype.
#[macro_export]
macro_rules! with_host_data {
    ($h:expr, $v:ident => $body:expr) => {
        match $h {
            $crate::HostData::F32($v) => $body,
            $crate::HostData::F64($v) => $body,
            $crate::HostData::F16($v) => $body,
            $crate::HostData::BF16($v) => $body,
            $crate::HostData::I32($v) => $body,
            $crate::HostData::U32($v) => $body,
            $crate::HostData::Bool($v) => $body,
            $crate::HostData::I8($v) => $body,
        }
    };
}

impl HostData {
    /// The dtype of the values.
    pub fn dtype(&self) -> DType {
        match self {
            HostData::F32(_) => DType::F32,
            HostData::F64(_) => DType::F64,
            HostData::F16(_) => DType::F16,
            HostData::BF16(_) => DType::BF16,
            HostData::I32(_) => DType::I32,
            HostData::U32(_) => DType::U32,
            HostData::Bool(_) => DType::Bool,
            HostData::I8(_) => DType::I8,
        }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        with_host_data!(self, v => v.len())
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every value converted to f64 (for tests and printing).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        with_host_data!(self, v => v.iter().map(|x| x.to_f64()).collect())
    }

    /// Builds host data of `dtype` from f64 values (rounding as `Element::from_f64`).
    pub fn from_f64_slice(dtype: DType, values: &[f64]) -> HostData {
        fn conv<T: Element>(values: &[f64]) -> HostData {
            T::into_host(values.iter().map(|&v| T::from_f64(v)).collect())
        }
        match dtype {
            DType::F32 => conv::<f32>(values),
            DType::F64 => conv::<f64>(values),
            DType::F16 => conv::<f16>(values),
            DType::BF16 => conv::<bf16>(values),
            DType::I32 => conv::<i32>(values),
            DType::U32 => conv::<u32>(values),
            DType::Bool => conv::<bool>(values),
            DType::I8 => conv::<i8>(values),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_precision_rounds_f64_correctly() {
        // Just above the tie between 1 and 1 + 2^-10: up, not down (half-rs #151).
        let above = 1.0 + 2f64.powi(-11) + 2f64.powi(-22);
        assert_eq!(<f16 as Element>::from_f64(above).to_bits(), 0x3c01);
        // An exact tie goes to the even neighbour.
        assert_eq!(
            <f16 as Element>::from_f64(1.0 + 2f64.powi(-11)).to_bits(),
            0x3c00
        );
        // An f32 just above a bf16 tie, as a cast from f32 through f64 sees it.
        let x = f32::from_bits(0x3dce_8001);
        assert_eq!(<bf16 as Element>::from_f64(x as f64), bf16::from_f32(x));
        // 2^24 + 2^16 + 1 rounds up; through a plain `as f32` it would tie down.
        assert_eq!(<bf16 as Element>::from_f64(16_842_753.0).to_bits(), 0x4b81);
        // Out of range, tiny and NaN inputs.
        assert!(<f16 as Element>::from_f64(1e6).is_infinite());
        assert_eq!(<f16 as Element>::from_f64(1e-300).to_f64(), 0.0);
        assert!(<bf16 as Element>::from_f64(f64::NAN).is_nan());
    }
}
