//! An MLP on the dynamic path: parameters are plain tensors, the forward pass runs on
//! a `Tape`, gradients come from the tape and SGD with momentum updates in place. It
//! is the baseline the `#[model]` path is measured against.

use crate::data::{batches, Split};
use kiln::autodiff::{Tape, Var};
use kiln::tensor::{Backend, BuilderExt, DType, RandDist, RawTensor, Result};

/// One layer's (weight, bias) leaves on a tape.
type LayerVars<B> = (Var<B>, Var<B>);

/// A multi-layer perceptron with ReLU between layers, PyTorch's parameter layout.
pub struct DynamicMlp<B: Backend> {
    /// `(weight [out, in], bias [out])` per layer.
    pub layers: Vec<(RawTensor<B>, RawTensor<B>)>,
    velocity: Vec<(RawTensor<B>, RawTensor<B>)>,
}

impl<B: Backend> DynamicMlp<B> {
    /// Layers of the given widths (`[784, 128, 10]`), Kaiming-uniform initialised like
    /// PyTorch's `nn.Linear` (bound 1/√fan_in for weights and biases).
    pub fn new(widths: &[usize], seed: u64, device: &B::Device) -> Result<Self> {
        let mut layers = Vec::new();
        let mut velocity = Vec::new();
        for (i, w) in widths.windows(2).enumerate() {
            let bound = 1.0 / (w[0] as f64).sqrt();
            let dist = RandDist::Uniform {
                low: -bound,
                high: bound,
            };
            let s = seed.wrapping_add(2 * i as u64);
            layers.push((
                RawTensor::rand(&[w[1], w[0]], dist, s, DType::F32, device)?,
                RawTensor::rand(&[w[1]], dist, s + 1, DType::F32, device)?,
            ));
            velocity.push((
                RawTensor::zeros(&[w[1], w[0]], DType::F32, device)?,
                RawTensor::zeros(&[w[1]], DType::F32, device)?,
            ));
        }
        Ok(DynamicMlp { layers, velocity })
    }

    /// Logits of a batch, recorded on `tape`; returns the parameter leaves too.
    fn forward_on(&self, tape: &mut Tape<B>, x: Var<B>) -> Result<(Var<B>, Vec<LayerVars<B>>)> {
        let mut h = x;
        let mut leaves = Vec::new();
        for (i, (w, b)) in self.layers.iter().enumerate() {
            let (w, b) = (tape.leaf(w.clone()), tape.leaf(b.clone()));
            h = tape.linear(&h, &w, Some(&b))?;
            if i + 1 < self.layers.len() {
                h = tape.relu(&h)?;
            }
            leaves.push((w, b));
        }
        Ok((h, leaves))
    }

    /// Logits of a batch (no tape kept).
    pub fn forward(&self, x: &RawTensor<B>) -> Result<RawTensor<B>> {
        let mut tape = Tape::new(x.device().clone());
        let xv = tape.constant(x.clone());
        Ok(self.forward_on(&mut tape, xv)?.0.value().clone())
    }

    /// One SGD step with momentum on a batch; returns the loss.
    pub fn train_step(
        &mut self,
        x: &RawTensor<B>,
        y: &RawTensor<B>,
        lr: f64,
        momentum: f64,
    ) -> Result<f64> {
        let mut tape = Tape::new(x.device().clone());
        let xv = tape.constant(x.clone());
        let yv = tape.constant(y.clone());
        let (logits, leaves) = self.forward_on(&mut tape, xv)?;
        let loss = tape.cross_entropy(&logits, &yv, 0.0)?;
        let grads = tape.gradients(&loss)?;
        for ((param, vel), leaf) in self.layers.iter_mut().zip(&mut self.velocity).zip(&leaves) {
            for (p, v, l) in [
                (&mut param.0, &mut vel.0, &leaf.0),
                (&mut param.1, &mut vel.1, &leaf.1),
            ] {
                let g = grads.get_or_zeros(l)?;
                *v = v.mul_scalar(momentum)?.add(&g)?;
                *p = p.sub(&v.mul_scalar(lr)?)?;
            }
        }
        loss.value().scalar_value()
    }

    /// Test accuracy over a split, in batches.
    pub fn accuracy(&self, split: &Split, batch: usize, device: &B::Device) -> Result<f64> {
        let order: Vec<usize> = (0..split.len()).collect();
        let mut correct = 0usize;
        for b in batches(split, &order, batch) {
            let n = b.labels.len();
            let x = RawTensor::from_vec(b.images, &[n, split.pixels], device)?;
            let pred = self.forward(&x)?.argmax(1, false)?.to_vec::<i32>()?;
            correct += pred.iter().zip(&b.labels).filter(|(p, l)| p == l).count();
        }
        Ok(correct as f64 / split.len().max(1) as f64)
    }
}
