//! Your own image folder: one sub-folder per class (`root/<class>/<image>`, PNG, JPEG
//! or PGM, any size), trained into a small convolutional classifier and evaluated on a
//! second folder of the same classes.
//!
//! ```text
//! cargo run --release --example own_image_folder      # examples/data/fashion-folder
//! cargo run --release --example own_image_folder -- train_dir test_dir
//! ```
//!
//! Images are read as one grey channel, resized to 28×28 and normalised; the model's
//! input is `Tensor<Dyn, 1, 28, 28>` and its class count a size in its type.

use kiln::cpu::{Cpu, CpuDevice};
use kiln::data::{Channels, DataLoader, ImageFolder, ImageFolderConfig, LoaderConfig};
use kiln::prelude::*;
use kiln::train::metrics::{Accuracy, Averaged, ClassCounts, Metric, Outputs};
use kiln::train::optim::{AdamW, AdamWConfig, Optimizer};
use kiln::train::schedule::{CosineWithWarmup, Schedule};
use std::path::Path;

/// A small convolutional network for 28×28 grey images of `CLASSES` classes.
#[model]
pub struct SmallCnn<const CLASSES: usize> {
    conv: Conv2d<1, 16, 5, 1, 2>,
    pool: MaxPool2d<2>,
    fc1: Linear<3136, 64>,
    fc2: Linear<64, CLASSES>,
}

#[model]
impl SmallCnn {
    /// Class scores of a batch of images.
    pub fn forward(&self, x: Tensor<Dyn, 1, 28, 28>) -> Tensor<Dyn, CLASSES> {
        let h = self.pool(self.conv(x).relu());
        self.fc2(self.fc1(h.flatten()).relu())
    }

    /// Mean cross-entropy against the images' classes.
    pub fn loss(&self, x: Tensor<Dyn, 1, 28, 28>, y: Tensor<Dyn, i32>) -> Tensor {
        self.forward(x).cross_entropy(y)
    }
}

/// The model for the ten Fashion-MNIST classes.
#[model]
pub type FashionCnn = SmallCnn<10>;

/// What a run measured.
pub struct Report {
    /// The classes, in the order of their folders' names.
    pub classes: Vec<String>,
    /// The last epoch's mean training loss.
    pub loss: f64,
    /// Held-out accuracy.
    pub accuracy: f64,
    /// Held-out macro-averaged F1.
    pub f1: f64,
}

/// Trains on the images under `train_dir` for `epochs` and evaluates on `test_dir`.
pub fn train_folder(train_dir: &Path, test_dir: &Path, epochs: u64) -> Result<Report> {
    let dev = CpuDevice;
    let images = ImageFolderConfig {
        mean: vec![0.286],
        std: vec![0.353],
        ..ImageFolderConfig::new(28, 28, Channels::Grey)
    };
    let train = ImageFolder::open(train_dir, images.clone())?;
    let test = ImageFolder::open(test_dir, images)?;
    if test.classes() != train.classes() {
        return Err(Error::invalid(
            "own_image_folder",
            format!(
                "the test folder's classes {:?} differ from the training folder's {:?}",
                test.classes(),
                train.classes()
            ),
        ));
    }
    let classes = train.classes().to_vec();
    let config = LoaderConfig {
        batch_size: 32,
        seed: 3,
        ..LoaderConfig::default()
    };
    let train = DataLoader::new(train, config)?;
    let test = DataLoader::new(
        test,
        LoaderConfig {
            shuffle: false,
            ..config
        },
    )?;

    let mut model = FashionCnn::<Cpu>::init(&dev, 1)?;
    let mut opt = AdamW::<Cpu>::new(AdamWConfig::default())?;
    let total = epochs * train.batches_per_epoch() as u64;
    let schedule = CosineWithWarmup::new(3e-3, 1e-4, total / 10, total)?;
    let (mut step, mut loss) = (0, f64::NAN);
    for epoch in 0..epochs {
        let (mut sum, mut n) = (0.0, 0);
        for batch in train.epoch(epoch) {
            let batch = batch?.to_device::<Cpu>(&dev)?;
            opt.set_lr(schedule.lr_at(step))?;
            let (l, grads) = model.loss_and_grad(&batch.input_as()?, &batch.target_as()?)?;
            opt.step(&mut model, &grads)?;
            sum += l.to_vec()?[0] as f64;
            n += 1;
            step += 1;
        }
        loss = sum / n as f64;
    }
    let mut accuracy = Accuracy::<Cpu>::accuracy();
    let mut f1 = ClassCounts::<Cpu>::new(Averaged::F1);
    for batch in test.epoch(0) {
        let batch = batch?.to_device::<Cpu>(&dev)?;
        let scores = model.forward(&batch.input_as()?)?;
        let outputs = Outputs {
            scores: Some(scores.raw()),
            targets: Some(&batch.target),
            loss: None,
        };
        accuracy.update(&outputs)?;
        f1.update(&outputs)?;
    }
    Ok(Report {
        classes,
        loss,
        accuracy: accuracy.value()?,
        f1: f1.value()?,
    })
}

fn main() {
    let mut args = std::env::args().skip(1);
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/data/fashion-folder");
    let train = args.next().map_or_else(|| data.join("train"), Into::into);
    let test = args.next().map_or_else(|| data.join("test"), Into::into);
    match train_folder(&train, &test, 8) {
        Ok(r) => println!(
            "{} classes; last epoch's loss {:.4}; held-out accuracy {:.1}%, macro F1 {:.3}",
            r.classes.len(),
            r.loss,
            r.accuracy * 100.0,
            r.f1
        ),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
