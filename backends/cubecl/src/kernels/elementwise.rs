//! Elementwise kernels: unary, binary, comparison, `where` and casts, each over strided
//! inputs (already broadcast to the output's dims by the tensor layer) into a
//! contiguous output. Floats compute in `A` (f32, or f64 for f64 tensors) and round
//! once to the storage type, as the CPU backend does; integers compute in their own
//! type with wrapping arithmetic. Bools are stored as u32 0/1.

use super::common::{linear_pos, strided_offset};
use cubecl::prelude::*;
use kiln_tensor::{BinaryOp, CmpOp, UnaryOp};

/// The error code an integer division by zero leaves in the device's error flag.
pub const FLAG_DIV_ZERO: u32 = 3;

/// Each unary op's formula on the device, in the kernel's compute type `A`, named as
/// its method in the op table. `float_unary` below is generated from the op table's
/// list, so an op without a formula here is a build error, never a silent identity.
pub(crate) mod unary_formulas {
    use super::super::common::nan_bits;
    use cubecl::prelude::*;

    #[cube]
    pub fn neg<A: Float>(v: A) -> A {
        -v
    }

    #[cube]
    pub fn abs<A: Float>(v: A) -> A {
        v.abs()
    }

    /// NaN and ±0 fall through unchanged.
    #[cube]
    pub fn sign<A: Float>(v: A) -> A {
        let mut r = v;
        if v > A::new(0.0) {
            r = A::new(1.0);
        } else if v < A::new(0.0) {
            r = A::new(-1.0);
        }
        r
    }

    #[cube]
    pub fn exp<A: Float>(v: A) -> A {
        v.exp()
    }

    #[cube]
    pub fn log<A: Float>(v: A) -> A {
        v.ln()
    }

    #[cube]
    pub fn sqrt<A: Float>(v: A) -> A {
        v.sqrt()
    }

    /// 1/sqrt rounds twice but stays within an ulp or two; the hardware rsqrt does not.
    #[cube]
    pub fn rsqrt<A: Float>(v: A) -> A {
        A::new(1.0) / v.sqrt()
    }

    #[cube]
    pub fn recip<A: Float>(v: A) -> A {
        A::new(1.0) / v
    }

    #[cube]
    pub fn sin<A: Float>(v: A) -> A {
        v.sin()
    }

    #[cube]
    pub fn cos<A: Float>(v: A) -> A {
        v.cos()
    }

    #[cube]
    pub fn tanh<A: Float>(v: A) -> A {
        v.tanh()
    }

    #[cube]
    pub fn sigmoid<A: Float>(v: A) -> A {
        A::new(1.0) / (A::new(1.0) + (-v).exp())
    }

    /// relu(NaN) stays NaN, as in PyTorch. `v < 0` alone is false for NaN, but NVIDIA's
    /// Vulkan driver folds that select into a max (0 for NaN), with or without a
    /// `v != v` check (WGSL lets drivers assume there are no NaNs; BENCHMARKS.md, issue
    /// 12): the NaN test on the bits is integer arithmetic, which it cannot fold.
    #[cube]
    pub fn relu<A: Float>(v: A) -> A {
        let mut r = v;
        if v < A::new(0.0) && !nan_bits::<A>(v) {
            r = A::new(0.0);
        }
        r
    }

    #[cube]
    pub fn erf<A: Float>(v: A) -> A {
        v.erf()
    }

    /// Bools reach the float path only inside fused expressions, as 0.0 and 1.0.
    #[cube]
    pub fn logical_not<A: Float>(v: A) -> A {
        let mut r = A::new(0.0);
        if v == A::new(0.0) {
            r = A::new(1.0);
        }
        r
    }
}

/// The float unary kernel's dispatch, one comptime branch per op of the op table.
macro_rules! float_unary_dispatch {
    ($($(#[$doc:meta])* $v:ident $method:ident $name:literal [$dtypes:ident, $domain:ident]
        compute($x:ident) $formula:block
        grad($b:ident, $gx:ident, $gy:ident, $gg:ident) $rule:block)*) => {
        /// A unary op (`op` is its `UnaryOp as u32`) on one value of compute type `A`.
        #[cube]
        pub(crate) fn float_unary<A: Float>(v: A, #[comptime] op: u32) -> A {
            let mut r = v;
            $(
                if comptime!(op == UnaryOp::$v as u32) {
                    r = unary_formulas::$method::<A>(v);
                }
            )*
            r
        }
    };
}

kiln_tensor::for_each_unary!(float_unary_dispatch);

/// A unary op on a float tensor of storage type `F`, computed in `A`.
#[cube(launch_unchecked)]
pub fn unary_float<F: Float, A: Float>(
    x: &Array<F>,
    out: &mut Array<F>,
    meta: &Array<u32>,
    #[comptime] op: u32,
    #[comptime] rank: u32,
) {
    let pos = linear_pos();
    if pos < meta[0] {
        let v = A::cast_from(x[strided_offset(meta, pos, rank, 0u32) as usize]);
        out[pos as usize] = F::cast_from(float_unary::<A>(v, op));
    }
}

/// A unary op on an integer (or bool-as-u32) tensor: neg/abs/sign wrap like i32, relu
/// clamps at 0, not flips 0/1.
#[cube(launch_unchecked)]
pub fn unary_int<I: Int>(
    x: &Array<I>,
    out: &mut Array<I>,
    meta: &Array<u32>,
    #[comptime] op: u32,
    #[comptime] rank: u32,
) {
    let pos = linear_pos();
    if pos < meta[0] {
        let v = x[strided_offset(meta, pos, rank, 0u32) as usize];
        let zero = I::from_int(0);
        let mut r = v;
        if comptime!(op == UnaryOp::Neg as u32) {
            r = zero - v;
        } else if comptime!(op == UnaryOp::Abs as u32) {
            if v < zero {
                r = zero - v;
            }
        } else if comptime!(op == UnaryOp::Sign as u32) {
            if v > zero {
                r = I::from_int(1);
            } else if v < zero {
                r = I::from_int(-1);
            }
        } else if comptime!(op == UnaryOp::Relu as u32) {
            if v < zero {
                r = zero;
            }
        } else if comptime!(op == UnaryOp::Not as u32) {
            r = I::cast_from(v == zero);
        }
        out[pos as usize] = r;
    }
}

/// Each binary op's formula on the device, in the kernel's compute type `A`, named as
/// its method in the op table; `float_binary` is generated from the op table's list.
pub(crate) mod binary_formulas {
    use super::super::common::nan;
    use cubecl::prelude::*;

    #[cube]
    pub fn add<A: Float>(a: A, b: A) -> A {
        a + b
    }

    #[cube]
    pub fn sub<A: Float>(a: A, b: A) -> A {
        a - b
    }

    #[cube]
    pub fn mul<A: Float>(a: A, b: A) -> A {
        a * b
    }

    #[cube]
    pub fn div<A: Float>(a: A, b: A) -> A {
        a / b
    }

    #[cube]
    pub fn pow<A: Float>(a: A, b: A) -> A {
        a.powf(b)
    }

    /// NaN propagates (PyTorch's maximum); the hardware max would drop it.
    #[cube]
    pub fn maximum<A: Float>(a: A, b: A) -> A {
        let mut r = a;
        if nan::<A>(b) || (!nan::<A>(a) && b > a) {
            r = b;
        }
        r
    }

    #[cube]
    pub fn minimum<A: Float>(a: A, b: A) -> A {
        let mut r = a;
        if nan::<A>(b) || (!nan::<A>(a) && b < a) {
            r = b;
        }
        r
    }
}

/// The float binary kernel's dispatch, one comptime branch per op of the op table.
macro_rules! float_binary_dispatch {
    ($($(#[$doc:meta])* $v:ident $method:ident $name:literal [$dtypes:ident, $da:ident, $db:ident]
        compute($x:ident, $y:ident) $formula:block
        grad($bd:ident, $ga:ident, $gb:ident, $gy:ident, $gg:ident) $rule:block)*) => {
        /// A binary op (`op` is its `BinaryOp as u32`) on two values of compute type `A`.
        #[cube]
        pub(crate) fn float_binary<A: Float>(a: A, b: A, #[comptime] op: u32) -> A {
            let mut r = a;
            $(
                if comptime!(op == BinaryOp::$v as u32) {
                    r = binary_formulas::$method::<A>(a, b);
                }
            )*
            r
        }
    };
}

kiln_tensor::for_each_binary!(float_binary_dispatch);

/// A binary op on float tensors of storage type `F`, computed in `A`.
#[cube(launch_unchecked)]
pub fn binary_float<F: Float, A: Float>(
    a: &Array<F>,
    b: &Array<F>,
    out: &mut Array<F>,
    meta: &Array<u32>,
    #[comptime] op: u32,
    #[comptime] rank: u32,
) {
    let pos = linear_pos();
    if pos < meta[0] {
        let x = A::cast_from(a[strided_offset(meta, pos, rank, 0u32) as usize]);
        let y = A::cast_from(b[strided_offset(meta, pos, rank, 1u32) as usize]);
        out[pos as usize] = F::cast_from(float_binary::<A>(x, y, op));
    }
}

// Comptime branches (`comptime!(op == …)`) stay apart from the runtime ones inside them.
#[allow(clippy::collapsible_if, clippy::collapsible_else_if)]
/// A binary op on integer tensors: wrapping add/sub/mul, division truncating toward
/// zero (a zero divisor sets `flag` and writes 0), max/min.
#[cube(launch_unchecked)]
pub fn binary_int<I: Int>(
    a: &Array<I>,
    b: &Array<I>,
    out: &mut Array<I>,
    meta: &Array<u32>,
    flag: &mut Array<u32>,
    #[comptime] op: u32,
    #[comptime] rank: u32,
    #[comptime] signed: bool,
) {
    let pos = linear_pos();
    if pos < meta[0] {
        let x = a[strided_offset(meta, pos, rank, 0u32) as usize];
        let y = b[strided_offset(meta, pos, rank, 1u32) as usize];
        let zero = I::from_int(0);
        let mut r = x;
        if comptime!(op == BinaryOp::Add as u32) {
            r = x + y;
        } else if comptime!(op == BinaryOp::Sub as u32) {
            r = x - y;
        } else if comptime!(op == BinaryOp::Mul as u32) {
            r = x * y;
        } else if comptime!(op == BinaryOp::Div as u32) {
            if y == zero {
                flag[0] = FLAG_DIV_ZERO;
                r = zero;
            } else if comptime!(signed) {
                // MIN / -1 overflows in hardware; it wraps to MIN, like -MIN.
                if y == I::from_int(-1) {
                    r = zero - x;
                } else {
                    r = x / y;
                }
            } else {
                r = x / y;
            }
        } else if comptime!(op == BinaryOp::Max as u32) {
            if y > x {
                r = y;
            }
        } else if comptime!(op == BinaryOp::Min as u32) {
            if y < x {
                r = y;
            }
        }
        out[pos as usize] = r;
    }
}

/// Each comparison on the device, named as in the op table; `compare_values` is
/// generated from the op table's list.
pub(crate) mod compare_formulas {
    use cubecl::prelude::*;

    #[cube]
    pub fn eq<T: Numeric>(a: T, b: T) -> bool {
        a == b
    }

    /// Not `a != b`: WGSL compiles that to an ordered comparison, false for NaN.
    #[cube]
    pub fn ne<T: Numeric>(a: T, b: T) -> bool {
        !(a == b)
    }

    #[cube]
    pub fn lt<T: Numeric>(a: T, b: T) -> bool {
        a < b
    }

    #[cube]
    pub fn le<T: Numeric>(a: T, b: T) -> bool {
        a <= b
    }

    #[cube]
    pub fn gt<T: Numeric>(a: T, b: T) -> bool {
        a > b
    }

    #[cube]
    pub fn ge<T: Numeric>(a: T, b: T) -> bool {
        a >= b
    }
}

/// The comparison kernels' dispatch, one comptime branch per comparison of the op table.
macro_rules! compare_dispatch {
    ($($(#[$doc:meta])* $v:ident $method:ident $name:literal compute($x:ident, $y:ident) $formula:block)*) => {
        /// A comparison (`op` is its `CmpOp as u32`) of two values of type `T`.
        #[cube]
        pub(crate) fn compare_values<T: Numeric>(a: T, b: T, #[comptime] op: u32) -> bool {
            let mut r = false;
            $(
                if comptime!(op == CmpOp::$v as u32) {
                    r = compare_formulas::$method::<T>(a, b);
                }
            )*
            r
        }
    };
}

kiln_tensor::for_each_compare!(compare_dispatch);

/// A comparison of two tensors of type `T` (compared in `C`, which is exact), written
/// as u32 0/1.
#[cube(launch_unchecked)]
pub fn compare<T: Numeric, C: Numeric>(
    a: &Array<T>,
    b: &Array<T>,
    out: &mut Array<u32>,
    meta: &Array<u32>,
    #[comptime] op: u32,
    #[comptime] rank: u32,
) {
    let pos = linear_pos();
    if pos < meta[0] {
        let x = C::cast_from(a[strided_offset(meta, pos, rank, 0u32) as usize]);
        let y = C::cast_from(b[strided_offset(meta, pos, rank, 1u32) as usize]);
        out[pos as usize] = u32::cast_from(compare_values::<C>(x, y, op));
    }
}

/// `cond ? a : b`, with the condition stored as u32.
#[cube(launch_unchecked)]
pub fn select<T: CubePrimitive>(
    c: &Array<u32>,
    a: &Array<T>,
    b: &Array<T>,
    out: &mut Array<T>,
    meta: &Array<u32>,
    #[comptime] rank: u32,
) {
    let pos = linear_pos();
    if pos < meta[0] {
        let cond = c[strided_offset(meta, pos, rank, 0u32) as usize];
        if cond != 0 {
            out[pos as usize] = a[strided_offset(meta, pos, rank, 1u32) as usize];
        } else {
            out[pos as usize] = b[strided_offset(meta, pos, rank, 2u32) as usize];
        }
    }
}

/// How a cast converts, chosen on the host from the two dtypes.
pub mod cast_kind {
    /// Same representation class: a plain conversion (float to float rounds to
    /// nearest, integer to integer saturates as decided by the host's kind).
    pub const CONVERT: u32 = 0;
    /// Float to i32: truncate toward zero, saturate, NaN to 0 (Rust's `as`).
    pub const FLOAT_TO_I32: u32 = 1;
    /// Float to u32: truncate toward zero, saturate at 0 and u32::MAX, NaN to 0.
    pub const FLOAT_TO_U32: u32 = 2;
    /// Anything to bool: nonzero (NaN included) is 1.
    pub const TO_BOOL: u32 = 3;
    /// i32 to u32: negatives saturate to 0.
    pub const I32_TO_U32: u32 = 4;
    /// u32 to i32: values above i32::MAX saturate.
    pub const U32_TO_I32: u32 = 5;
}

/// A dtype conversion from `I` to `O`, with Rust's saturating `as` semantics for
/// float-to-integer and the integer ranges (values go through the reference's f64);
/// float-to-integer range checks compare in `C` (f32 for half floats).
#[cube(launch_unchecked)]
pub fn convert<I: Numeric, C: Numeric, O: Numeric>(
    x: &Array<I>,
    out: &mut Array<O>,
    meta: &Array<u32>,
    #[comptime] kind: u32,
    #[comptime] rank: u32,
) {
    let pos = linear_pos();
    if pos < meta[0] {
        let v = x[strided_offset(meta, pos, rank, 0u32) as usize];
        let mut r = O::from_int(0);
        if comptime!(kind == cast_kind::CONVERT) {
            r = O::cast_from(v);
        } else if comptime!(kind == cast_kind::TO_BOOL) {
            // `!(v == 0)`, so that NaN is true (see `compare_values`).
            r = O::cast_from(!(v == I::from_int(0)));
        } else if comptime!(kind == cast_kind::FLOAT_TO_I32) {
            // Compared in `C` (f32 for half floats, whose literal 2^31 would be an
            // infinite constant, which CUDA C++ and WGSL cannot spell).
            let v = C::cast_from(v);
            #[allow(clippy::eq_op)]
            let nan = !(v == v);
            if nan {
                r = O::from_int(0);
            } else if v >= C::from_int(2147483648) {
                r = O::cast_from(i32::MAX);
            } else if v <= C::from_int(-2147483648) {
                r = O::cast_from(i32::MIN);
            } else {
                r = O::cast_from(i32::cast_from(v));
            }
        } else if comptime!(kind == cast_kind::FLOAT_TO_U32) {
            let v = C::cast_from(v);
            #[allow(clippy::eq_op)]
            let nan = !(v == v);
            if nan || v <= C::from_int(0) {
                r = O::from_int(0);
            } else if v >= C::from_int(4294967296) {
                r = O::cast_from(u32::MAX);
            } else {
                r = O::cast_from(u32::cast_from(v));
            }
        } else if comptime!(kind == cast_kind::I32_TO_U32) {
            if v < I::from_int(0) {
                r = O::from_int(0);
            } else {
                r = O::cast_from(v);
            }
        } else if comptime!(kind == cast_kind::U32_TO_I32) {
            let u = u32::cast_from(v);
            if u > 2147483647u32 {
                r = O::cast_from(i32::MAX);
            } else {
                r = O::cast_from(u);
            }
        }
        out[pos as usize] = r;
    }
}

/// Copies a strided view into a strided destination (contiguous copies, concat parts,
/// the interior of a pad): operand 0 describes the source, operand 1 the destination.
#[cube(launch_unchecked)]
pub fn copy<T: CubePrimitive>(
    x: &Array<T>,
    out: &mut Array<T>,
    meta: &Array<u32>,
    #[comptime] rank: u32,
) {
    let pos = linear_pos();
    if pos < meta[0] {
        let src = strided_offset(meta, pos, rank, 0u32);
        let dst = strided_offset(meta, pos, rank, 1u32);
        out[dst as usize] = x[src as usize];
    }
}

/// Fills `n` elements with `value[0]` (the value is converted on the host, exactly as
/// the reference converts it).
#[cube(launch_unchecked)]
pub fn fill<T: CubePrimitive>(value: &Array<T>, out: &mut Array<T>, n: u32) {
    let pos = linear_pos();
    if pos < n {
        out[pos as usize] = value[0];
    }
}
