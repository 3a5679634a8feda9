//! The elementwise comparisons (with NumPy broadcasting; the result is bool), each
//! declared once in [`for_each_compare!`](crate::for_each_compare!): variant and method names and the
//! comparison, written over any `PartialOrd` value (the f64 reference, the CPU kernels
//! in every dtype, the fused loops). The enum, the CPU and fused dispatch and the GPU
//! kernel's dispatch come from the list. Comparisons pass no gradient.

/// Calls `$callback!` with every comparison's declaration, in order. Each entry reads
/// `Variant method "name" compute(a, b) { comparison }`.
#[macro_export]
macro_rules! for_each_compare {
    ($callback:path) => {
        $callback! {
            /// a == b
            Eq eq "eq" compute(a, b) { a == b }
            /// a != b (true when either is NaN)
            Ne ne "ne" compute(a, b) { a != b }
            /// a < b
            Lt lt "lt" compute(a, b) { a < b }
            /// a <= b
            Le le "le" compute(a, b) { a <= b }
            /// a > b
            Gt gt "gt" compute(a, b) { a > b }
            /// a >= b
            Ge ge "ge" compute(a, b) { a >= b }
        }
    };
}

/// A loop over element pairs that `CmpOp::dispatch` instantiates once per comparison.
pub trait CompareKernel<T> {
    /// What the loop returns.
    type Output;
    /// Runs the loop with the comparison `f`.
    fn run(self, f: impl Fn(T, T) -> bool + Copy + Send + Sync) -> Self::Output;
}

macro_rules! define_compare {
    ($($(#[$doc:meta])* $v:ident $method:ident $name:literal compute($x:ident, $y:ident) $formula:block)*) => {
        /// Elementwise comparisons, with NumPy broadcasting; the result is bool
        /// (declared in [`for_each_compare!`](crate::for_each_compare!)).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum CmpOp {
            $($(#[$doc])* $v,)*
        }

        impl CmpOp {
            /// Every variant, in declaration order.
            pub const ALL: &'static [CmpOp] = &[$(CmpOp::$v),*];

            /// The op's name in messages and plans.
            pub const fn name(self) -> &'static str {
                match self {
                    $(CmpOp::$v => $name,)*
                }
            }

            /// The comparison of two values of any ordered type.
            #[inline(always)]
            pub fn compute<T: PartialOrd>(self, a: T, b: T) -> bool {
                match self {
                    $(CmpOp::$v => {
                        let ($x, $y) = (a, b);
                        $formula
                    })*
                }
            }

            /// The reference definition in f64.
            pub fn eval(self, a: f64, b: f64) -> bool {
                self.compute(a, b)
            }

            /// Runs `kernel` with this comparison, monomorphised per op.
            #[inline(always)]
            pub fn dispatch<T: PartialOrd, K: CompareKernel<T>>(self, kernel: K) -> K::Output {
                match self {
                    $(CmpOp::$v => kernel.run(|a: T, b: T| CmpOp::$v.compute(a, b)),)*
                }
            }
        }
    };
}

crate::for_each_compare!(define_compare);
