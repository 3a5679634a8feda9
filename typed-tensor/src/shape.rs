//! Shapes: the `Shape` trait over tuples of dims (rank 0 to 6), `Dims`, the run-time
//! list of sizes every tensor carries, and the type-level helpers of the typed API
//! (same-shape checks, removing an axis for reductions).

use crate::dim::{Const, Dim, Dyn, SameDim};
use crate::error::{Error, Result};
use std::fmt;

/// The largest rank a run-time tensor may have.
pub const MAX_RANK: usize = 8;

/// The largest rank of a shape type.
pub const MAX_STATIC_RANK: usize = 6;

/// A shape type: a tuple of `Dim`s, rank 0 to 6.
pub trait Shape: Copy + Default + fmt::Debug + Send + Sync + 'static {
    /// The number of dimensions.
    const RANK: usize;
    /// The compile-time size of each dimension (`None` for `Dyn`), padded with `None`.
    const DIMS: [Option<usize>; MAX_STATIC_RANK];
    /// The element count when every dimension is known at compile time.
    const NUMEL: Option<usize> = static_numel(&Self::DIMS, Self::RANK);

    /// Checks run-time sizes against this shape type: the rank and every `Const` dim.
    fn check(dims: &[usize]) -> Result<Dims> {
        check_dims(dims, &Self::DIMS[..Self::RANK])
    }

    /// The run-time dims when every dimension is static.
    fn static_dims() -> Option<Dims> {
        let mut v = [0usize; MAX_STATIC_RANK];
        for (i, slot) in v.iter_mut().enumerate().take(Self::RANK) {
            *slot = Self::DIMS[i]?;
        }
        Some(Dims::new(&v[..Self::RANK]).expect("static rank fits"))
    }
}

/// Writes a shape type the way messages show it: `[32, 784]`, `[?, 10]` for `Dyn`.
pub fn describe<S: Shape>() -> String {
    describe_dims(&S::DIMS[..S::RANK])
}

/// Checks run-time sizes against a shape type's dims (`None` for `Dyn`).
pub(crate) fn check_dims(dims: &[usize], want: &[Option<usize>]) -> Result<Dims> {
    let ok = dims.len() == want.len()
        && dims
            .iter()
            .zip(want)
            .all(|(d, s)| s.is_none_or(|s| s == *d));
    if ok {
        Dims::new(dims)
    } else {
        Err(Error::shape(
            "check",
            format!(
                "the tensor has shape {:?} but its type says {}",
                dims,
                describe_dims(want)
            ),
        ))
    }
}

/// Writes a shape type's dims the way messages show them.
fn describe_dims(dims: &[Option<usize>]) -> String {
    let parts: Vec<String> = dims
        .iter()
        .map(|d| d.map_or("?".to_string(), |n| n.to_string()))
        .collect();
    format!("[{}]", parts.join(", "))
}

const fn static_numel(dims: &[Option<usize>; MAX_STATIC_RANK], rank: usize) -> Option<usize> {
    let mut n = 1usize;
    let mut i = 0;
    while i < rank {
        match dims[i] {
            Some(d) => n *= d,
            None => return None,
        }
        i += 1;
    }
    Some(n)
}

macro_rules! tuple_shape {
    ($rank:expr; $($d:ident),*) => {
        impl<$($d: Dim),*> Shape for ($($d,)*) {
            const RANK: usize = $rank;
            const DIMS: [Option<usize>; MAX_STATIC_RANK] = pad([$($d::SIZE),*]);
        }
    };
}

const fn pad<const R: usize>(d: [Option<usize>; R]) -> [Option<usize>; MAX_STATIC_RANK] {
    let mut out = [None; MAX_STATIC_RANK];
    let mut i = 0;
    while i < R {
        out[i] = d[i];
        i += 1;
    }
    out
}

tuple_shape!(0;);
tuple_shape!(1; A);
tuple_shape!(2; A, B);
tuple_shape!(3; A, B, C);
tuple_shape!(4; A, B, C, D);
tuple_shape!(5; A, B, C, D, E);
tuple_shape!(6; A, B, C, D, E, F);

/// A scalar shape.
pub type Rank0 = ();
/// A static rank-1 shape.
pub type Rank1<const A: usize> = (Const<A>,);
/// A static rank-2 shape.
pub type Rank2<const A: usize, const B: usize> = (Const<A>, Const<B>);
/// A static rank-3 shape.
pub type Rank3<const A: usize, const B: usize, const C: usize> = (Const<A>, Const<B>, Const<C>);
/// A static rank-4 shape.
pub type Rank4<const A: usize, const B: usize, const C: usize, const D: usize> =
    (Const<A>, Const<B>, Const<C>, Const<D>);
/// A rank-2 shape with a run-time batch and a static feature count.
pub type Batch<const F: usize> = (Dyn, Const<F>);

/// Two shape types of the same rank whose dims match pairwise (checked by rustc;
/// `Dyn` dims are checked at run time).
#[diagnostic::on_unimplemented(
    message = "shape mismatch: `{Self}` does not match `{Rhs}`",
    label = "expected a tensor of shape `{Rhs}`, found `{Self}`",
    note = "both operands must have the same shape; broadcast one explicitly with `broadcast_to`"
)]
pub trait SameShape<Rhs: Shape>: Shape {
    /// The shape of the result, keeping every statically known dim.
    type Out: Shape;
}

macro_rules! same_shape {
    ($(($a:ident, $b:ident)),*) => {
        #[diagnostic::do_not_recommend]
        impl<$($a: SameDim<$b>, $b: Dim),*> SameShape<($($b,)*)> for ($($a,)*) {
            type Out = ($(<$a as SameDim<$b>>::Out,)*);
        }
    };
}

same_shape!();
same_shape!((A0, B0));
same_shape!((A0, B0), (A1, B1));
same_shape!((A0, B0), (A1, B1), (A2, B2));
same_shape!((A0, B0), (A1, B1), (A2, B2), (A3, B3));
same_shape!((A0, B0), (A1, B1), (A2, B2), (A3, B3), (A4, B4));
same_shape!((A0, B0), (A1, B1), (A2, B2), (A3, B3), (A4, B4), (A5, B5));

/// Shape types with axis `AX` removed (`Out`) or kept with size 1 (`KeepDim`): the
/// result types of reductions.
#[diagnostic::on_unimplemented(
    message = "axis {AX} is out of range for a tensor of shape `{Self}`",
    label = "this tensor has fewer than {AX}+1 dimensions"
)]
pub trait ReduceAxis<const AX: usize>: Shape {
    /// The shape with the axis removed.
    type Out: Shape;
    /// The shape with the axis kept as size 1.
    type KeepDim: Shape;
}

macro_rules! reduce_axis {
    ($ax:literal; [$($pre:ident),*] $x:ident [$($post:ident),*]) => {
        impl<$($pre: Dim,)* $x: Dim, $($post: Dim),*> ReduceAxis<$ax> for ($($pre,)* $x, $($post,)*) {
            type Out = ($($pre,)* $($post,)*);
            type KeepDim = ($($pre,)* Const<1>, $($post,)*);
        }
    };
}

reduce_axis!(0; [] A []);
reduce_axis!(0; [] A [B]);
reduce_axis!(1; [A] B []);
reduce_axis!(0; [] A [B, C]);
reduce_axis!(1; [A] B [C]);
reduce_axis!(2; [A, B] C []);
reduce_axis!(0; [] A [B, C, D]);
reduce_axis!(1; [A] B [C, D]);
reduce_axis!(2; [A, B] C [D]);
reduce_axis!(3; [A, B, C] D []);
reduce_axis!(0; [] A [B, C, D, E]);
reduce_axis!(1; [A] B [C, D, E]);
reduce_axis!(2; [A, B] C [D, E]);
reduce_axis!(3; [A, B, C] D [E]);
reduce_axis!(4; [A, B, C, D] E []);
reduce_axis!(0; [] A [B, C, D, E, F]);
reduce_axis!(1; [A] B [C, D, E, F]);
reduce_axis!(2; [A, B] C [D, E, F]);
reduce_axis!(3; [A, B, C] D [E, F]);
reduce_axis!(4; [A, B, C, D] E [F]);
reduce_axis!(5; [A, B, C, D, E] F []);

/// Shape types whose last axis is `Last`: lets the typed API name the feature dim
/// (matmul inner dims, softmax over the last axis) of any rank.
pub trait LastDim: Shape {
    /// The last dimension.
    type Last: Dim;
    /// The same shape with the last dimension replaced by `N`.
    type WithLast<N: Dim>: Shape;
}

macro_rules! last_dim {
    ([$($pre:ident),*] $x:ident) => {
        impl<$($pre: Dim,)* $x: Dim> LastDim for ($($pre,)* $x,) {
            type Last = $x;
            type WithLast<N: Dim> = ($($pre,)* N,);
        }
    };
}

last_dim!([] A);
last_dim!([A] B);
last_dim!([A, B] C);
last_dim!([A, B, C] D);
last_dim!([A, B, C, D] E);
last_dim!([A, B, C, D, E] F);

/// Marker used in messages for a run-time dim.
pub const DYN_NAME: &str = "?";

impl Dyn {
    /// How a `Dyn` dim prints in messages.
    pub const NAME: &'static str = DYN_NAME;
}

/// The run-time sizes of a tensor, rank 0 to `MAX_RANK`, stored inline (no allocation).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Dims {
    len: u8,
    d: [usize; MAX_RANK],
}

impl Dims {
    /// Dims from a slice; an error when the rank exceeds `MAX_RANK`.
    pub fn new(dims: &[usize]) -> Result<Self> {
        if dims.len() > MAX_RANK {
            return Err(Error::invalid(
                "dims",
                format!("rank {} exceeds the maximum of {MAX_RANK}", dims.len()),
            ));
        }
        let mut d = [0; MAX_RANK];
        d[..dims.len()].copy_from_slice(dims);
        Ok(Dims {
            len: dims.len() as u8,
            d,
        })
    }

    /// The dims of a scalar.
    pub const fn scalar() -> Self {
        Dims {
            len: 0,
            d: [0; MAX_RANK],
        }
    }

    /// The sizes as a slice.
    pub fn as_slice(&self) -> &[usize] {
        &self.d[..self.len as usize]
    }

    /// The sizes as a mutable slice.
    pub fn as_mut_slice(&mut self) -> &mut [usize] {
        &mut self.d[..self.len as usize]
    }

    /// The number of dims.
    pub fn rank(&self) -> usize {
        self.len as usize
    }

    /// The number of elements (1 for a scalar).
    pub fn numel(&self) -> usize {
        self.as_slice().iter().product()
    }

    /// Row-major (C-order) strides for these dims.
    pub fn contiguous_strides(&self) -> [usize; MAX_RANK] {
        let mut s = [0; MAX_RANK];
        let mut acc = 1;
        for i in (0..self.rank()).rev() {
            s[i] = acc;
            acc *= self.d[i];
        }
        s
    }

    /// The dims as a `Vec`.
    pub fn to_vec(&self) -> Vec<usize> {
        self.as_slice().to_vec()
    }
}

impl std::ops::Deref for Dims {
    type Target = [usize];
    fn deref(&self) -> &[usize] {
        self.as_slice()
    }
}

impl fmt::Debug for Dims {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.as_slice())
    }
}

impl fmt::Display for Dims {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.as_slice())
    }
}

impl TryFrom<&[usize]> for Dims {
    type Error = Error;
    fn try_from(v: &[usize]) -> Result<Self> {
        Dims::new(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_shape_consts() {
        type S = (Const<2>, Dyn, Const<3>);
        assert_eq!(S::RANK, 3);
        assert_eq!(S::NUMEL, None);
        assert_eq!(<Rank2<4, 5>>::NUMEL, Some(20));
        assert_eq!(<Rank0>::NUMEL, Some(1));
        assert_eq!(describe::<S>(), "[2, ?, 3]");
    }

    #[test]
    fn check_runtime_dims() {
        type S = (Dyn, Const<3>);
        assert!(S::check(&[7, 3]).is_ok());
        let err = S::check(&[7, 4]).unwrap_err().to_string();
        assert!(err.contains("[7, 4]") && err.contains("[?, 3]"), "{err}");
        assert!(S::check(&[3]).is_err());
    }

    #[test]
    fn dims_strides() {
        let d = Dims::new(&[2, 3, 4]).unwrap();
        assert_eq!(&d.contiguous_strides()[..3], &[12, 4, 1]);
        assert_eq!(d.numel(), 24);
        assert!(Dims::new(&[1; 9]).is_err());
    }
}
