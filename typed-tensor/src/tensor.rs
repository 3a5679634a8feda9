//! `Tensor<B, S, E>`: a tensor whose shape `S` and element type `E` are part of its type.
//! Dims that must match are checked by rustc through `SameDim`/`SameShape`; dims that
//! need arithmetic by const assertions (see `checks`); `Dyn` dims at run time, with an
//! error that names both shapes.

use crate::backend::Backend;
use crate::builder::{BuilderExt, Conv2dOptions};
use crate::checks::{BroadcastCheck, ReshapeCheck, StaticCheck, WindowCheck};
use crate::dim::{Const, Dim, SameDim};
use crate::dtype::{DType, Element, FloatElement};
use crate::error::{Error, Result};
use crate::op::{fmt_dims, RandDist};
use crate::raw::RawTensor;
use crate::shape::{describe, Dims, LastDim, ReduceAxis, SameShape, Shape};
use std::fmt;
use std::marker::PhantomData;

/// A tensor of shape type `S` and element type `E` on backend `B`.
pub struct Tensor<B: Backend, S: Shape, E: Element = f32> {
    raw: RawTensor<B>,
    _type: PhantomData<(S, E)>,
}

impl<B: Backend, S: Shape, E: Element> Clone for Tensor<B, S, E> {
    fn clone(&self) -> Self {
        Tensor {
            raw: self.raw.clone(),
            _type: PhantomData,
        }
    }
}

impl<B: Backend, S: Shape, E: Element> fmt::Debug for Tensor<B, S, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Tensor<{}, {}, {}>{}",
            B::NAME,
            describe::<S>(),
            E::DTYPE,
            self.raw.dims()
        )
    }
}

/// An image-batch shape `[N, C, H, W]` with static height and width.
pub type Nchw<N, C, const H: usize, const W: usize> = (N, C, Const<H>, Const<W>);

/// A stride for windowed ops, as a type so the output size is checked when compiled.
#[derive(Clone, Copy, Debug, Default)]
pub struct Stride<const S: usize>;

/// A padding for windowed ops, as a type so the output size is checked when compiled.
#[derive(Clone, Copy, Debug, Default)]
pub struct Padding<const P: usize>;

/// A square pooling kernel size, as a type.
#[derive(Clone, Copy, Debug, Default)]
pub struct Kernel<const K: usize>;

/// Whether a raw tensor of `dtype` and `dims` fits a typed tensor of `want_dtype` and
/// `want_dims` (`None` for `Dyn`). Not generic: compiled once, not per tensor type.
pub(crate) fn check_fits(
    dtype: DType,
    dims: &Dims,
    want_dtype: DType,
    want_dims: &[Option<usize>],
) -> Result<()> {
    if dtype != want_dtype {
        return Err(Error::dtype(
            "from_raw",
            format!("the tensor holds {dtype}, its type says {want_dtype}"),
        ));
    }
    crate::shape::check_dims(dims, want_dims).map(|_| ())
}

/// An update left a tensor's dims and dtype as they were.
pub(crate) fn check_unchanged(before: (&Dims, DType), after: (&Dims, DType)) -> Result<()> {
    if before.0 != after.0 || before.1 != after.1 {
        return Err(Error::shape(
            "update",
            format!(
                "a {} {} tensor was replaced by a {} {}",
                before.1, before.0, after.1, after.0
            ),
        ));
    }
    Ok(())
}

impl<B: Backend, S: Shape, E: Element> Tensor<B, S, E> {
    /// Wraps a raw tensor, checking its dims against `S` and its dtype against `E`.
    pub fn from_raw(raw: RawTensor<B>) -> Result<Self> {
        check_fits(raw.dtype(), raw.dims(), E::DTYPE, &S::DIMS[..S::RANK])?;
        Ok(Self::wrap(raw))
    }

    /// Wraps a raw tensor already known to fit `S` and `E` (a layer's tensor made or
    /// checked against its spec, which states the same dims).
    pub(crate) fn wrap(raw: RawTensor<B>) -> Self {
        debug_assert!(S::check(raw.dims()).is_ok() && raw.dtype() == E::DTYPE);
        Tensor {
            raw,
            _type: PhantomData,
        }
    }

    /// The untyped tensor.
    pub fn raw(&self) -> &RawTensor<B> {
        &self.raw
    }

    /// Lets `f` change the untyped tensor in place (an optimizer's update); an error
    /// if it leaves other dims or another dtype than the type says.
    pub fn update_raw(&mut self, f: impl FnOnce(&mut RawTensor<B>) -> Result<()>) -> Result<()> {
        let (dims, dtype) = (*self.raw.dims(), self.raw.dtype());
        f(&mut self.raw)?;
        check_unchanged((&dims, dtype), (self.raw.dims(), self.raw.dtype()))
    }

    /// The untyped tensor, to change in place: whoever changes it keeps its dims and
    /// dtype (checked as [`Tensor::update_raw`] does).
    pub(crate) fn raw_mut(&mut self) -> &mut RawTensor<B> {
        &mut self.raw
    }

    /// Unwraps the untyped tensor.
    pub fn into_raw(self) -> RawTensor<B> {
        self.raw
    }

    /// Uploads `data` with run-time `dims` (checked against `S`).
    pub fn from_vec(data: Vec<E>, dims: &[usize], device: &B::Device) -> Result<Self> {
        S::check(dims)?;
        Ok(Self::wrap(RawTensor::from_vec(data, dims, device)?))
    }

    /// Uploads `data` into a fully static shape.
    pub fn from_slice(data: &[E], device: &B::Device) -> Result<Self> {
        let () = StaticCheck::<S>::OK;
        let dims = S::static_dims().expect("checked static");
        Self::from_vec(data.to_vec(), &dims, device)
    }

    /// A fully static tensor filled with `value`.
    pub fn full(value: f64, device: &B::Device) -> Result<Self> {
        let () = StaticCheck::<S>::OK;
        let dims = S::static_dims().expect("checked static");
        Self::full_dims(&dims, value, device)
    }

    /// A fully static tensor of zeros.
    pub fn zeros(device: &B::Device) -> Result<Self> {
        Self::full(0.0, device)
    }

    /// A tensor of run-time `dims` (checked against `S`) filled with `value`.
    pub fn full_dims(dims: &[usize], value: f64, device: &B::Device) -> Result<Self> {
        S::check(dims)?;
        Ok(Self::wrap(RawTensor::full(dims, value, E::DTYPE, device)?))
    }

    /// The run-time dims.
    pub fn dims(&self) -> &Dims {
        self.raw.dims()
    }

    /// The device.
    pub fn device(&self) -> &B::Device {
        self.raw.device()
    }

    /// The elements in row-major order.
    pub fn to_vec(&self) -> Result<Vec<E>> {
        self.raw.to_vec()
    }

    /// Reinterprets the shape type after a run-time check (for `Dyn` ↔ `Const`).
    pub fn into_shape<S2: Shape>(self) -> Result<Tensor<B, S2, E>> {
        S2::check(self.raw.dims())
            .map_err(|_| mismatch("into_shape", self.raw.dims(), &describe::<S2>()))?;
        Ok(Tensor::wrap(self.raw))
    }

    /// Same elements in shape `S2`; the element counts must agree (checked when built
    /// for static shapes, at run time for `Dyn`).
    pub fn reshape<S2: Shape>(&self) -> Result<Tensor<B, S2, E>> {
        let () = ReshapeCheck::<S, S2>::OK;
        let dims = S2::DIMS[..S2::RANK].to_vec();
        let y = BuilderExt::reshape_open(&mut self.raw.ops(), &self.raw, dims)?;
        Ok(Tensor::wrap(y))
    }

    /// [`Tensor::reshape`] regrouping rows on purpose: a `Dyn` leading size may cut
    /// across the input's rows (`[2, 10]` into `[5, 4]`), which `reshape` refuses.
    pub fn regroup<S2: Shape>(&self) -> Result<Tensor<B, S2, E>> {
        let () = ReshapeCheck::<S, S2>::OK;
        let dims = S2::DIMS[..S2::RANK].to_vec();
        Ok(Tensor::wrap(BuilderExt::regroup(
            &mut self.raw.ops(),
            &self.raw,
            dims,
        )?))
    }

    /// Same elements in run-time `dims` (checked against `S2`).
    pub fn reshape_dims<S2: Shape>(&self, dims: &[usize]) -> Result<Tensor<B, S2, E>> {
        S2::check(dims)?;
        Ok(Tensor::wrap(self.raw.reshape(dims)?))
    }

    /// Broadcasts to shape `S2` (NumPy rules; checked when built for static dims).
    pub fn broadcast_to<S2: Shape>(&self) -> Result<Tensor<B, S2, E>> {
        let () = BroadcastCheck::<S, S2>::OK;
        let dims = S2::static_dims().ok_or_else(|| {
            Error::invalid(
                "broadcast_to",
                "the target has `Dyn` dims: use broadcast_like",
            )
        })?;
        Ok(Tensor::wrap(self.raw.broadcast_to(&dims)?))
    }

    /// Broadcasts to the shape of `other`.
    pub fn broadcast_like<S2: Shape, E2: Element>(
        &self,
        other: &Tensor<B, S2, E2>,
    ) -> Result<Tensor<B, S2, E>> {
        let () = BroadcastCheck::<S, S2>::OK;
        Ok(Tensor::wrap(self.raw.broadcast_to(other.dims())?))
    }

    /// Reorders dims into shape `S2` (checked at run time against `S2`).
    pub fn permute<S2: Shape>(&self, perm: &[usize]) -> Result<Tensor<B, S2, E>> {
        let r = self.raw.permute(perm)?;
        S2::check(r.dims()).map_err(|_| mismatch("permute", r.dims(), &describe::<S2>()))?;
        Ok(Tensor::wrap(r))
    }

    /// Converts the element type.
    pub fn cast<E2: Element>(&self) -> Result<Tensor<B, S, E2>> {
        Ok(Tensor::wrap(self.raw.cast(E2::DTYPE)?))
    }

    /// Σ over `AX`, removing it.
    pub fn sum<const AX: usize>(&self) -> Result<Tensor<B, <S as ReduceAxis<AX>>::Out, E>>
    where
        S: ReduceAxis<AX>,
    {
        Ok(Tensor::wrap(self.raw.sum(&[AX], false)?))
    }

    /// Σ over `AX`, keeping it as size 1.
    pub fn sum_keepdim<const AX: usize>(
        &self,
    ) -> Result<Tensor<B, <S as ReduceAxis<AX>>::KeepDim, E>>
    where
        S: ReduceAxis<AX>,
    {
        Ok(Tensor::wrap(self.raw.sum(&[AX], true)?))
    }

    /// Maximum over `AX`, removing it.
    pub fn max<const AX: usize>(&self) -> Result<Tensor<B, <S as ReduceAxis<AX>>::Out, E>>
    where
        S: ReduceAxis<AX>,
    {
        Ok(Tensor::wrap(self.raw.max(&[AX], false)?))
    }

    /// Index of the maximum along `AX` (i32), removing it.
    pub fn argmax<const AX: usize>(&self) -> Result<Tensor<B, <S as ReduceAxis<AX>>::Out, i32>>
    where
        S: ReduceAxis<AX>,
    {
        Ok(Tensor::wrap(self.raw.argmax(AX, false)?))
    }

    /// Σ of every element.
    pub fn sum_all(&self) -> Result<Tensor<B, (), E>> {
        Ok(Tensor::wrap(self.raw.sum_all()?))
    }

    /// Elementwise equality (bool result); shapes must match.
    pub fn eq<S2: Shape>(&self, rhs: &Tensor<B, S2, E>) -> Result<Tensor<B, S::Out, bool>>
    where
        S: SameShape<S2>,
    {
        same_dims("eq", self.dims(), rhs.dims())?;
        Ok(Tensor::wrap(
            self.raw.compare(crate::op::CmpOp::Eq, &rhs.raw)?,
        ))
    }
}

macro_rules! typed_unary {
    ($($(#[$m:meta])* $name:ident),* $(,)?) => {
        impl<B: Backend, S: Shape, E: FloatElement> Tensor<B, S, E> {
            $(
                $(#[$m])*
                pub fn $name(&self) -> Result<Self> {
                    Ok(Self::wrap(self.raw.$name()?))
                }
            )*
        }
    };
}

/// The method table's typed methods whose result type follows from the entry
/// (`-> same`: the receiver's shape; `-> scalar`: rank 0).
macro_rules! typed_table_methods {
    ($( #[doc = $doc:literal] $v:ident $name:ident $form:ident ( $($arg:ident),* ) -> $typed:ident => |$b:ident, $x:ident| $body:expr ; )*) => {
        impl<B: Backend, S: Shape, E: FloatElement> Tensor<B, S, E> {
            $( typed_table_methods!(@one #[doc = $doc] $name $typed); )*
        }
    };
    (@one #[doc = $doc:literal] $name:ident same) => {
        #[doc = $doc]
        pub fn $name(&self) -> Result<Self> {
            Ok(Self::wrap(self.raw.$name()?))
        }
    };
    (@one #[doc = $doc:literal] $name:ident scalar) => {
        #[doc = $doc]
        pub fn $name(&self) -> Result<Tensor<B, (), E>> {
            Ok(Tensor::wrap(self.raw.$name()?))
        }
    };
    (@one #[doc = $doc:literal] $name:ident custom) => {};
}

crate::for_each_method!(typed_table_methods);

/// The float unary ops of the op table as typed methods (bool ops have their own).
macro_rules! typed_unary_ops {
    ($($(#[$doc:meta])* $v:ident $method:ident $name:literal [$dtypes:ident, $domain:ident]
        compute($x:ident) $formula:block
        grad($b:ident, $gx:ident, $gy:ident, $gg:ident) $rule:block)*) => {
        $(typed_unary_ops!(@one [$dtypes] $(#[$doc])* $method);)*
    };
    (@one [Bool] $(#[$doc:meta])* $method:ident) => {};
    (@one [$dtypes:ident] $(#[$doc:meta])* $method:ident) => {
        typed_unary!($(#[$doc])* $method);
    };
}

crate::for_each_unary!(typed_unary_ops);

macro_rules! typed_binary {
    ($($(#[$m:meta])* $name:ident),* $(,)?) => {
        impl<B: Backend, S: Shape, E: Element> Tensor<B, S, E> {
            $(
                $(#[$m])*
                pub fn $name<S2: Shape>(&self, rhs: &Tensor<B, S2, E>) -> Result<Tensor<B, S::Out, E>>
                where
                    S: SameShape<S2>,
                {
                    same_dims(stringify!($name), self.dims(), rhs.dims())?;
                    Ok(Tensor::wrap(self.raw.$name(&rhs.raw)?))
                }
            )*
        }
    };
}

typed_binary!(
    /// a + b (same shapes; broadcast explicitly with `broadcast_to`)
    add,
    /// a - b
    sub,
    /// a * b
    mul,
    /// a / b
    div,
    /// a ^ b
    pow,
    /// max(a, b)
    maximum,
    /// min(a, b)
    minimum,
);

impl<B: Backend, S: Shape, E: FloatElement> Tensor<B, S, E> {
    /// x + s
    pub fn add_scalar(&self, s: f64) -> Result<Self> {
        Ok(Self::wrap(self.raw.add_scalar(s)?))
    }
    /// x * s
    pub fn mul_scalar(&self, s: f64) -> Result<Self> {
        Ok(Self::wrap(self.raw.mul_scalar(s)?))
    }
    /// Mean over `AX`, removing it.
    pub fn mean<const AX: usize>(&self) -> Result<Tensor<B, <S as ReduceAxis<AX>>::Out, E>>
    where
        S: ReduceAxis<AX>,
    {
        Ok(Tensor::wrap(self.raw.mean(&[AX], false)?))
    }
    /// Mean squared error against a tensor of the same shape.
    pub fn mse<S2: Shape>(&self, target: &Tensor<B, S2, E>) -> Result<Tensor<B, (), E>>
    where
        S: SameShape<S2>,
    {
        Ok(Tensor::wrap(self.raw.mse(&target.raw)?))
    }
    /// Seeded uniform values on [low, high) in a fully static shape.
    pub fn uniform(low: f64, high: f64, seed: u64, device: &B::Device) -> Result<Self> {
        let () = StaticCheck::<S>::OK;
        let dims = S::static_dims().expect("checked static");
        Self::uniform_dims(&dims, low, high, seed, device)
    }
    /// Seeded uniform values on [low, high) with run-time dims.
    pub fn uniform_dims(
        dims: &[usize],
        low: f64,
        high: f64,
        seed: u64,
        device: &B::Device,
    ) -> Result<Self> {
        S::check(dims)?;
        let dist = RandDist::Uniform { low, high };
        Ok(Self::wrap(RawTensor::rand(
            dims,
            dist,
            seed,
            E::DTYPE,
            device,
        )?))
    }
    /// Seeded normal values in a fully static shape.
    pub fn normal(mean: f64, std: f64, seed: u64, device: &B::Device) -> Result<Self> {
        let () = StaticCheck::<S>::OK;
        let dims = S::static_dims().expect("checked static");
        Self::normal_dims(&dims, mean, std, seed, device)
    }
    /// Seeded normal values with run-time dims.
    pub fn normal_dims(
        dims: &[usize],
        mean: f64,
        std: f64,
        seed: u64,
        device: &B::Device,
    ) -> Result<Self> {
        S::check(dims)?;
        let dist = RandDist::Normal { mean, std };
        Ok(Self::wrap(RawTensor::rand(
            dims,
            dist,
            seed,
            E::DTYPE,
            device,
        )?))
    }
}

impl<B: Backend, S: LastDim, E: FloatElement> Tensor<B, S, E> {
    /// Softmax over the last axis.
    pub fn softmax(&self) -> Result<Self> {
        Ok(Self::wrap(self.raw.softmax(S::RANK - 1)?))
    }
    /// Log-softmax over the last axis.
    pub fn log_softmax(&self) -> Result<Self> {
        Ok(Self::wrap(self.raw.log_softmax(S::RANK - 1)?))
    }
}

/// Shape pairs that multiply as matrices, with the shape of the product. Batched
/// operands share batch dims; a rank-2 right operand is shared by every batch.
#[diagnostic::on_unimplemented(
    message = "cannot multiply a `{Self}` matrix by a `{Rhs}` matrix",
    label = "the inner dims of `{Self}` × `{Rhs}` differ (or the ranks do not pair)",
    note = "matmul needs [.., M, K] × [.., K, N] (or × [K, N])"
)]
pub trait MatMulShape<Rhs: Shape>: Shape {
    /// The shape of the product.
    type Out: Shape;
}

#[diagnostic::do_not_recommend]
impl<M: Dim, K: SameDim<K2>, K2: Dim, N: Dim> MatMulShape<(K2, N)> for (M, K) {
    type Out = (M, N);
}

#[diagnostic::do_not_recommend]
impl<Bt: Dim, M: Dim, K: SameDim<K2>, K2: Dim, N: Dim> MatMulShape<(K2, N)> for (Bt, M, K) {
    type Out = (Bt, M, N);
}

#[diagnostic::do_not_recommend]
impl<Bt: SameDim<Bt2>, Bt2: Dim, M: Dim, K: SameDim<K2>, K2: Dim, N: Dim> MatMulShape<(Bt2, K2, N)>
    for (Bt, M, K)
{
    type Out = (Bt::Out, M, N);
}

#[diagnostic::do_not_recommend]
impl<
        B0: SameDim<C0>,
        C0: Dim,
        B1: SameDim<C1>,
        C1: Dim,
        M: Dim,
        K: SameDim<K2>,
        K2: Dim,
        N: Dim,
    > MatMulShape<(C0, C1, K2, N)> for (B0, B1, M, K)
{
    type Out = (B0::Out, B1::Out, M, N);
}

#[diagnostic::do_not_recommend]
impl<B0: Dim, B1: Dim, M: Dim, K: SameDim<K2>, K2: Dim, N: Dim> MatMulShape<(K2, N)>
    for (B0, B1, M, K)
{
    type Out = (B0, B1, M, N);
}

impl<B: Backend, S: Shape, E: FloatElement> Tensor<B, S, E> {
    /// Matrix product (batched where the shapes say so).
    pub fn matmul<S2: Shape>(&self, rhs: &Tensor<B, S2, E>) -> Result<Tensor<B, S::Out, E>>
    where
        S: MatMulShape<S2>,
    {
        Ok(Tensor::wrap(self.raw.matmul(&rhs.raw)?))
    }
}

impl<B: Backend, M: Dim, N: Dim, E: Element> Tensor<B, (M, N), E> {
    /// The transpose (a view).
    pub fn t(&self) -> Result<Tensor<B, (N, M), E>> {
        Ok(Tensor::wrap(self.raw.transpose(0, 1)?))
    }
}

impl<B: Backend, N: Dim, C: Dim, E: FloatElement> Tensor<B, (N, C), E> {
    /// Mean cross-entropy against integer labels, with optional label smoothing.
    pub fn cross_entropy<N2: Dim>(
        &self,
        labels: &Tensor<B, (N2,), i32>,
        smoothing: f64,
    ) -> Result<Tensor<B, (), E>>
    where
        N: SameDim<N2>,
    {
        Ok(Tensor::wrap(
            self.raw.cross_entropy_smoothed(&labels.raw, smoothing)?,
        ))
    }
}

impl<B: Backend, N: Dim, C: Dim, const H: usize, const W: usize, E: FloatElement>
    Tensor<B, (N, C, Const<H>, Const<W>), E>
{
    /// 2-d convolution with a square kernel; the output size is checked when built.
    pub fn conv2d<
        C2: Dim,
        const O: usize,
        const K: usize,
        const S: usize,
        const P: usize,
        const OH: usize,
        const OW: usize,
    >(
        &self,
        weight: &Tensor<B, (Const<O>, C2, Const<K>, Const<K>), E>,
        bias: Option<&Tensor<B, (Const<O>,), E>>,
        _stride: Stride<S>,
        _padding: Padding<P>,
    ) -> Result<Tensor<B, Nchw<N, Const<O>, OH, OW>, E>>
    where
        C: SameDim<C2>,
    {
        let () = WindowCheck::<H, K, S, P, OH>::OK;
        let () = WindowCheck::<W, K, S, P, OW>::OK;
        let mut g = self.raw.ops();
        let options = Conv2dOptions {
            stride: [S; 2],
            padding: [P; 2],
            ..Conv2dOptions::default()
        };
        let y = g.conv2d(&self.raw, &weight.raw, bias.map(|b| &b.raw), options)?;
        Ok(Tensor::wrap(y))
    }

    /// Max pooling with a square kernel; the output size is checked when built.
    pub fn max_pool2d<const K: usize, const S: usize, const OH: usize, const OW: usize>(
        &self,
        _kernel: Kernel<K>,
        _stride: Stride<S>,
    ) -> Result<Tensor<B, Nchw<N, C, OH, OW>, E>> {
        let () = WindowCheck::<H, K, S, 0, OH>::OK;
        let () = WindowCheck::<W, K, S, 0, OW>::OK;
        let mut g = self.raw.ops();
        Ok(Tensor::wrap(
            g.max_pool2d(&self.raw, [K; 2], [S; 2], [0; 2])?,
        ))
    }

    /// Average pooling with a square kernel; the output size is checked when built.
    pub fn avg_pool2d<const K: usize, const S: usize, const OH: usize, const OW: usize>(
        &self,
        _kernel: Kernel<K>,
        _stride: Stride<S>,
    ) -> Result<Tensor<B, Nchw<N, C, OH, OW>, E>> {
        let () = WindowCheck::<H, K, S, 0, OH>::OK;
        let () = WindowCheck::<W, K, S, 0, OW>::OK;
        let mut g = self.raw.ops();
        Ok(Tensor::wrap(
            g.avg_pool2d(&self.raw, [K; 2], [S; 2], [0; 2])?,
        ))
    }
}

/// Run-time dims for shape type `S2` holding `numel` elements: static dims as they
/// are, one `Dyn` dim solved from the element count.
fn same_dims(op: &'static str, a: &Dims, b: &Dims) -> Result<()> {
    if a == b {
        Ok(())
    } else {
        Err(Error::shape(
            op,
            format!("the operands have shapes {a} and {b}"),
        ))
    }
}

fn mismatch(op: &'static str, dims: &Dims, want: &str) -> Error {
    Error::shape(
        op,
        format!("shape {} does not fit {}", fmt_dims(dims), want),
    )
}
