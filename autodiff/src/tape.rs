//! The runtime tape of the dynamic path: a `Builder` that runs every op eagerly and
//! records it, then walks the record backwards applying the rules of `rules`.

use crate::rules::vjp;
use kiln_tensor::{Backend, Builder, BuilderExt, Eager, Error, Op, RawTensor, Result, TensorMeta};
use std::collections::HashMap;

/// A value on a tape: its tensor and its position in the record.
pub struct Var<B: Backend> {
    id: usize,
    value: RawTensor<B>,
}

impl<B: Backend> Clone for Var<B> {
    fn clone(&self) -> Self {
        Var {
            id: self.id,
            value: self.value.clone(),
        }
    }
}

impl<B: Backend> std::fmt::Debug for Var<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Var#{}({:?})", self.id, self.value)
    }
}

impl<B: Backend> Var<B> {
    /// The tensor.
    pub fn value(&self) -> &RawTensor<B> {
        &self.value
    }

    /// The position on the tape (stable key for gradients).
    pub fn id(&self) -> usize {
        self.id
    }
}

enum Entry<B: Backend> {
    /// A tensor entered from outside; `trainable` leaves receive gradients.
    Leaf { trainable: bool },
    /// An op applied to earlier entries.
    Op {
        op: Op,
        inputs: Vec<usize>,
        values: Vec<RawTensor<B>>,
    },
}

/// Records ops as they run so gradients can be taken afterwards.
pub struct Tape<B: Backend> {
    eager: Eager<B>,
    entries: Vec<Entry<B>>,
    outputs: Vec<RawTensor<B>>,
}

impl<B: Backend> Tape<B> {
    /// An empty tape on `device`.
    pub fn new(device: B::Device) -> Self {
        Tape {
            eager: Eager::new(device),
            entries: Vec::new(),
            outputs: Vec::new(),
        }
    }

    fn push(&mut self, entry: Entry<B>, value: RawTensor<B>) -> Var<B> {
        self.entries.push(entry);
        self.outputs.push(value.clone());
        Var {
            id: self.entries.len() - 1,
            value,
        }
    }

    /// Enters a tensor that gradients are taken for (a parameter, an input).
    pub fn leaf(&mut self, value: RawTensor<B>) -> Var<B> {
        self.push(Entry::Leaf { trainable: true }, value)
    }

    /// Enters a tensor that gets no gradient (data, labels).
    pub fn constant(&mut self, value: RawTensor<B>) -> Var<B> {
        self.push(Entry::Leaf { trainable: false }, value)
    }

    /// The number of recorded entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is recorded.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Gradients of the one-element `loss` with respect to every trainable leaf it
    /// depends on, keyed by the leaf's `Var::id`.
    pub fn gradients(&self, loss: &Var<B>) -> Result<Gradients<B>> {
        let seed = RawTensor::full(
            loss.value.dims(),
            1.0,
            loss.value.dtype(),
            self.eager.device(),
        )?;
        self.backward(loss, seed)
    }

    /// Reverse pass from `output` with incoming gradient `seed` (same dims as output).
    pub fn backward(&self, output: &Var<B>, seed: RawTensor<B>) -> Result<Gradients<B>> {
        if seed.dims() != output.value.dims() {
            return Err(Error::shape(
                "backward",
                format!(
                    "the seed gradient {} does not match the output {}",
                    seed.dims(),
                    output.value.dims()
                ),
            ));
        }
        let mut eager = self.eager.clone();
        let mut grads: HashMap<usize, RawTensor<B>> = HashMap::new();
        grads.insert(output.id, seed);
        let mut leaves = HashMap::new();
        for id in (0..=output.id).rev() {
            let Some(g) = grads.remove(&id) else { continue };
            match &self.entries[id] {
                Entry::Leaf { trainable } => {
                    if *trainable {
                        leaves.insert(id, g);
                    }
                }
                Entry::Op { op, inputs, values } => {
                    let xs: Vec<&RawTensor<B>> = values.iter().collect();
                    let input_grads = vjp(&mut eager, op, &xs, &self.outputs[id], &g)?;
                    for (&input, ig) in inputs.iter().zip(input_grads) {
                        let Some(ig) = ig else { continue };
                        // A value used more than once sums the gradients of its uses.
                        let total = match grads.remove(&input) {
                            Some(prev) => eager.add(&prev, &ig)?,
                            None => ig,
                        };
                        grads.insert(input, total);
                    }
                }
            }
        }
        Ok(Gradients { by_id: leaves })
    }
}

impl<B: Backend> Builder for Tape<B> {
    type Dim = usize;
    type Value = Var<B>;

    fn apply(&mut self, op: Op, inputs: &[&Var<B>]) -> Result<Var<B>> {
        let values: Vec<RawTensor<B>> = inputs.iter().map(|v| v.value.clone()).collect();
        let refs: Vec<&RawTensor<B>> = values.iter().collect();
        let out = self.eager.apply(op.clone(), &refs)?;
        let ids = inputs.iter().map(|v| v.id).collect();
        Ok(self.push(
            Entry::Op {
                op,
                inputs: ids,
                values,
            },
            out,
        ))
    }

    fn meta(&self, v: &Var<B>) -> TensorMeta {
        v.value.meta()
    }
}

/// Gradients of trainable leaves, by `Var::id`.
pub struct Gradients<B: Backend> {
    by_id: HashMap<usize, RawTensor<B>>,
}

impl<B: Backend> Gradients<B> {
    /// The gradient of a leaf (`None` if the loss does not depend on it).
    pub fn get(&self, v: &Var<B>) -> Option<&RawTensor<B>> {
        self.by_id.get(&v.id)
    }

    /// The gradient of a leaf, zeros if the loss does not depend on it.
    pub fn get_or_zeros(&self, v: &Var<B>) -> Result<RawTensor<B>> {
        match self.by_id.get(&v.id) {
            Some(g) => Ok(g.clone()),
            None => RawTensor::zeros(v.value.dims(), v.value.dtype(), v.value.device()),
        }
    }
}
