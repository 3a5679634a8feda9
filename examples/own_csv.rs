//! Your own CSV file: a table of numeric columns and a label column, trained into a
//! classifier by the `Learner` and evaluated on a held-out part after each epoch.
//!
//! ```text
//! cargo run --release --example own_csv                      # examples/data/iris.csv
//! cargo run --release --example own_csv -- data.csv label    # a file and its label column
//! ```
//!
//! The model's sizes are in its type (`Iris = Tabular<4, 3>`: four feature columns,
//! three classes), checked when the program compiles against everything that uses
//! them and, when it runs, against the file: a file with another number of feature
//! columns is one error naming both shapes.

use kiln::cpu::{Cpu, CpuDevice};
use kiln::data::{random_split, CsvConfig, CsvDataset, DataLoader, Dataset, LoaderConfig};
use kiln::prelude::*;
use kiln::train::learner::Learner;
use kiln::train::metrics::Accuracy;
use kiln::train::optim::{AdamW, AdamWConfig, GradClip, Optimizer};
use kiln::train::schedule::OneCycle;
use std::path::Path;

/// A small perceptron over one row of `FEATURES` numbers, scoring `CLASSES` classes.
#[model]
pub struct Tabular<const FEATURES: usize, const CLASSES: usize> {
    fc1: Linear<FEATURES, 32>,
    fc2: Linear<32, CLASSES>,
}

#[model]
impl Tabular {
    /// Class scores of a batch of rows.
    pub fn forward(&self, x: Tensor<Dyn, FEATURES>) -> Tensor<Dyn, CLASSES> {
        self.fc2(self.fc1(x).relu())
    }

    /// Mean cross-entropy against the rows' classes.
    pub fn loss(&self, x: Tensor<Dyn, FEATURES>, y: Tensor<Dyn, i32>) -> Tensor {
        self.forward(x).cross_entropy(y)
    }
}

/// The model for Iris: four measurements, three species.
#[model]
pub type Iris = Tabular<4, 3>;

/// Trains on 80% of the rows of `path` for `epochs`, returning the last epoch's mean
/// loss and the accuracy on the other 20%.
pub fn train_csv(path: &Path, label: &str, epochs: u64) -> Result<(f64, f64)> {
    let table = CsvDataset::open(path, &CsvConfig::classes_in(label))?;
    let test_rows = table.len() / 5;
    let sizes = [table.len() - test_rows, test_rows];
    let [train, test]: [_; 2] = random_split(table, &sizes, 1)?
        .try_into()
        .expect("two parts");
    let config = LoaderConfig {
        batch_size: 16,
        seed: 7,
        ..LoaderConfig::default()
    };
    let train = DataLoader::new(train, config)?;
    let test = DataLoader::new(test, config.for_evaluation())?;

    let mut opt = AdamW::<Cpu>::new(AdamWConfig::default())?;
    opt.set_grad_clip(GradClip::Norm(1.0))?;
    let steps = epochs * train.batches_per_epoch() as u64;
    let mut learner = Learner::new(Iris::<Cpu>::init(&CpuDevice, 3)?, opt, CpuDevice)
        .epochs(epochs)
        .schedule(OneCycle::new(0.02, steps)?)
        .metric(Accuracy::accuracy())
        .on_epoch(|_| Ok(()));
    let reports = learner.fit(&train, Some(&test))?;
    let last = reports.last().expect("at least one epoch");
    Ok((last.train_loss, last.metrics[0].1))
}

fn main() {
    let mut args = std::env::args().skip(1);
    let default = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/data/iris.csv");
    let path = args.next().unwrap_or_else(|| default.to_string());
    let label = args.next().unwrap_or_else(|| "species".to_string());
    match train_csv(Path::new(&path), &label, 60) {
        Ok((loss, accuracy)) => println!(
            "last epoch's loss {loss:.4}; held-out accuracy {:.1}%",
            accuracy * 100.0
        ),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
