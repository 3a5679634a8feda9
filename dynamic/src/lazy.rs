//! Lazy tensors: each op is recorded into a graph of nodes instead of running, with
//! its dims and dtype derived at once by the op table's rules (so a shape mistake is
//! an error at the line that made it); a read ([`LazyTensor::to_vec`], a scalar) or an
//! explicit [`eval`](crate::eval) materialises what is pending through the run-time
//! planner ([`crate::jit`]).

use kiln_tensor::{
    Backend, Builder, BuilderExt, DType, Element, Error, Op, RandDist, RawTensor, Result,
    TensorMeta,
};
use std::cell::Cell;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// What computes a node.
#[derive(Clone, Debug)]
pub(crate) enum Kind {
    /// A value given from outside (data, a parameter).
    Source,
    /// A primitive op of the node's inputs.
    Op(Op),
    /// The rank-0 constant `1/n` for the size `n` (a mean's scale): kept apart from a
    /// plain constant so that a cached plan serves every `n`.
    RecipDim(usize),
}

/// What a node holds: its value once computed, and its inputs while they are needed
/// (to compute it, or for gradients).
pub(crate) struct State<B: Backend> {
    pub(crate) value: Option<RawTensor<B>>,
    pub(crate) inputs: Vec<LazyTensor<B>>,
}

pub(crate) struct Node<B: Backend> {
    pub(crate) id: u64,
    pub(crate) meta: TensorMeta,
    pub(crate) device: B::Device,
    pub(crate) kind: Kind,
    pub(crate) requires_grad: bool,
    /// A parameter's checkpoint name (`fc1.weight`), for anomaly mode's reports.
    pub(crate) name: Option<Arc<str>>,
    /// The layer whose forward pass recorded it (`fc1`), for anomaly mode's reports.
    pub(crate) layer: Option<Arc<str>>,
    pub(crate) state: Mutex<State<B>>,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(0);
thread_local! {
    static NO_GRAD: Cell<u32> = const { Cell::new(0) };
    static EAGER: Cell<bool> = const { Cell::new(false) };
    static LAYER: std::cell::RefCell<Option<Arc<str>>> = const { std::cell::RefCell::new(None) };
}

/// Runs `f` with the ops it records marked as layer `name`'s (a [`crate::Layer`]'s
/// forward pass), which anomaly mode's reports name.
pub(crate) fn in_layer<R>(name: &Arc<str>, f: impl FnOnce() -> R) -> R {
    let outer = LAYER.with(|l| l.replace(Some(name.clone())));
    struct Restore(Option<Arc<str>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let outer = self.0.take();
            LAYER.with(|l| *l.borrow_mut() = outer);
        }
    }
    let _restore = Restore(outer);
    f()
}

/// Runs every op this thread records as soon as it is recorded (one kernel per op, no
/// planning): the reference the lazy path is tested against, and a debugging aid (an
/// error of a kernel then surfaces at the op that launched it). Off by default.
pub fn set_eager(on: bool) {
    EAGER.with(|c| c.set(on));
}

/// Whether ops this thread records run at once (see [`set_eager`]).
pub fn eager() -> bool {
    EAGER.with(|c| c.get())
}

/// Runs `f` with gradient recording off on this thread: tensors it computes do not
/// require gradients and keep no inputs once computed (inference, evaluation).
pub fn no_grad<R>(f: impl FnOnce() -> R) -> R {
    NO_GRAD.with(|c| c.set(c.get() + 1));
    struct Restore;
    impl Drop for Restore {
        fn drop(&mut self) {
            NO_GRAD.with(|c| c.set(c.get() - 1));
        }
    }
    let _restore = Restore;
    f()
}

fn grad_enabled() -> bool {
    NO_GRAD.with(|c| c.get() == 0)
}

/// A tensor on the dynamic path: an op recorded over other lazy tensors, computed when
/// its value is read. Cloning is cheap (a shared node).
pub struct LazyTensor<B: Backend>(pub(crate) Arc<Node<B>>);

impl<B: Backend> Clone for LazyTensor<B> {
    fn clone(&self) -> Self {
        LazyTensor(self.0.clone())
    }
}

impl<B: Backend> fmt::Debug for LazyTensor<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = if self.is_computed() {
            "computed"
        } else {
            "pending"
        };
        write!(
            f,
            "LazyTensor#{}({} {}, {state})",
            self.0.id,
            kiln_tensor::op::fmt_dims(&self.0.meta.dims),
            self.0.meta.dtype
        )
    }
}

impl<B: Backend> LazyTensor<B> {
    pub(crate) fn new_node(
        meta: TensorMeta,
        device: B::Device,
        kind: Kind,
        requires_grad: bool,
        state: State<B>,
    ) -> Self {
        LazyTensor(Arc::new(Node {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            meta,
            device,
            kind,
            requires_grad,
            name: None,
            // Only anomaly mode's reports read it: no reference count touched otherwise.
            layer: if kiln_tensor::anomaly::detecting() {
                LAYER.with(|l| l.borrow().clone())
            } else {
                None
            },
            state: Mutex::new(state),
        }))
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, State<B>> {
        self.0.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A tensor holding `value` (no gradient).
    pub fn from_raw(value: RawTensor<B>) -> Self {
        Self::leaf(value, false)
    }

    /// A tensor holding `value`; with `requires_grad`, [`LazyTensor::backward`] gives
    /// its gradient (a parameter).
    pub fn leaf(value: RawTensor<B>, requires_grad: bool) -> Self {
        Self::new_node(
            value.meta(),
            value.device().clone(),
            Kind::Source,
            requires_grad,
            State {
                value: Some(value),
                inputs: Vec::new(),
            },
        )
    }

    /// [`LazyTensor::leaf`] with a name (a parameter's, `fc1.weight`), which anomaly
    /// mode's reports give for the values computed from it.
    pub fn named_leaf(value: RawTensor<B>, requires_grad: bool, name: &str) -> Self {
        let t = Self::leaf(value, requires_grad);
        let node = Arc::into_inner(t.0).expect("a new node has no other owner");
        LazyTensor(Arc::new(Node {
            name: Some(name.into()),
            ..node
        }))
    }

    /// The name a [`LazyTensor::named_leaf`] was given.
    pub fn name(&self) -> Option<&str> {
        self.0.name.as_deref()
    }

    /// The layer whose forward pass recorded this tensor, if one did while anomaly mode
    /// was on (the only reader of it).
    pub fn layer(&self) -> Option<&str> {
        self.0.layer.as_deref()
    }

    /// A tensor of host values with `dims`.
    pub fn from_vec<E: Element>(data: Vec<E>, dims: &[usize], device: &B::Device) -> Result<Self> {
        Ok(Self::from_raw(RawTensor::from_vec(data, dims, device)?))
    }

    /// `value` everywhere (recorded: it fuses into what reads it).
    pub fn full(dims: &[usize], value: f64, dtype: DType, device: &B::Device) -> Result<Self> {
        Lazy::new(device.clone()).full(dims.to_vec(), value, dtype)
    }

    /// Zeros (recorded).
    pub fn zeros(dims: &[usize], dtype: DType, device: &B::Device) -> Result<Self> {
        Self::full(dims, 0.0, dtype, device)
    }

    /// Seeded random values drawn from `dist` (recorded; the eager draw's values).
    pub fn rand(
        dims: &[usize],
        dist: RandDist,
        seed: u64,
        dtype: DType,
        device: &B::Device,
    ) -> Result<Self> {
        Lazy::new(device.clone()).rand(dims.to_vec(), dist, seed, dtype)
    }

    /// The dims.
    pub fn dims(&self) -> &[usize] {
        &self.0.meta.dims
    }

    /// The dtype.
    pub fn dtype(&self) -> DType {
        self.0.meta.dtype
    }

    /// The dims and dtype.
    pub fn meta(&self) -> &TensorMeta {
        &self.0.meta
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.0.meta.dims.iter().product()
    }

    /// The device.
    pub fn device(&self) -> &B::Device {
        &self.0.device
    }

    /// Whether gradients flow to this tensor.
    pub fn requires_grad(&self) -> bool {
        self.0.requires_grad
    }

    /// A key unique to this tensor (gradients are kept by it).
    pub fn id(&self) -> u64 {
        self.0.id
    }

    /// Whether its value is computed.
    pub fn is_computed(&self) -> bool {
        self.state().value.is_some()
    }

    /// A builder on this tensor's device, for composites: `x.ops().linear(&x, &w, None)`.
    pub fn ops(&self) -> Lazy<B> {
        Lazy::new(self.0.device.clone())
    }

    /// Its value, computing what is pending. Pending values that something else still
    /// holds are computed in the same program (they may be read next), each written out
    /// by its kernel: bind a chain's result before reading it (`let y = x.exp()?.neg()?;
    /// y.value()`), because the temporaries of `x.exp()?.neg()?.value()` live to the end
    /// of the statement and would split the chain into one kernel per op.
    pub fn value(&self) -> Result<RawTensor<B>> {
        if let Some(v) = &self.state().value {
            return Ok(v.clone());
        }
        crate::jit::eval(&[self])?;
        self.state()
            .value
            .clone()
            .ok_or_else(|| Error::invalid("eval", "a tensor was not computed by its plan"))
    }

    /// Its elements in row-major order (computing what is pending).
    pub fn to_vec<E: Element>(&self) -> Result<Vec<E>> {
        self.value()?.to_vec()
    }

    /// The value of a one-element tensor as f64 (computing what is pending).
    pub fn scalar_value(&self) -> Result<f64> {
        self.value()?.scalar_value()
    }

    /// The same value without a gradient (PyTorch's `detach`).
    pub fn detach(&self) -> Result<Self> {
        Ok(Self::from_raw(self.value()?))
    }

    kiln_tensor::tensor_methods!();
}

/// The builder that records ops as lazy tensors on a device. Composites written over
/// `Builder` (`linear`, `cross_entropy`, `layer_norm`…) work on it as on any other.
#[derive(Clone, Debug)]
pub struct Lazy<B: Backend> {
    device: B::Device,
}

impl<B: Backend> Lazy<B> {
    /// A builder on `device`.
    pub fn new(device: B::Device) -> Self {
        Lazy { device }
    }

    /// The device.
    pub fn device(&self) -> &B::Device {
        &self.device
    }

    fn check_device(&self, op: &Op, inputs: &[&LazyTensor<B>]) -> Result<()> {
        for x in inputs {
            if x.0.device != self.device {
                return Err(Error::invalid(
                    op.name(),
                    format!(
                        "an input is on {} but the op runs on {}",
                        B::device_name(&x.0.device),
                        B::device_name(&self.device)
                    ),
                ));
            }
        }
        Ok(())
    }

    fn record(
        &self,
        kind: Kind,
        meta: TensorMeta,
        inputs: &[&LazyTensor<B>],
    ) -> Result<LazyTensor<B>> {
        let requires_grad = grad_enabled() && inputs.iter().any(|x| x.0.requires_grad);
        let t = LazyTensor::new_node(
            meta,
            self.device.clone(),
            kind,
            requires_grad,
            State {
                value: None,
                inputs: inputs.iter().map(|&x| x.clone()).collect(),
            },
        );
        if eager() || kiln_tensor::anomaly::detecting() {
            crate::jit::eval_op_by_op(&t)?;
        }
        Ok(t)
    }
}

impl<B: Backend> Builder for Lazy<B> {
    type Dim = usize;
    type Value = LazyTensor<B>;

    fn apply(&mut self, op: Op, inputs: &[&LazyTensor<B>]) -> Result<LazyTensor<B>> {
        self.check_device(&op, inputs)?;
        let metas: Vec<&TensorMeta> = inputs.iter().map(|x| &x.0.meta).collect();
        let meta = op.infer(&metas)?;
        self.record(Kind::Op(op), meta, inputs)
    }

    fn meta(&self, v: &LazyTensor<B>) -> TensorMeta {
        v.0.meta.clone()
    }

    fn producer(&self, v: &LazyTensor<B>) -> Option<(Op, Vec<LazyTensor<B>>)> {
        match &v.0.kind {
            Kind::Op(op) => Some((op.clone(), v.state().inputs.clone())),
            _ => None,
        }
    }

    fn same_value(&self, a: &LazyTensor<B>, b: &LazyTensor<B>) -> bool {
        a.id() == b.id()
    }

    fn recip_dim(&mut self, like: &LazyTensor<B>, n: &usize) -> Result<LazyTensor<B>> {
        let meta = TensorMeta::new(vec![], like.0.meta.dtype);
        self.record(Kind::RecipDim(*n), meta, &[])
    }
}
