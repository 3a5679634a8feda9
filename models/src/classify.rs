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

/// What [`short_mnist_run`] leaves: the trained MLP, the loss of every step and the
/// test accuracy.
pub struct ShortRun<B: Backend> {
    /// The trained model.
    pub model: Mlp<B>,
    /// The training loss of each step, in order.
    pub losses: Vec<f32>,
    /// The fraction of the 10,000 test images classified right.
    pub accuracy: f64,
}

impl<B: Backend> ShortRun<B> {
    /// Whether the run learned: at least 95% test accuracy, and the mean loss of the
    /// last 20 steps under a quarter of the first 20's. The reason, if not.
    pub fn learned(&self) -> std::result::Result<(), String> {
        if self.losses.len() < 40 {
            return Err(format!("only {} steps ran", self.losses.len()));
        }
        let early: f32 = self.losses[..20].iter().sum::<f32>() / 20.0;
        let late: f32 = self.losses[self.losses.len() - 20..].iter().sum::<f32>() / 20.0;
        if late >= early / 4.0 {
            return Err(format!("the loss fell from {early} to only {late}"));
        }
        if self.accuracy < 0.95 {
            return Err(format!(
                "test accuracy {} after {} steps",
                self.accuracy,
                self.losses.len()
            ));
        }
        Ok(())
    }
}

/// The short MNIST recipe every backend's test suite runs: the MLP (784-1024-1024-10,
/// seed 1), one pass over the first 20,000 training images in batches of 64, SGD
/// (momentum 0.9) under a cosine schedule from 0.05 with 50 warm-up steps, then the
/// test accuracy.
pub fn short_mnist_run<B: Backend>(device: &B::Device) -> Result<ShortRun<B>> {
    use crate::data::ImageDataset;
    use kiln::train::optim::{Sgd, SgdConfig};
    use kiln::train::schedule::CosineWithWarmup;
    let mut data = ImageDataset::mnist()?;
    data.train = data.train.take(20_000);
    let mut model = Mlp::<B>::init(device, 1)?;
    let mut opt = Sgd::<B>::new(SgdConfig {
        lr: 0.05,
        momentum: 0.9,
        ..SgdConfig::default()
    })?;
    let steps = (data.train.len() / 64) as u64;
    let schedule = CosineWithWarmup::new(0.05, 0.0005, 50, steps)?;
    let mut losses = Vec::new();
    fit::<B, Mlp<B>, 64>(
        &mut model,
        &mut opt,
        &schedule,
        &data.train,
        1,
        1,
        device,
        |_, r| {
            losses.push(r.loss);
            Ok(())
        },
    )?;
    let accuracy = accuracy::<B, Mlp<B>, 500>(&model, &data.test, device)?;
    Ok(ShortRun {
        model,
        losses,
        accuracy,
    })
}
