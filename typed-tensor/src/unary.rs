//! The elementwise unary primitives, each declared once in [`for_each_unary!`](crate::for_each_unary!): its
//! variant and method names, the dtypes it accepts, its formula (one expression over
//! any compute type [`Real`]: in f64 it is the reference every backend is tested
//! against, in f32 and f64 it is what the CPU kernels and the fused loops run), its
//! gradient rule, and the input domain the conformance suite draws from. The enum, the
//! `RawTensor` and `Tensor` methods, the CPU and fused dispatch and the GPU kernel's
//! dispatch are generated from the list, so a new op is one entry here plus its GPU
//! formula in kiln-cubecl, whose build fails without it.

use crate::builder::{Builder, BuilderExt};
use crate::dtype::DType;
use crate::error::Result;
use crate::op::CmpOp;
use crate::real::Real;

/// Calls `$callback!` with every unary op's declaration, in order. Each entry reads
/// `Variant method "name" [Dtypes, Domain] compute(x) { formula } grad(b, x, y, g)
/// { rule }`: `Dtypes` is `Float`, `Signed` (floats and i32), `Numeric` (floats and
/// integers) or `Bool`; `Domain` is a [`TestDomain`]; the formula computes in `R: Real`;
/// the rule returns the input's gradient (`None` for none) from the input `x`, the
/// output `y` and the output's gradient `g`, with primitives over a `Builder` `b`.
#[macro_export]
macro_rules! for_each_unary {
    ($callback:path) => {
        $callback! {
            /// -x
            Neg neg "neg" [Signed, WithNan]
                compute(x) { -x }
                grad(b, x, y, g) { Ok(Some(b.unary(UnaryOp::Neg, g)?)) }
            /// |x|
            Abs abs "abs" [Signed, WithNan]
                compute(x) { x.abs() }
                grad(b, x, y, g) {
                    let s = b.unary(UnaryOp::Sign, x)?;
                    Ok(Some(b.mul(g, &s)?))
                }
            /// -1, 0 or 1; NaN stays NaN (as in NumPy; PyTorch returns 0)
            Sign sign "sign" [Signed, WithNan]
                compute(x) {
                    if x > R::zero() {
                        R::one()
                    } else if x < R::zero() {
                        -R::one()
                    } else {
                        x * R::zero()
                    }
                }
                grad(b, x, y, g) { Ok(None) }
            /// e^x
            Exp exp "exp" [Float, Any]
                compute(x) { x.exp_() }
                grad(b, x, y, g) { Ok(Some(b.mul(g, y)?)) }
            /// ln x
            Log log "log" [Float, Positive]
                compute(x) { x.ln() }
                grad(b, x, y, g) { Ok(Some(b.div(g, x)?)) }
            /// √x
            Sqrt sqrt "sqrt" [Float, Positive]
                compute(x) { x.sqrt() }
                grad(b, x, y, g) {
                    let h = b.div(g, y)?;
                    Ok(Some(b.mul_scalar(&h, 0.5)?))
                }
            /// 1/√x
            Rsqrt rsqrt "rsqrt" [Float, Positive]
                compute(x) { R::one() / x.sqrt() }
                grad(b, x, y, g) {
                    // d/dx x^-1/2 = -y³/2
                    let y3 = b.mul(y, y)?;
                    let y3 = b.mul(&y3, y)?;
                    let t = b.mul(g, &y3)?;
                    Ok(Some(b.mul_scalar(&t, -0.5)?))
                }
            /// 1/x
            Recip recip "recip" [Float, NonZero]
                compute(x) { R::one() / x }
                grad(b, x, y, g) {
                    let y2 = b.mul(y, y)?;
                    let t = b.mul(g, &y2)?;
                    Ok(Some(b.unary(UnaryOp::Neg, &t)?))
                }
            /// sin x
            Sin sin "sin" [Float, Any]
                compute(x) { x.sin() }
                grad(b, x, y, g) {
                    let c = b.unary(UnaryOp::Cos, x)?;
                    Ok(Some(b.mul(g, &c)?))
                }
            /// cos x
            Cos cos "cos" [Float, Any]
                compute(x) { x.cos() }
                grad(b, x, y, g) {
                    let s = b.unary(UnaryOp::Sin, x)?;
                    let t = b.mul(g, &s)?;
                    Ok(Some(b.unary(UnaryOp::Neg, &t)?))
                }
            /// tanh x
            Tanh tanh "tanh" [Float, Any]
                compute(x) { x.tanh() }
                grad(b, x, y, g) {
                    // 1 - y²
                    let y2 = b.mul(y, y)?;
                    let d = b.mul_scalar(&y2, -1.0)?;
                    let d = b.add_scalar(&d, 1.0)?;
                    Ok(Some(b.mul(g, &d)?))
                }
            /// 1/(1+e^-x)
            Sigmoid sigmoid "sigmoid" [Float, Any]
                compute(x) { x.sigmoid() }
                grad(b, x, y, g) {
                    // y(1 - y)
                    let my = b.mul_scalar(y, -1.0)?;
                    let d = b.add_scalar(&my, 1.0)?;
                    let d = b.mul(y, &d)?;
                    Ok(Some(b.mul(g, &d)?))
                }
            /// max(x, 0); NaN stays NaN, as in PyTorch
            Relu relu "relu" [Numeric, WithNan]
                compute(x) { if x > R::zero() || x.is_nan() { x } else { R::zero() } }
                grad(b, x, y, g) {
                    // Zero where x <= 0 (PyTorch's threshold_backward): a NaN passes
                    // its gradient on.
                    let zero = b.scalar_like(x, 0.0)?;
                    let off = b.compare(CmpOp::Le, x, &zero)?;
                    Ok(Some(b.select(&off, &zero, g)?))
                }
            /// the error function
            Erf erf "erf" [Float, Any]
                compute(x) { x.erf() }
                grad(b, x, y, g) {
                    // 2/√π · e^(-x²)
                    let x2 = b.mul(x, x)?;
                    let nx2 = b.mul_scalar(&x2, -1.0)?;
                    let e = b.unary(UnaryOp::Exp, &nx2)?;
                    let d = b.mul_scalar(&e, std::f64::consts::FRAC_2_SQRT_PI)?;
                    Ok(Some(b.mul(g, &d)?))
                }
            /// logical not (bool)
            Not logical_not "not" [Bool, Any]
                compute(x) { if x == R::zero() { R::one() } else { R::zero() } }
                grad(b, x, y, g) { Ok(None) }
        }
    };
}

/// Which dtypes an op accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtypes {
    /// f32, f64, f16, bf16.
    Float,
    /// The floats and i32.
    Signed,
    /// The floats and the integers.
    Numeric,
    /// Every dtype but bool.
    NotBool,
    /// bool only.
    Bool,
}

impl Dtypes {
    /// Whether `dtype` is accepted.
    pub fn accepts(self, dtype: DType) -> bool {
        match self {
            Dtypes::Float => dtype.is_float(),
            Dtypes::Signed => dtype.is_float() || dtype == DType::I32,
            Dtypes::Numeric => dtype.is_float() || dtype.is_int(),
            Dtypes::NotBool => dtype != DType::Bool,
            Dtypes::Bool => dtype == DType::Bool,
        }
    }
}

/// The inputs an op's conformance tests draw (where its formula is defined).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TestDomain {
    /// Any finite value.
    Any,
    /// Positive values.
    Positive,
    /// Values away from zero.
    NonZero,
    /// Finite values and NaNs (the op's NaN behaviour is specified).
    WithNan,
    /// Small integers (exponents).
    Small,
}

/// A loop over elements that `UnaryOp::dispatch` instantiates once per op, with the
/// op's formula as `f`, so that the match on the op stays outside the loop.
pub trait UnaryKernel<R: Real> {
    /// What the loop returns.
    type Output;
    /// Runs the loop with the formula `f`.
    fn run(self, f: impl Fn(R) -> R + Copy + Send + Sync) -> Self::Output;
}

macro_rules! define_unary {
    ($($(#[$doc:meta])* $v:ident $method:ident $name:literal [$dtypes:ident, $domain:ident]
        compute($x:ident) $formula:block
        grad($b:ident, $gx:ident, $gy:ident, $gg:ident) $rule:block)*) => {
        /// Elementwise ops of one input (declared in [`for_each_unary!`](crate::for_each_unary!)).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum UnaryOp {
            $($(#[$doc])* $v,)*
        }

        impl UnaryOp {
            /// Every variant, in declaration order.
            pub const ALL: &'static [UnaryOp] = &[$(UnaryOp::$v),*];

            /// The op's name in messages and plans.
            pub const fn name(self) -> &'static str {
                match self {
                    $(UnaryOp::$v => $name,)*
                }
            }

            /// The name of its `RawTensor`/`Tensor` method (`logical_not` for `not`).
            pub const fn method(self) -> &'static str {
                match self {
                    $(UnaryOp::$v => stringify!($method),)*
                }
            }

            /// The dtypes it accepts.
            pub const fn dtypes(self) -> Dtypes {
                match self {
                    $(UnaryOp::$v => Dtypes::$dtypes,)*
                }
            }

            /// The dtype rule: which input dtypes the op accepts.
            pub fn accepts(self, dtype: DType) -> bool {
                self.dtypes().accepts(dtype)
            }

            /// The domain its conformance tests draw inputs from.
            pub const fn test_domain(self) -> TestDomain {
                match self {
                    $(UnaryOp::$v => TestDomain::$domain,)*
                }
            }

            /// The formula in the compute type `R` (integers and bools are computed
            /// in f64 by the reference: their values are exact there).
            #[inline(always)]
            pub fn compute<R: Real>(self, x: R) -> R {
                match self {
                    $(UnaryOp::$v => {
                        let $x = x;
                        $formula
                    })*
                }
            }

            /// The reference definition in f64: what every kernel must agree with.
            pub fn eval(self, x: f64) -> f64 {
                self.compute(x)
            }

            /// Runs `kernel` with this op's formula, monomorphised per op.
            #[inline(always)]
            pub fn dispatch<R: Real, K: UnaryKernel<R>>(self, kernel: K) -> K::Output {
                match self {
                    $(UnaryOp::$v => kernel.run(|x: R| UnaryOp::$v.compute(x)),)*
                }
            }

            /// The gradient of the input, given the input `x`, the output `y` and the
            /// output's gradient `g` (`None`: the op passes no gradient).
            #[allow(unused_variables)]
            pub fn vjp<G: Builder>(
                self,
                b: &mut G,
                x: &G::Value,
                y: &G::Value,
                g: &G::Value,
            ) -> Result<Option<G::Value>> {
                match self {
                    $(UnaryOp::$v => {
                        let ($b, $gx, $gy, $gg) = (&mut *b, x, y, g);
                        $rule
                    })*
                }
            }
        }
    };
}

crate::for_each_unary!(define_unary);
