//! Gradients on the dynamic path: [`LazyTensor::backward`] walks the recorded graph
//! from a scalar back to the tensors that require gradients, applying the same
//! vector-Jacobian rules (`kiln_autodiff::vjp`) the `#[model]` macro applies at build
//! time, but recording them as lazy ops: the backward graph is planned and fused with
//! what is still pending of the forward one, in one program.

use crate::jit::eval;
use crate::lazy::{Kind, Lazy, LazyTensor};
use kiln_autodiff::vjp;
use kiln_tensor::{Backend, BuilderExt, Error, RawTensor, Result};
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

/// Gradients of the tensors that require them, by [`LazyTensor::id`].
pub struct Gradients<B: Backend> {
    by_id: HashMap<u64, RawTensor<B>>,
}

impl<B: Backend> Default for Gradients<B> {
    fn default() -> Self {
        Gradients {
            by_id: HashMap::default(),
        }
    }
}

impl<B: Backend> std::fmt::Debug for Gradients<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Gradients({} tensors)", self.by_id.len())
    }
}

impl<B: Backend> Gradients<B> {
    /// The gradient of `t` (`None` when the loss does not depend on it).
    pub fn get(&self, t: &LazyTensor<B>) -> Option<&RawTensor<B>> {
        self.by_id.get(&t.id())
    }

    /// The gradient of the tensor with id `id`.
    pub fn get_id(&self, id: u64) -> Option<&RawTensor<B>> {
        self.by_id.get(&id)
    }

    /// How many tensors have a gradient.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether none has.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// Adds `other`'s gradients to these, summing those of the same tensor (a module
    /// called twice in one pass).
    pub fn accumulate(&mut self, other: Gradients<B>) -> Result<()> {
        for (id, g) in other.by_id {
            let total = match self.by_id.remove(&id) {
                Some(prev) => prev.add(&g)?,
                None => g,
            };
            self.by_id.insert(id, total);
        }
        Ok(())
    }
}

impl<B: Backend> LazyTensor<B> {
    /// The gradients of this one-element tensor with respect to every tensor it depends
    /// on that requires gradients. The loss and the gradients are computed together, in
    /// one planned program with what is pending of the forward pass; then the graph
    /// behind the loss is released (PyTorch's `retain_graph=False`).
    pub fn backward(&self) -> Result<Gradients<B>> {
        if self.numel() != 1 {
            return Err(Error::shape(
                "backward",
                format!(
                    "the loss must have one element, not {}",
                    kiln_tensor::op::fmt_dims(self.dims())
                ),
            ));
        }
        let seed = LazyTensor::full(self.dims(), 1.0, self.dtype(), self.device())?;
        self.backward_from(seed)
    }

    /// The reverse pass from this tensor with incoming gradient `seed` (same dims).
    pub fn backward_from(&self, seed: LazyTensor<B>) -> Result<Gradients<B>> {
        if seed.dims() != self.dims() {
            return Err(Error::shape(
                "backward",
                format!(
                    "the seed gradient {} does not match the output {}",
                    kiln_tensor::op::fmt_dims(seed.dims()),
                    kiln_tensor::op::fmt_dims(self.dims())
                ),
            ));
        }
        if !self.requires_grad() {
            return Err(Error::invalid(
                "backward",
                "the tensor does not depend on anything that requires gradients",
            ));
        }
        let leaves = {
            let order = graph_order(self);
            let mut b = Lazy::new(self.device().clone());
            let mut grads: HashMap<u64, LazyTensor<B>> = HashMap::default();
            grads.insert(self.id(), seed);
            let mut leaves: Vec<(u64, LazyTensor<B>)> = Vec::new();
            for t in order.iter().rev() {
                let Some(g) = grads.remove(&t.id()) else {
                    continue;
                };
                let inputs = t.state().inputs.clone();
                match &t.0.kind {
                    Kind::Source => leaves.push((t.id(), g)),
                    Kind::RecipDim(_) => {}
                    Kind::Op(op) => {
                        let xs: Vec<&LazyTensor<B>> = inputs.iter().collect();
                        let input_grads = vjp(&mut b, op, &xs, t, &g)?;
                        for (x, ig) in inputs.iter().zip(input_grads) {
                            let Some(ig) = ig else { continue };
                            if !x.requires_grad() {
                                continue;
                            }
                            // A value used more than once sums the gradients of its uses.
                            let total = match grads.remove(&x.id()) {
                                Some(prev) => b.add(&prev, &ig)?,
                                None => ig,
                            };
                            grads.insert(x.id(), total);
                        }
                    }
                }
            }
            leaves
        };
        // The walk's handles are gone: only the loss and the gradients are outputs.
        let mut targets: Vec<&LazyTensor<B>> = vec![self];
        targets.extend(leaves.iter().map(|(_, g)| g));
        eval(&targets)?;
        let mut by_id = HashMap::default();
        for (id, g) in leaves {
            by_id.insert(id, g.value()?);
        }
        release_graph(self);
        Ok(Gradients { by_id })
    }
}

/// The nodes behind `t` that require gradients, inputs before the nodes that use them.
fn graph_order<B: Backend>(t: &LazyTensor<B>) -> Vec<LazyTensor<B>> {
    let mut order = Vec::new();
    let mut seen = HashSet::default();
    let mut stack = vec![(t.clone(), false)];
    while let Some((t, expanded)) = stack.pop() {
        if expanded {
            order.push(t);
            continue;
        }
        if !seen.insert(t.id()) {
            continue;
        }
        let inputs = t.state().inputs.clone();
        stack.push((t, true));
        for x in inputs.into_iter().rev() {
            if x.requires_grad() && !seen.contains(&x.id()) {
                stack.push((x, false));
            }
        }
    }
    order
}

/// Drops the links of the computed nodes behind `t`, so the forward pass's values are
/// freed once nothing else holds them.
fn release_graph<B: Backend>(t: &LazyTensor<B>) {
    let mut stack = vec![t.clone()];
    while let Some(t) = stack.pop() {
        let mut state = t.state();
        if state.value.is_some() {
            stack.extend(std::mem::take(&mut state.inputs));
        }
    }
}

/// Runs `f` and returns its one-element result with the gradients of everything it
/// depends on that requires gradients (JAX's `value_and_grad`, over a closure).
pub fn value_and_grad<B: Backend>(
    f: impl FnOnce() -> Result<LazyTensor<B>>,
) -> Result<(LazyTensor<B>, Gradients<B>)> {
    let loss = f()?;
    let grads = loss.backward()?;
    Ok((loss, grads))
}
