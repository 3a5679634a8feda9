//! `RawTensor`: a tensor whose shape and dtype are known only at run time, and `Eager`,
//! the builder that runs each op as soon as it is applied. Every op is checked by the op
//! table's rule before a backend sees it; views (reshape, permute, expand, slice) are
//! layout changes and cost no copy. The typed `Tensor` and the dynamic path are thin
//! layers over this.

use crate::backend::{Backend, View};
use crate::builder::{Builder, BuilderExt};
use crate::dtype::{DType, Element, HostData};
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::op::{Op, OpClass, RandDist, TensorMeta};
use crate::shape::Dims;
use std::fmt;
use std::sync::Arc;

/// A tensor with run-time shape and dtype, on backend `B`.
pub struct RawTensor<B: Backend> {
    storage: Arc<B::Storage>,
    layout: Layout,
    dtype: DType,
    device: B::Device,
}

impl<B: Backend> Clone for RawTensor<B> {
    fn clone(&self) -> Self {
        RawTensor {
            storage: self.storage.clone(),
            layout: self.layout,
            dtype: self.dtype,
            device: self.device.clone(),
        }
    }
}

impl<B: Backend> fmt::Debug for RawTensor<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "RawTensor<{}>({}, {})",
            B::NAME,
            self.layout.dims(),
            self.dtype
        )
    }
}

impl<B: Backend> RawTensor<B> {
    /// Wraps a contiguous buffer with the given dims.
    pub fn from_storage(storage: B::Storage, dims: Dims, device: B::Device) -> Result<Self> {
        let len = B::storage_len(&storage);
        if len != dims.numel() {
            return Err(Error::shape(
                "from_storage",
                format!("a buffer of {len} elements cannot have shape {dims}"),
            ));
        }
        Ok(RawTensor {
            dtype: B::storage_dtype(&storage),
            storage: Arc::new(storage),
            layout: Layout::contiguous(dims),
            device,
        })
    }

    /// Wraps a shared buffer seen through `layout` (which must stay inside it).
    pub fn from_arc(storage: Arc<B::Storage>, layout: Layout, device: B::Device) -> Result<Self> {
        if layout.storage_extent() > B::storage_len(&storage) {
            return Err(Error::invalid(
                "from_arc",
                format!(
                    "layout {layout:?} reaches past a buffer of {} elements",
                    B::storage_len(&storage)
                ),
            ));
        }
        Ok(RawTensor {
            dtype: B::storage_dtype(&storage),
            storage,
            layout,
            device,
        })
    }

    /// Uploads host values with the given dims.
    pub fn from_host(data: HostData, dims: &[usize], device: &B::Device) -> Result<Self> {
        let dims = Dims::new(dims)?;
        if data.len() != dims.numel() {
            return Err(Error::shape(
                "from_host",
                format!(
                    "{} values cannot fill shape {dims} ({} elements)",
                    data.len(),
                    dims.numel()
                ),
            ));
        }
        let storage = B::upload(device, data)?;
        RawTensor::from_storage(storage, dims, device.clone())
    }

    /// Uploads a vector of elements with the given dims.
    pub fn from_vec<E: Element>(data: Vec<E>, dims: &[usize], device: &B::Device) -> Result<Self> {
        Self::from_host(E::into_host(data), dims, device)
    }

    /// A tensor of `dims` filled with `value`.
    pub fn full(dims: &[usize], value: f64, dtype: DType, device: &B::Device) -> Result<Self> {
        Eager::<B>::new(device.clone()).full(dims.to_vec(), value, dtype)
    }

    /// A tensor of zeros.
    pub fn zeros(dims: &[usize], dtype: DType, device: &B::Device) -> Result<Self> {
        Self::full(dims, 0.0, dtype, device)
    }

    /// Seeded random values (identical on every backend for the same seed).
    pub fn rand(
        dims: &[usize],
        dist: RandDist,
        seed: u64,
        dtype: DType,
        device: &B::Device,
    ) -> Result<Self> {
        Eager::<B>::new(device.clone()).rand(dims.to_vec(), dist, seed, dtype)
    }

    /// The elements in row-major order, on the host.
    pub fn to_host(&self) -> Result<HostData> {
        B::download(&self.storage, &self.layout)
    }

    /// The elements as a vector of `E` (an error if the dtype is not `E`'s).
    pub fn to_vec<E: Element>(&self) -> Result<Vec<E>> {
        if self.dtype != E::DTYPE {
            return Err(Error::dtype(
                "to_vec",
                format!("the tensor holds {}, not {}", self.dtype, E::DTYPE),
            ));
        }
        Ok(E::from_host(self.to_host()?).expect("download returns the storage dtype"))
    }

    /// Every element converted to f64.
    pub fn to_f64_vec(&self) -> Result<Vec<f64>> {
        Ok(self.to_host()?.to_f64_vec())
    }

    /// The value of a one-element tensor as f64.
    pub fn scalar_value(&self) -> Result<f64> {
        if self.layout.numel() != 1 {
            return Err(Error::shape(
                "scalar_value",
                format!("shape {} is not one element", self.dims()),
            ));
        }
        Ok(self.to_f64_vec()?[0])
    }

    /// The dims.
    pub fn dims(&self) -> &Dims {
        self.layout.dims()
    }

    /// The rank.
    pub fn rank(&self) -> usize {
        self.layout.rank()
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.layout.numel()
    }

    /// The dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The device.
    pub fn device(&self) -> &B::Device {
        &self.device
    }

    /// The layout over the storage.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The storage buffer (shared between views).
    pub fn storage(&self) -> &Arc<B::Storage> {
        &self.storage
    }

    /// The dims and dtype, as shape rules see them.
    pub fn meta(&self) -> TensorMeta {
        TensorMeta::new(self.dims().to_vec(), self.dtype)
    }

    /// This tensor as an op input.
    pub fn view(&self) -> View<'_, B> {
        View {
            storage: &self.storage,
            layout: self.layout,
        }
    }

    /// The same tensor with a contiguous layout (copies only when needed).
    pub fn contiguous(&self) -> Result<Self> {
        if self.layout.is_contiguous() {
            return Ok(self.clone());
        }
        let s = B::contiguous(&self.device, self.view())?;
        RawTensor::from_storage(s, *self.dims(), self.device.clone())
    }

    fn with_layout(&self, layout: Layout) -> Self {
        RawTensor {
            storage: self.storage.clone(),
            layout,
            dtype: self.dtype,
            device: self.device.clone(),
        }
    }

    /// Applies one primitive op to `self` and `others` (after `self`).
    pub fn apply(&self, op: Op, others: &[&RawTensor<B>]) -> Result<Self> {
        let mut inputs = Vec::with_capacity(others.len() + 1);
        inputs.push(self);
        inputs.extend_from_slice(others);
        Eager::<B>::new(self.device.clone()).apply(op, &inputs)
    }

    /// A copy in a buffer of its own (even when this tensor is contiguous already).
    pub fn deep_copy(&self) -> Result<Self> {
        let storage = B::contiguous(&self.device, self.view())?;
        RawTensor::from_storage(storage, *self.dims(), self.device.clone())
    }

    /// The buffer itself, when this tensor is its sole owner and views all of it in
    /// order (a backend handing an op's result back); else a copy of its elements in
    /// order.
    pub fn into_storage(mut self) -> Result<B::Storage> {
        let whole = self.layout.is_contiguous()
            && self.layout.offset() == 0
            && self.layout.numel() == B::storage_len(&self.storage);
        if whole {
            match Arc::try_unwrap(self.storage) {
                Ok(storage) => return Ok(storage),
                Err(shared) => self.storage = shared,
            }
        }
        B::contiguous(&self.device, self.view())
    }

    /// The buffer, for writing in place: only when this tensor is its sole owner and
    /// views all of it in order (so a write changes this tensor and nothing else).
    pub fn storage_mut(&mut self) -> Option<&mut B::Storage> {
        let whole = self.layout.is_contiguous()
            && self.layout.offset() == 0
            && self.layout.numel() == B::storage_len(&self.storage);
        if whole {
            Arc::get_mut(&mut self.storage)
        } else {
            None
        }
    }

    /// A builder on this tensor's device, for composites: `x.ops().softmax(&x, 1)`.
    pub fn ops(&self) -> Eager<B> {
        Eager::new(self.device.clone())
    }
}

/// Fits views to what an op's kernel receives under the `Backend::execute` contract:
/// elementwise inputs broadcast to the output's dims, matmul batch dims broadcast to
/// the output's, every other op's inputs as they are. In place, so callers that keep
/// views on the stack allocate nothing.
pub fn fit_views<B: Backend>(op: &Op, views: &mut [View<'_, B>], out_dims: &Dims) -> Result<()> {
    match op.class() {
        OpClass::Elementwise => {
            for v in views.iter_mut() {
                if v.layout.dims() != out_dims {
                    v.layout = v.layout.broadcast_to(out_dims)?;
                }
            }
        }
        // The int8 product takes its operands as they are (a weight is never broadcast).
        OpClass::Contraction if matches!(op, Op::MatMul) => {
            for v in views.iter_mut() {
                v.layout = fit_product_operand(v.layout, out_dims)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// A float product's operand `layout` broadcast over the batch dims of its result
/// `out_dims` (its own last two dims kept).
pub fn fit_product_operand(layout: Layout, out_dims: &Dims) -> Result<Layout> {
    let (r, d) = (out_dims.rank(), layout.dims());
    let mut target = *out_dims;
    target.as_mut_slice()[r - 2] = d[d.rank() - 2];
    target.as_mut_slice()[r - 1] = d[d.rank() - 1];
    match *d == target {
        true => Ok(layout),
        false => layout.broadcast_to(&target),
    }
}

/// The builder that runs each op immediately on backend `B`.
#[derive(Clone, Debug)]
pub struct Eager<B: Backend> {
    device: B::Device,
}

impl<B: Backend> Eager<B> {
    /// An eager executor on `device`.
    pub fn new(device: B::Device) -> Self {
        Eager { device }
    }

    /// The device ops run on.
    pub fn device(&self) -> &B::Device {
        &self.device
    }
}

impl<B: Backend> Builder for Eager<B> {
    type Dim = usize;
    type Value = RawTensor<B>;

    fn meta(&self, v: &RawTensor<B>) -> TensorMeta {
        v.meta()
    }

    #[inline(never)]
    fn apply(&mut self, op: Op, inputs: &[&RawTensor<B>]) -> Result<RawTensor<B>> {
        let metas: Vec<TensorMeta> = inputs.iter().map(|t| t.meta()).collect();
        let meta_refs: Vec<&TensorMeta> = metas.iter().collect();
        let out = op.infer_sizes(&meta_refs)?;
        for t in inputs {
            if t.device != self.device {
                return Err(Error::DeviceMismatch {
                    op: op.name(),
                    lhs: B::device_name(&self.device),
                    rhs: B::device_name(&t.device),
                });
            }
        }
        let out_dims = Dims::new(&out.dims)?;
        // Views: layout changes only.
        match &op {
            Op::Reshape { .. } => {
                let x = inputs[0];
                return match x.layout.reshape(&out_dims) {
                    Some(l) => Ok(x.with_layout(l)),
                    None => {
                        let c = x.contiguous()?;
                        let l = c
                            .layout
                            .reshape(&out_dims)
                            .expect("a contiguous layout reshapes");
                        Ok(c.with_layout(l))
                    }
                };
            }
            Op::Permute { perm } => {
                return Ok(inputs[0].with_layout(inputs[0].layout.permute(perm)?))
            }
            Op::Expand { .. } => {
                return Ok(inputs[0].with_layout(inputs[0].layout.broadcast_to(&out_dims)?))
            }
            Op::Slice {
                axis,
                start,
                end,
                step,
            } => {
                return Ok(
                    inputs[0].with_layout(inputs[0].layout.slice(*axis, *start, *end, *step)?)
                )
            }
            _ => {}
        }
        let mut views: Vec<View<'_, B>> = inputs.iter().map(|t| t.view()).collect();
        fit_views(&op, &mut views, &out_dims)?;
        let storage = B::execute(&self.device, &op, &views, &out)?;
        RawTensor::from_storage(storage, out_dims, self.device.clone())
    }
}

impl<B: Backend> RawTensor<B> {
    crate::tensor_methods!();
}
