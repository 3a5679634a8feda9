//! The elementwise binary primitives (with NumPy broadcasting), each declared once in
//! [`for_each_binary!`](crate::for_each_binary!): variant and method names, the dtypes it accepts, its formula
//! over any compute type [`Real`] (the f64 reference, the CPU float kernels and the
//! fused loops), its gradient rule, and the domains the conformance suite draws its
//! operands from. As for the unary ops, the enum, the `RawTensor` methods, the CPU and
//! fused dispatch and the GPU kernel's dispatch come from the list.

use crate::builder::{Builder, BuilderExt};
use crate::dtype::DType;
use crate::error::Result;
use crate::op::{CmpOp, UnaryOp};
use crate::real::Real;
use crate::unary::{Dtypes, TestDomain};

/// Calls `$callback!` with every binary op's declaration, in order. Each entry reads
/// `Variant method "name" [Dtypes, DomainA, DomainB] compute(a, b) { formula }
/// grad(bd, a, b, y, g) { rule }`: the rule returns the gradients of both operands
/// (before broadcasting is undone) from the operands, the output `y` and its gradient
/// `g`, with primitives over a `Builder` `bd`.
#[macro_export]
macro_rules! for_each_binary {
    ($callback:path) => {
        $callback! {
            /// a + b
            Add add "add" [NotBool, Any, Any]
                compute(a, b) { a + b }
                grad(bd, a, b, y, g) { Ok((g.clone(), g.clone())) }
            /// a - b
            Sub sub "sub" [NotBool, Any, Any]
                compute(a, b) { a - b }
                grad(bd, a, b, y, g) { Ok((g.clone(), bd.unary(UnaryOp::Neg, g)?)) }
            /// a * b
            Mul mul "mul" [NotBool, Any, Any]
                compute(a, b) { a * b }
                grad(bd, a, b, y, g) { Ok((bd.mul(g, b)?, bd.mul(g, a)?)) }
            /// a / b (integer division by zero is an error)
            Div div "div" [NotBool, Any, NonZero]
                compute(a, b) { a / b }
                grad(bd, a, b, y, g) {
                    // d/db (a/b) = -y/b
                    let ga = bd.div(g, b)?;
                    let t = bd.mul(&ga, y)?;
                    Ok((ga, bd.unary(UnaryOp::Neg, &t)?))
                }
            /// a ^ b
            Pow pow "pow" [Float, Positive, Small]
                compute(a, b) { a.powf(b) }
                grad(bd, a, b, y, g) {
                    // d/da a^b = b·a^(b-1); d/db a^b = y·ln a (taken as 0 where a <= 0)
                    let bm1 = bd.add_scalar(b, -1.0)?;
                    let p = bd.binary(BinaryOp::Pow, a, &bm1)?;
                    let da = bd.mul(b, &p)?;
                    let zero = bd.scalar_like(a, 0.0)?;
                    let pos = bd.compare(CmpOp::Gt, a, &zero)?;
                    let one = bd.scalar_like(a, 1.0)?;
                    let safe = bd.select(&pos, a, &one)?;
                    let ln = bd.unary(UnaryOp::Log, &safe)?;
                    let db = bd.mul(y, &ln)?;
                    Ok((bd.mul(g, &da)?, bd.mul(g, &db)?))
                }
            /// max(a, b); NaN propagates, as in PyTorch
            Max maximum "maximum" [NotBool, WithNan, WithNan]
                compute(a, b) { if a.is_nan() || a > b { a } else { b } }
                grad(bd, a, b, y, g) { winner_takes(bd, a, b, g, CmpOp::Lt, CmpOp::Gt) }
            /// min(a, b); NaN propagates, as in PyTorch
            Min minimum "minimum" [NotBool, WithNan, WithNan]
                compute(a, b) { if a.is_nan() || a < b { a } else { b } }
                grad(bd, a, b, y, g) { winner_takes(bd, a, b, g, CmpOp::Gt, CmpOp::Lt) }
        }
    };
}

/// maximum/minimum's gradient: the winner takes it and a tie splits it, as in PyTorch,
/// whose rule zeroes only a provable loser (`a_loses`/`b_loses` compare `a` with `b`):
/// where either side is NaN, both take the whole gradient.
fn winner_takes<G: Builder>(
    bd: &mut G,
    a: &G::Value,
    b: &G::Value,
    g: &G::Value,
    a_loses: CmpOp,
    b_loses: CmpOp,
) -> Result<(G::Value, G::Value)> {
    let tie = bd.compare(CmpOp::Eq, a, b)?;
    let half = bd.mul_scalar(g, 0.5)?;
    let share = bd.select(&tie, &half, g)?;
    let zero = bd.scalar_like(g, 0.0)?;
    let a_lost = bd.compare(a_loses, a, b)?;
    let b_lost = bd.compare(b_loses, a, b)?;
    Ok((
        bd.select(&a_lost, &zero, &share)?,
        bd.select(&b_lost, &zero, &share)?,
    ))
}

/// A loop over element pairs that `BinaryOp::dispatch` instantiates once per op.
pub trait BinaryKernel<R: Real> {
    /// What the loop returns.
    type Output;
    /// Runs the loop with the formula `f`.
    fn run(self, f: impl Fn(R, R) -> R + Copy + Send + Sync) -> Self::Output;
}

macro_rules! define_binary {
    ($($(#[$doc:meta])* $v:ident $method:ident $name:literal [$dtypes:ident, $da:ident, $db:ident]
        compute($x:ident, $y:ident) $formula:block
        grad($bd:ident, $ga:ident, $gb:ident, $gy:ident, $gg:ident) $rule:block)*) => {
        /// Elementwise ops of two inputs, with NumPy broadcasting (declared in
        /// [`for_each_binary!`](crate::for_each_binary!)).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum BinaryOp {
            $($(#[$doc])* $v,)*
        }

        impl BinaryOp {
            /// Every variant, in declaration order.
            pub const ALL: &'static [BinaryOp] = &[$(BinaryOp::$v),*];

            /// The op's name in messages and plans.
            pub const fn name(self) -> &'static str {
                match self {
                    $(BinaryOp::$v => $name,)*
                }
            }

            /// The name of its `RawTensor` method.
            pub const fn method(self) -> &'static str {
                match self {
                    $(BinaryOp::$v => stringify!($method),)*
                }
            }

            /// The dtypes it accepts (both operands have one dtype).
            pub const fn dtypes(self) -> Dtypes {
                match self {
                    $(BinaryOp::$v => Dtypes::$dtypes,)*
                }
            }

            /// The dtype rule.
            pub fn accepts(self, dtype: DType) -> bool {
                self.dtypes().accepts(dtype)
            }

            /// The domains its conformance tests draw the two operands from.
            pub const fn test_domains(self) -> (TestDomain, TestDomain) {
                match self {
                    $(BinaryOp::$v => (TestDomain::$da, TestDomain::$db),)*
                }
            }

            /// The formula in the compute type `R`.
            #[inline(always)]
            pub fn compute<R: Real>(self, a: R, b: R) -> R {
                match self {
                    $(BinaryOp::$v => {
                        let ($x, $y) = (a, b);
                        $formula
                    })*
                }
            }

            /// The reference definition in f64: what every kernel must agree with.
            pub fn eval(self, a: f64, b: f64) -> f64 {
                self.compute(a, b)
            }

            /// Runs `kernel` with this op's formula, monomorphised per op.
            #[inline(always)]
            pub fn dispatch<R: Real, K: BinaryKernel<R>>(self, kernel: K) -> K::Output {
                match self {
                    $(BinaryOp::$v => kernel.run(|a: R, b: R| BinaryOp::$v.compute(a, b)),)*
                }
            }

            /// The gradients of both operands at the output's dims (broadcasting not yet
            /// undone), given the operands, the output `y` and its gradient `g`.
            #[allow(unused_variables)]
            pub fn vjp<G: Builder>(
                self,
                b: &mut G,
                x: (&G::Value, &G::Value),
                y: &G::Value,
                g: &G::Value,
            ) -> Result<(G::Value, G::Value)> {
                match self {
                    $(BinaryOp::$v => {
                        let ($bd, $ga, $gb, $gy, $gg) = (&mut *b, x.0, x.1, y, g);
                        $rule
                    })*
                }
            }
        }
    };
}

crate::for_each_binary!(define_binary);
