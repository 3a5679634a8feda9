//! Your own image folder: one sub-folder per class (`root/<class>/<image>`, PNG, JPEG
//! or PGM, any size), trained into a small convolutional classifier by the `Learner`,
//! which prints a line per epoch (loss, throughput, held-out accuracy and F1, the time
//! left) and keeps a training state to resume from.
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
use kiln::train::learner::Learner;
use kiln::train::metrics::{Accuracy, Averaged, ClassCounts};
use kiln::train::optim::{AdamW, AdamWConfig};
use kiln::train::schedule::CosineWithWarmup;
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

/// Trains on the images under `train_dir` for `epochs` and evaluates on `test_dir`
/// after each epoch, saving a training state to `state` (and resuming from it) when
/// given one.
pub fn train_folder(
    train_dir: &Path,
    test_dir: &Path,
    epochs: u64,
    state: Option<&Path>,
) -> Result<Report> {
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
    let test = DataLoader::new(test, config.for_evaluation())?;

    let total = epochs * train.batches_per_epoch() as u64;
    let model = FashionCnn::<Cpu>::init(&CpuDevice, 1)?;
    let mut learner = Learner::new(model, AdamW::new(AdamWConfig::default())?, CpuDevice)
        .epochs(epochs)
        .schedule(CosineWithWarmup::new(3e-3, 1e-4, total / 10, total)?)
        .metric(Accuracy::accuracy())
        .metric(ClassCounts::new(Averaged::F1));
    if let Some(path) = state {
        learner = learner.state_file(path);
    }
    let reports = learner.fit(&train, Some(&test))?;
    let last = reports.last().expect("at least one epoch");
    Ok(Report {
        classes,
        loss: last.train_loss,
        accuracy: last.metrics[0].1,
        f1: last.metrics[1].1,
    })
}

fn main() {
    let mut args = std::env::args().skip(1);
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/data/fashion-folder");
    let train = args.next().map_or_else(|| data.join("train"), Into::into);
    let test = args.next().map_or_else(|| data.join("test"), Into::into);
    let state = std::env::temp_dir().join("kiln-own-image-folder.state.safetensors");
    // A fresh run each time; keep the file to resume an interrupted one instead.
    let _ = std::fs::remove_file(&state);
    match train_folder(&train, &test, 8, Some(&state)) {
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
