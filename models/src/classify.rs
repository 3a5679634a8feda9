//! Training and evaluating image classifiers: the `Classifier` trait the zoo's models
//! implement (their generated `loss_and_grad` and `forward` with a batch of `BATCH`),
//! and generic loops over a data split.

use crate::data::{batches, shuffled, Split};
use crate::lenet::LeNet;
use crate::mlp::Mlp;
use kiln::prelude::*;
use kiln::tensor::nn::Module;
use kiln::train::optim::Optimizer;
use kiln::train::schedule::Schedule;

/// An image classifier over batches of `BATCH` examples.
pub trait Classifier<B: Backend, const BATCH: usize>: Module<B> {
    /// The input shape of one batch.
    type Input: Shape;
    /// The loss and the gradients of a batch (training mode).
    fn loss_and_grad(
        &self,
        x: &Tensor<B, Self::Input>,
        y: &Tensor<B, (Const<BATCH>,), i32>,
    ) -> Result<(Tensor<B, ()>, Self::Grads)>;
    /// Class logits of a batch (evaluation mode).
    fn logits(&self, x: &Tensor<B, Self::Input>) -> Result<Tensor<B, (Const<BATCH>, Const<10>)>>;
}

impl<B: Backend, const BATCH: usize> Classifier<B, BATCH> for Mlp<B> {
    type Input = (Const<BATCH>, Const<784>);
    fn loss_and_grad(
        &self,
        x: &Tensor<B, Self::Input>,
        y: &Tensor<B, (Const<BATCH>,), i32>,
    ) -> Result<(Tensor<B, ()>, Self::Grads)> {
        Mlp::loss_and_grad(self, x, y)
    }
    fn logits(&self, x: &Tensor<B, Self::Input>) -> Result<Tensor<B, (Const<BATCH>, Const<10>)>> {
        self.forward(x)
    }
}

impl<B: Backend, const BATCH: usize> Classifier<B, BATCH> for LeNet<B> {
    type Input = (Const<BATCH>, Const<1>, Const<28>, Const<28>);
    fn loss_and_grad(
        &self,
        x: &Tensor<B, Self::Input>,
        y: &Tensor<B, (Const<BATCH>,), i32>,
    ) -> Result<(Tensor<B, ()>, Self::Grads)> {
        LeNet::loss_and_grad(self, x, y)
    }
    fn logits(&self, x: &Tensor<B, Self::Input>) -> Result<Tensor<B, (Const<BATCH>, Const<10>)>> {
        self.forward(x)
    }
}

/// Uploads a batch of images in the classifier's input shape.
pub fn images<B: Backend, S: Shape>(pixels: Vec<f32>, device: &B::Device) -> Result<Tensor<B, S>> {
    let dims = S::static_dims()
        .ok_or_else(|| Error::invalid("images", "classifier inputs have static shapes"))?;
    Tensor::from_vec(pixels, &dims, device)
}

/// What one training step reports.
#[derive(Clone, Copy, Debug)]
pub struct StepReport {
    /// The epoch (from 0).
    pub epoch: usize,
    /// The global step (from 0).
    pub step: u64,
    /// The batch's loss.
    pub loss: f32,
    /// The learning rate used.
    pub lr: f64,
}

/// Trains for `epochs` over `train` in shuffled batches of `BATCH` (a final partial
/// batch is dropped), setting the learning rate from `schedule` before each step.
#[allow(clippy::too_many_arguments)]
pub fn fit<B: Backend, M: Classifier<B, BATCH>, const BATCH: usize>(
    model: &mut M,
    opt: &mut impl Optimizer<B>,
    schedule: &dyn Schedule,
    train: &Split,
    epochs: usize,
    seed: u64,
    device: &B::Device,
    mut on_step: impl FnMut(&M, StepReport) -> Result<()>,
) -> Result<()> {
    let mut step = 0u64;
    for epoch in 0..epochs {
        let order = shuffled(train.len(), seed, epoch as u64);
        for b in batches(train, &order, BATCH) {
            if b.labels.len() < BATCH {
                continue;
            }
            let x = images::<B, M::Input>(b.images, device)?;
            let y = Tensor::from_vec(b.labels, &[BATCH], device)?;
            let lr = schedule.lr_at(step);
            opt.set_lr(lr)?;
            let (loss, grads) = model.loss_and_grad(&x, &y)?;
            opt.step(model, &grads)?;
            on_step(
                model,
                StepReport {
                    epoch,
                    step,
                    loss: loss.to_vec()?[0],
                    lr,
                },
            )?;
            step += 1;
        }
    }
    Ok(())
}

/// The fraction of `split` classified correctly, in batches of `BATCH` (the last one
/// padded with copies of its first example, whose predictions are ignored).
pub fn accuracy<B: Backend, M: Classifier<B, BATCH>, const BATCH: usize>(
    model: &M,
    split: &Split,
    device: &B::Device,
) -> Result<f64> {
    let order: Vec<usize> = (0..split.len()).collect();
    let mut correct = 0usize;
    for b in batches(split, &order, BATCH) {
        let n = b.labels.len();
        let mut px = b.images;
        let first: Vec<f32> = px[..split.pixels].to_vec();
        for _ in n..BATCH {
            px.extend_from_slice(&first);
        }
        let x = images::<B, M::Input>(px, device)?;
        let pred = model.logits(&x)?.argmax::<1>()?.to_vec()?;
        correct += pred.iter().zip(&b.labels).filter(|(p, l)| p == l).count();
    }
    Ok(correct as f64 / split.len().max(1) as f64)
}
