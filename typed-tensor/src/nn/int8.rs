//! The layers whose weights the int8 policy holds as int8 ([`Precision::Int8`]): what
//! an int8 instance's fields are (`#[model(precision = int8)] type MlpInt8 = Mlp;`
//! makes each `Linear` a [`LinearInt8`] and each `Embedding` an [`EmbeddingInt8`]).
//! Their tensors, names, dtypes and order are [`LayerSpec::params_in`]'s; their
//! forward pass is the spec's. They are for inference: every tensor is saved and
//! loaded, none is trained.

use super::layers::{init_tensor, initialising_zeros};
use super::module::{join, Module, Slot, UpdateFn};
use super::spec::{LayerSpec, Mode, ParamSpec};
use crate::backend::Backend;
use crate::dim::{Const, Dim, SameDim};
use crate::dtype::{DType, HostData};
use crate::error::{Error, Result};
use crate::precision::{quantize_int8_row, Precision};
use crate::raw::{Eager, RawTensor};
use crate::shape::LastDim;
use crate::tensor::Tensor;

/// The gradients of a layer that does not train: none.
pub struct NoGrads<B: Backend>(std::marker::PhantomData<B>);

/// A tensor of an int8 layer as `spec` says, starting from its f32 initialisation (an
/// int8 weight is that draw quantised per row, its scales the rows' scales): an int8
/// instance built from a seed computes what the f32 model of that seed does, to the
/// rounding. `scale_of` is the f32 weight whose scales a `weight_scale` holds.
fn init_int8<B: Backend>(
    spec: &LayerSpec,
    device: &B::Device,
    seed: u64,
    prefix: &str,
) -> Result<Vec<RawTensor<B>>> {
    let f32_params = spec.params();
    let weight = f32_params
        .iter()
        .find(|p| Precision::Int8.quantizes(p.name, &p.dims, p.dtype))
        .ok_or_else(|| Error::invalid("int8 layer", format!("{spec} has no int8 weight")))?;
    let (rows, cols) = (weight.dims[0], weight.dims[1]);
    let (mut q, mut scales) = if initialising_zeros() {
        // A model whose every value is about to be loaded: no draw to quantise.
        (vec![0; rows * cols], vec![0.0; rows])
    } else {
        let drawn = init_tensor::<B>(weight, device, seed, &join(prefix, weight.name))?;
        let values: Vec<f32> = drawn.to_vec()?;
        let (mut q, mut scales) = (Vec::with_capacity(values.len()), Vec::new());
        for row in values.chunks(cols.max(1)).take(rows) {
            let (qr, s) = quantize_int8_row(row);
            q.extend(qr);
            scales.push(s);
        }
        (q, scales)
    };
    spec.params_in(Precision::Int8)
        .iter()
        .map(|p: &ParamSpec| match (p.name, p.dtype) {
            // Moved, not copied: the policy gives one int8 weight and one scale each.
            (_, DType::I8) => {
                RawTensor::from_host(HostData::I8(std::mem::take(&mut q)), &p.dims, device)
            }
            ("weight_scale", _) => {
                RawTensor::from_vec(std::mem::take(&mut scales), &p.dims, device)
            }
            _ => init_tensor::<B>(p, device, seed, &join(prefix, p.name)),
        })
        .collect()
}

macro_rules! int8_layer {
    (
        $(#[$m:meta])*
        $name:ident <$($c:ident),*> spec = $spec:expr;
        tensors { $($(#[$fm:meta])* $f:ident : $ft:ty as $fe:ty),* }
    ) => {
        $(#[$m])*
        pub struct $name<B: Backend, $(const $c: usize),*> {
            $($(#[$fm])* pub $f: Tensor<B, $ft, $fe>,)*
        }

        impl<B: Backend, $(const $c: usize),*> Clone for $name<B, $($c),*> {
            fn clone(&self) -> Self {
                $name { $($f: self.$f.clone(),)* }
            }
        }

        impl<B: Backend, $(const $c: usize),*> $name<B, $($c),*> {
            /// The layer's specification (its f32 form's).
            pub fn spec() -> LayerSpec {
                $spec
            }

            /// Its tensors, in [`LayerSpec::params_in`]'s order under int8.
            pub fn tensors(&self) -> Vec<RawTensor<B>> {
                vec![$(self.$f.raw().clone()),*]
            }

            /// Runs the spec's forward pass eagerly.
            pub fn forward_raw(&self, x: &RawTensor<B>) -> Result<RawTensor<B>> {
                let ts = self.tensors();
                let refs: Vec<&RawTensor<B>> = ts.iter().collect();
                let mut g = Eager::<B>::new(x.device().clone());
                Ok(Self::spec().forward(&mut g, &refs, x, Mode::Eval)?.y)
            }
        }

        impl<B: Backend, $(const $c: usize),*> Module<B> for $name<B, $($c),*> {
            type Grads = NoGrads<B>;

            fn init_named(device: &B::Device, seed: u64, prefix: &str) -> Result<Self> {
                let mut ts = init_int8::<B>(&Self::spec(), device, seed, prefix)?.into_iter();
                Ok($name {
                    $($f: Tensor::from_raw(ts.next().expect("params_in lists every field"))?,)*
                })
            }

            fn visit_params(&self, _: &str, _: &mut dyn FnMut(Slot<'_, B>)) {}

            fn visit_buffers(&self, prefix: &str, f: &mut dyn FnMut(Slot<'_, B>)) {
                super::layers::visit_layer(prefix, &[$(stringify!($f)),*], &[$(self.$f.raw()),*], f)
            }

            fn update_params(&mut self, _: &Self::Grads, _: &str, _: &mut UpdateFn<'_, B>) -> Result<()> {
                Ok(())
            }

            fn grads_from_raw(_: &mut dyn Iterator<Item = RawTensor<B>>) -> Result<Self::Grads> {
                Ok(NoGrads(std::marker::PhantomData))
            }

            fn load_named(&mut self, prefix: &str, get: &mut super::module::LoadFn<'_, B>) -> Result<()> {
                let names: &[&str] = &[$(stringify!($f)),*];
                let mut new = super::layers::load_layer(prefix, names, &self.tensors(), get)?.into_iter();
                $(self.$f = Tensor::from_raw(new.next().expect("one value per name"))?;)*
                Ok(())
            }
        }
    };
}

int8_layer! {
    /// [`super::Linear`] with its weight held as int8, one f32 scale per output
    /// (`y = x (w · scale)ᵀ + b`, the product kept in integers where the backend can).
    LinearInt8<I, O> spec = LayerSpec::Linear { inputs: I, outputs: O };
    tensors {
        /// `[O, I]` int8.
        weight: (Const<O>, Const<I>) as i8,
        /// `[O]`
        bias: (Const<O>,) as f32,
        /// Each output row's scale, `[O]`.
        weight_scale: (Const<O>,) as f32
    }
}

int8_layer! {
    /// [`super::Embedding`] with its table held as int8, one f32 scale per row.
    EmbeddingInt8<V, D> spec = LayerSpec::Embedding { vocab: V, features: D };
    tensors {
        /// `[V, D]` int8.
        weight: (Const<V>, Const<D>) as i8,
        /// Each row's scale, `[V]`.
        weight_scale: (Const<V>,) as f32
    }
}

impl<B: Backend, const I: usize, const O: usize> LinearInt8<B, I, O> {
    /// `x (w · scale)ᵀ + b` over the last axis of any rank.
    pub fn forward<S: LastDim>(&self, x: &Tensor<B, S>) -> Result<Tensor<B, S::WithLast<Const<O>>>>
    where
        S::Last: SameDim<Const<I>>,
    {
        Tensor::from_raw(self.forward_raw(x.raw())?)
    }
}

impl<B: Backend, const V: usize, const D: usize> EmbeddingInt8<B, V, D> {
    /// The rows of `ids`, dequantised: `[N, T]` ids → `[N, T, D]`.
    pub fn forward<N: Dim, T: Dim>(
        &self,
        ids: &Tensor<B, (N, T), i32>,
    ) -> Result<Tensor<B, (N, T, Const<D>)>> {
        Tensor::from_raw(self.forward_raw(ids.raw())?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fields are the spec's tensors under int8, by name and dtype, in order.
    #[test]
    fn fields_are_the_specs_tensors_under_int8() {
        let names = |spec: LayerSpec| -> Vec<(&'static str, DType)> {
            spec.params_in(Precision::Int8)
                .iter()
                .map(|p| (p.name, p.dtype))
                .collect()
        };
        assert_eq!(
            names(LayerSpec::Linear {
                inputs: 3,
                outputs: 2
            }),
            [
                ("weight", DType::I8),
                ("bias", DType::F32),
                ("weight_scale", DType::F32)
            ]
        );
        assert_eq!(
            names(LayerSpec::Embedding {
                vocab: 5,
                features: 2
            }),
            [("weight", DType::I8), ("weight_scale", DType::F32)]
        );
    }
}
