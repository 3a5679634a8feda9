//! Dimensions in types: `Const<N>` (known when the program is compiled) and `Dyn` (a
//! size known only at run time), and `SameDim`, the trait through which rustc checks
//! that two dimensions match and names both when they do not.

use std::fmt::Debug;

/// One dimension of a shape type.
pub trait Dim: Copy + Default + Debug + Send + Sync + 'static {
    /// The size when it is known at compile time.
    const SIZE: Option<usize>;
}

/// A dimension of size `N`, known at compile time.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq, Hash)]
pub struct Const<const N: usize>;

/// A dimension whose size is known only at run time; checked when the tensor is made.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq, Hash)]
pub struct Dyn;

impl<const N: usize> Dim for Const<N> {
    const SIZE: Option<usize> = Some(N);
}

impl Dim for Dyn {
    const SIZE: Option<usize> = None;
}

/// Two dimensions that must be equal: `Const<N>` with `Const<N>`, or either with `Dyn`
/// (then equality is checked at run time). `Out` is the more precise of the two.
#[diagnostic::on_unimplemented(
    message = "dimension mismatch: `{Self}` does not match `{Rhs}`",
    label = "expected a dimension matching `{Rhs}`, found `{Self}`",
    note = "the two dimensions must be equal; use `Dyn` where a size is only known at run time"
)]
pub trait SameDim<Rhs: Dim>: Dim {
    /// The dimension of the result: `Const<N>` when either side knows it.
    type Out: Dim;
}

#[diagnostic::do_not_recommend]
impl<const N: usize> SameDim<Const<N>> for Const<N> {
    type Out = Const<N>;
}

#[diagnostic::do_not_recommend]
impl<const N: usize> SameDim<Dyn> for Const<N> {
    type Out = Const<N>;
}

#[diagnostic::do_not_recommend]
impl<const N: usize> SameDim<Const<N>> for Dyn {
    type Out = Const<N>;
}

#[diagnostic::do_not_recommend]
impl SameDim<Dyn> for Dyn {
    type Out = Dyn;
}
