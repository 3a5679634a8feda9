//! The built-in layers as typed structs over a backend. Each one's forward pass is its
//! `LayerSpec`'s, run eagerly; its parameters are typed tensors named as in PyTorch.

use super::module::{join, seed_for, Module, Slot};
use super::spec::{Init, LayerSpec, Mode, ParamSpec};
use crate::backend::Backend;
use crate::dim::{Const, Dim, Dyn, SameDim};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::op::RandDist;
use crate::raw::{Eager, RawTensor};
use crate::shape::{LastDim, Rank1, Rank2, Shape};
use crate::tensor::Tensor;
use std::sync::RwLock;

thread_local! {
    static ZEROS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with every parameter and buffer this thread initialises set to zeros
/// instead of drawn: for a model built only to have every value replaced (loaded from
/// a checkpoint), where the draws would be wasted time.
pub fn zero_initialised<R>(f: impl FnOnce() -> R) -> R {
    let outer = ZEROS.with(|z| z.replace(true));
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            ZEROS.with(|z| z.set(self.0));
        }
    }
    let _restore = Restore(outer);
    f()
}

/// Whether this thread is inside [`zero_initialised`].
pub(crate) fn initialising_zeros() -> bool {
    ZEROS.with(|z| z.get())
}

/// A tensor initialised as `spec` says, seeded by its full name (zeros inside
/// [`zero_initialised`]).
#[inline(never)]
pub fn init_tensor<B: Backend>(
    spec: &ParamSpec,
    device: &B::Device,
    seed: u64,
    name: &str,
) -> Result<RawTensor<B>> {
    if initialising_zeros() {
        return RawTensor::zeros(&spec.dims, DType::F32, device);
    }
    let s = seed_for(seed, name);
    match spec.init {
        Init::Uniform(b) => RawTensor::rand(
            &spec.dims,
            RandDist::Uniform { low: -b, high: b },
            s,
            DType::F32,
            device,
        ),
        Init::Normal(std) => RawTensor::rand(
            &spec.dims,
            RandDist::Normal { mean: 0.0, std },
            s,
            DType::F32,
            device,
        ),
        Init::Constant(v) => RawTensor::full(&spec.dims, v, DType::F32, device),
    }
}

/// A layer's parameters and its buffers, in its spec's order.
pub type LayerTensors<B> = (Vec<RawTensor<B>>, Vec<RawTensor<B>>);

/// A layer's parameters and buffers, each initialised as `spec` says: what a layer's
/// `init_named` wraps in its typed fields. Generic over the backend only, so it is
/// compiled once per backend, not once per layer size (the CPU's copy in kiln-cpu).
#[inline(never)]
pub fn init_layer<B: Backend>(
    spec: &LayerSpec,
    device: &B::Device,
    seed: u64,
    prefix: &str,
) -> Result<LayerTensors<B>> {
    let init = |ps: &ParamSpec| init_tensor(ps, device, seed, &join(prefix, ps.name));
    Ok((
        spec.params().iter().map(init).collect::<Result<_>>()?,
        spec.buffers().iter().map(init).collect::<Result<_>>()?,
    ))
}

/// The new values of a layer's tensors (`olds`, named `names` under `prefix`), each
/// from `get` and keeping its old dims and dtype: what a layer's `load_named` puts in
/// its typed fields once all of them are known, so a refused tensor leaves the layer
/// unchanged. Generic over the backend only, as [`init_layer`].
#[inline(never)]
pub fn load_layer<B: Backend>(
    prefix: &str,
    names: &[&str],
    olds: &[RawTensor<B>],
    get: &mut super::module::LoadFn<'_, B>,
) -> Result<Vec<RawTensor<B>>> {
    names
        .iter()
        .zip(olds)
        .map(|(name, old)| {
            let name = join(prefix, name);
            let new = get(&name, old)?;
            same_slot(&name, old, new)
        })
        .collect()
}

/// Calls `f` with each of a layer's parameters (named `names` under `prefix`) and its
/// gradient, in order: what a layer's `update_params` does with its typed fields. An
/// update that changes a parameter's dims or dtype is an error. Generic over the
/// backend only, as [`init_layer`].
#[inline(never)]
pub fn update_layer<B: Backend>(
    prefix: &str,
    names: &[&str],
    params: &mut [&mut RawTensor<B>],
    grads: &[&RawTensor<B>],
    f: &mut super::module::UpdateFn<'_, B>,
) -> Result<()> {
    for ((name, param), grad) in names.iter().zip(params.iter_mut()).zip(grads) {
        super::module::with_name(prefix, name, |name| {
            let before = (*param.dims(), param.dtype());
            f(name, param, grad)?;
            crate::tensor::check_unchanged((&before.0, before.1), (param.dims(), param.dtype()))
        })?;
    }
    Ok(())
}

/// Calls `f` with each of a layer's tensors (named `names` under `prefix`): what a
/// layer's `visit_params` and `visit_buffers` do with its typed fields. Generic over
/// the backend only, as [`init_layer`].
#[inline(never)]
pub fn visit_layer<B: Backend>(
    prefix: &str,
    names: &[&str],
    tensors: &[&RawTensor<B>],
    f: &mut dyn FnMut(Slot<'_, B>),
) {
    for (name, value) in names.iter().zip(tensors) {
        f(Slot {
            name: &join(prefix, name),
            value,
        });
    }
}

/// Takes the next `wants.len()` gradients of `raw` into `taken`, each checked against
/// the dims and dtype its field's type states (`wants`, in parameter order): what a
/// layer's gradients' `from_raw` wraps in its typed fields. Into the caller's slots,
/// not a `Vec`, as a training step takes its gradients without allocating. Generic
/// over the backend only, as [`init_layer`].
#[inline(never)]
pub fn take_layer_grads<B: Backend>(
    raw: &mut dyn Iterator<Item = RawTensor<B>>,
    wants: &[(&[Option<usize>], DType)],
    taken: &mut [Option<RawTensor<B>>],
) -> Result<()> {
    for (&(dims, dtype), slot) in wants.iter().zip(taken) {
        let g = raw
            .next()
            .ok_or_else(|| Error::invalid("grads", "too few gradients"))?;
        crate::tensor::check_fits(g.dtype(), g.dims(), dtype, dims)?;
        *slot = Some(g);
    }
    Ok(())
}

/// A replacement for `old` must keep its dims and dtype.
pub(crate) fn same_slot<B: Backend>(
    name: &str,
    old: &RawTensor<B>,
    new: RawTensor<B>,
) -> Result<RawTensor<B>> {
    if old.dims() != new.dims() || old.dtype() != new.dtype() {
        return Err(Error::shape(
            "update",
            format!(
                "`{name}` is {} {} but its replacement is {} {}",
                old.dims(),
                old.dtype(),
                new.dims(),
                new.dtype()
            ),
        ));
    }
    Ok(new)
}

/// A buffer: state a layer updates during training without a gradient (batch-norm's
/// running statistics). Interior mutability lets a `&self` training step update it.
pub struct Buffer<B: Backend, S: Shape>(RwLock<Tensor<B, S>>);

impl<B: Backend, S: Shape> Buffer<B, S> {
    /// Wraps a tensor.
    pub fn new(t: Tensor<B, S>) -> Self {
        Buffer(RwLock::new(t))
    }
    /// The current value.
    pub fn get(&self) -> Tensor<B, S> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
    /// Replaces the value.
    pub fn set(&self, t: Tensor<B, S>) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = t;
    }
    /// Writes `t` into the buffer: into its own storage where the backend can
    /// ([`Backend::assign`]: a captured training step updates the statistics where its
    /// replays read them, and a value taken with `get` before sees the update, as
    /// PyTorch's in-place running statistics), else by replacing the value.
    pub fn update(&self, t: Tensor<B, S>) -> Result<()> {
        let mut current = self.0.write().unwrap_or_else(|e| e.into_inner());
        if !B::assign(current.raw(), t.raw())? {
            *current = t;
        }
        Ok(())
    }
}

impl<B: Backend, S: Shape> Clone for Buffer<B, S> {
    fn clone(&self) -> Self {
        Buffer::new(self.get())
    }
}

macro_rules! layer {
    (
        $(#[$m:meta])*
        $name:ident $grads:ident <$($c:ident),*> spec = $spec:expr;
        params { $($(#[$pm:meta])* $p:ident : $pt:ty),* }
        buffers { $($(#[$bm:meta])* $b:ident : $bt:ty),* }
    ) => {
        $(#[$m])*
        pub struct $name<B: Backend, $(const $c: usize),*> {
            $($(#[$pm])* pub $p: Tensor<B, $pt>,)*
            $($(#[$bm])* pub $b: Buffer<B, $bt>,)*
            _backend: std::marker::PhantomData<B>,
        }

        /// Gradients of the layer's parameters, field for field.
        pub struct $grads<B: Backend, $(const $c: usize),*> {
            $(#[doc = concat!("Gradient of `", stringify!($p), "`.")] pub $p: Tensor<B, $pt>,)*
            _backend: std::marker::PhantomData<B>,
        }

        #[allow(unused_mut, unused_variables)]
        impl<B: Backend, $(const $c: usize),*> $grads<B, $($c),*> {
            /// Gradients from raw tensors in parameter order (checked against the types).
            pub fn from_raw(raw: impl IntoIterator<Item = RawTensor<B>>) -> Result<Self> {
                let wants: &[(&[Option<usize>], DType)] =
                    &[$((&<$pt as Shape>::DIMS[..<$pt as Shape>::RANK], DType::F32)),*];
                let mut taken = [$({ stringify!($p); None::<RawTensor<B>> }),*];
                take_layer_grads::<B>(&mut raw.into_iter(), wants, &mut taken)?;
                let mut taken = taken.into_iter().flatten();
                Ok($grads {
                    $($p: Tensor::wrap(taken.next().expect("one gradient per parameter")),)*
                    _backend: std::marker::PhantomData,
                })
            }
        }

        impl<B: Backend, $(const $c: usize),*> Clone for $name<B, $($c),*> {
            fn clone(&self) -> Self {
                $name { $($p: self.$p.clone(),)* $($b: self.$b.clone(),)* _backend: std::marker::PhantomData }
            }
        }

        impl<B: Backend, $(const $c: usize),*> $name<B, $($c),*> {
            /// The layer's specification.
            pub fn spec() -> LayerSpec {
                $spec
            }

            /// Parameters then buffers, in the spec's order.
            pub fn tensors(&self) -> Vec<RawTensor<B>> {
                vec![$(self.$p.raw().clone(),)* $(self.$b.get().into_raw(),)*]
            }

            /// Runs the spec's forward pass eagerly; in training, stores buffer updates.
            pub fn forward_raw(&self, x: &RawTensor<B>, mode: Mode) -> Result<RawTensor<B>> {
                let ts = self.tensors();
                let refs: Vec<&RawTensor<B>> = ts.iter().collect();
                let out = Self::spec().forward(&mut Eager::<B>::new(x.device().clone()), &refs, x, mode)?;
                #[allow(unused_variables)]
                for (name, value) in out.updates {
                    $(if name == stringify!($b) { self.$b.set(Tensor::from_raw(value.clone())?); })*
                }
                Ok(out.y)
            }
        }

        impl<B: Backend, $(const $c: usize),*> Module<B> for $name<B, $($c),*> {
            type Grads = $grads<B, $($c),*>;

            // The tensors `init_layer` and `load_layer` return have the spec's dims and
            // dtypes, which are the fields' types: they are wrapped without a second
            // check, so that what is compiled per layer size stays a few moves.
            #[allow(unused_variables, unused_mut)]
            fn init_named(device: &B::Device, seed: u64, prefix: &str) -> Result<Self> {
                let (params, buffers) = init_layer::<B>(&Self::spec(), device, seed, prefix)?;
                let mut params = params.into_iter();
                let mut buffers = buffers.into_iter();
                Ok($name {
                    $($p: Tensor::wrap(params.next().expect("spec lists every field")),)*
                    $($b: Buffer::new(Tensor::wrap(buffers.next().expect("spec lists every buffer"))),)*
                    _backend: std::marker::PhantomData,
                })
            }

            #[allow(unused_variables)]
            fn visit_params(&self, prefix: &str, f: &mut dyn FnMut(Slot<'_, B>)) {
                visit_layer(prefix, &[$(stringify!($p)),*], &[$(self.$p.raw()),*], f)
            }

            #[allow(unused_variables)]
            fn visit_buffers(&self, prefix: &str, f: &mut dyn FnMut(Slot<'_, B>)) {
                let values = ($(self.$b.get(),)*);
                let ($($b,)*) = &values;
                visit_layer(prefix, &[$(stringify!($b)),*], &[$($b.raw()),*], f)
            }

            #[allow(unused_variables)]
            fn update_params(
                &mut self,
                grads: &Self::Grads,
                prefix: &str,
                f: &mut super::module::UpdateFn<'_, B>,
            ) -> Result<()> {
                update_layer(
                    prefix,
                    &[$(stringify!($p)),*],
                    &mut [$(self.$p.raw_mut()),*],
                    &[$(grads.$p.raw()),*],
                    f,
                )
            }

            fn grads_from_raw(grads: &mut dyn Iterator<Item = RawTensor<B>>) -> Result<Self::Grads> {
                $grads::from_raw(grads)
            }

            #[allow(unused_mut, unused_variables)]
            fn load_named(&mut self, prefix: &str, get: &mut super::module::LoadFn<'_, B>) -> Result<()> {
                let names: &[&str] = &[$(stringify!($p),)* $(stringify!($b),)*];
                let mut new = load_layer(prefix, names, &self.tensors(), get)?.into_iter();
                $(self.$p = Tensor::wrap(new.next().expect("one value per name"));)*
                $(self.$b.set(Tensor::wrap(new.next().expect("one value per name")));)*
                Ok(())
            }
        }
    };
}

layer! {
    /// A fully connected layer, `y = x Wᵀ + b`, PyTorch's `nn.Linear`.
    Linear LinearGrads<I, O> spec = LayerSpec::Linear { inputs: I, outputs: O };
    params {
        /// `[O, I]`
        weight: Rank2<O, I>,
        /// `[O]`
        bias: Rank1<O>
    }
    buffers {}
}

layer! {
    /// A 2-d convolution with a square kernel `K`, stride `S`, padding `P` and `G`
    /// channel groups, PyTorch's `nn.Conv2d`.
    Conv2d Conv2dGrads<CI, CO, K, S, P, G> spec = LayerSpec::Conv2d { inputs: CI, outputs: CO, kernel: K, stride: S, padding: P, groups: G };
    params {
        /// `[CO, CI/G, K, K]` (the middle dim is `Dyn`: `CI/G` is not expressible in a type)
        weight: (Const<CO>, Dyn, Const<K>, Const<K>),
        /// `[CO]`
        bias: Rank1<CO>
    }
    buffers {}
}

layer! {
    /// Max pooling over `K×K` windows with stride `S`.
    MaxPool2d MaxPool2dGrads<K, S> spec = LayerSpec::MaxPool2d { kernel: K, stride: S };
    params {}
    buffers {}
}

layer! {
    /// Average pooling over `K×K` windows with stride `S`.
    AvgPool2d AvgPool2dGrads<K, S> spec = LayerSpec::AvgPool2d { kernel: K, stride: S };
    params {}
    buffers {}
}

layer! {
    /// Batch normalisation of `C` channels, PyTorch's `nn.BatchNorm2d` (ε 1e-5,
    /// momentum 0.1): batch statistics in training, running statistics in evaluation.
    BatchNorm2d BatchNorm2dGrads<C> spec = LayerSpec::BatchNorm2d { channels: C };
    params {
        /// Scale, `[C]`.
        weight: Rank1<C>,
        /// Shift, `[C]`.
        bias: Rank1<C>
    }
    buffers {
        /// Running mean, `[C]`.
        running_mean: Rank1<C>,
        /// Running (unbiased) variance, `[C]`.
        running_var: Rank1<C>
    }
}

layer! {
    /// Layer normalisation over a last axis of `F`, PyTorch's `nn.LayerNorm` (ε 1e-5).
    LayerNorm LayerNormGrads<F> spec = LayerSpec::LayerNorm { features: F };
    params {
        /// Scale, `[F]`.
        weight: Rank1<F>,
        /// Shift, `[F]`.
        bias: Rank1<F>
    }
    buffers {}
}

layer! {
    /// A table of `V` embeddings of width `D`, PyTorch's `nn.Embedding`.
    Embedding EmbeddingGrads<V, D> spec = LayerSpec::Embedding { vocab: V, features: D };
    params {
        /// `[V, D]`
        weight: Rank2<V, D>
    }
    buffers {}
}

layer! {
    /// Dropout of `P` percent of elements in training; the identity in evaluation.
    Dropout DropoutGrads<P> spec = LayerSpec::Dropout { percent: P };
    params {}
    buffers {}
}

layer! {
    /// Flattens every axis after the first.
    Flatten FlattenGrads<> spec = LayerSpec::Flatten;
    params {}
    buffers {}
}

impl<B: Backend, const I: usize, const O: usize> Linear<B, I, O> {
    /// `x Wᵀ + b` over the last axis of any rank.
    pub fn forward<S: LastDim>(&self, x: &Tensor<B, S>) -> Result<Tensor<B, S::WithLast<Const<O>>>>
    where
        S::Last: SameDim<Const<I>>,
    {
        Tensor::from_raw(self.forward_raw(x.raw(), Mode::Eval)?)
    }
}

impl<B: Backend, const F: usize> LayerNorm<B, F> {
    /// Normalises the last axis.
    pub fn forward<S: LastDim>(&self, x: &Tensor<B, S>) -> Result<Tensor<B, S>>
    where
        S::Last: SameDim<Const<F>>,
    {
        Tensor::from_raw(self.forward_raw(x.raw(), Mode::Eval)?)
    }
}

impl<B: Backend, const P: usize> Dropout<B, P> {
    /// Drops elements in `Mode::Train`; the identity in `Mode::Eval`.
    pub fn forward<S: Shape>(&self, x: &Tensor<B, S>, mode: Mode) -> Result<Tensor<B, S>> {
        Tensor::from_raw(self.forward_raw(x.raw(), mode)?)
    }
}

impl<B: Backend, const V: usize, const D: usize> Embedding<B, V, D> {
    /// Rows for a batch of sequences of ids.
    pub fn forward<N: Dim, T: Dim>(
        &self,
        ids: &Tensor<B, (N, T), i32>,
    ) -> Result<Tensor<B, (N, T, Const<D>)>> {
        Tensor::from_raw(self.forward_raw(ids.raw(), Mode::Eval)?)
    }
}

impl<B: Backend> Flatten<B> {
    /// `[N, ..] -> [N, product]`; the result type is checked against the element count.
    pub fn forward<S: Shape, S2: Shape>(&self, x: &Tensor<B, S>) -> Result<Tensor<B, S2>> {
        x.reshape::<S2>()
    }
}

impl<B: Backend, const C: usize> BatchNorm2d<B, C> {
    /// Normalises channels (`Mode::Train` uses and records batch statistics).
    pub fn forward<N: Dim, Ch: SameDim<Const<C>>, H: Dim, W: Dim>(
        &self,
        x: &Tensor<B, (N, Ch, H, W)>,
        mode: Mode,
    ) -> Result<Tensor<B, (N, Ch, H, W)>> {
        Tensor::from_raw(self.forward_raw(x.raw(), mode)?)
    }
}

macro_rules! windowed_forward {
    ($name:ident <$($c:ident),*>, $k:ident, $s:ident, $p:expr, $out_c:ty, $in_c:ty) => {
        impl<B: Backend, $(const $c: usize),*> $name<B, $($c),*> {
            /// The windowed forward pass; `OH`/`OW` are the output size, checked when the
            /// code is built (`crate::checks::WindowCheck`).
            pub fn forward<N: Dim, Ch: SameDim<$in_c>, const H: usize, const W: usize, const OH: usize, const OW: usize>(
                &self,
                x: &Tensor<B, (N, Ch, Const<H>, Const<W>)>,
            ) -> Result<Tensor<B, (N, $out_c, Const<OH>, Const<OW>)>> {
                let () = crate::checks::WindowCheck::<H, $k, $s, { $p }, OH>::OK;
                let () = crate::checks::WindowCheck::<W, $k, $s, { $p }, OW>::OK;
                Tensor::from_raw(self.forward_raw(x.raw(), Mode::Eval)?)
            }
        }
    };
}

windowed_forward!(Conv2d<CI, CO, K, S, P, G>, K, S, P, Const<CO>, Const<CI>);
windowed_forward!(MaxPool2d<K, S>, K, S, 0, Ch, Dyn);
windowed_forward!(AvgPool2d<K, S>, K, S, 0, Ch, Dyn);
