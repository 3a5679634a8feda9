//! Run-time mistakes named as the user's, not as the kernel that met them: a label
//! outside the classes of `cross_entropy` and a token id outside an embedding's rows
//! (the kernel only knows it gathered), on the planned and the op-by-op path; and a
//! classification metric given a regression model, refused before the run trains.

use kiln::cpu::{Cpu, CpuDevice};
use kiln::data::{DataLoader, Field, InMemory, LoaderConfig, Values};
use kiln::prelude::*;
use kiln::train::learner::Learner;
use kiln::train::metrics::Accuracy;
use kiln::train::optim::{Sgd, SgdConfig};

/// The message of a call that must fail.
fn refusal<T>(r: kiln::prelude::Result<T>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

/// Tags each token with one of three classes.
#[model]
pub struct Tagger {
    tok: Embedding<10, 8>,
    head: Linear<8, 3>,
}

#[model]
impl Tagger {
    pub fn forward<const B: usize>(&self, ids: Tensor<B, i32>) -> Tensor<B, 3> {
        self.head(self.tok(ids))
    }

    pub fn loss<const B: usize>(&self, ids: Tensor<B, i32>, y: Tensor<B, i32>) -> Tensor {
        self.forward(ids).cross_entropy(y)
    }
}

fn ints(v: &[i32]) -> Tensor<Cpu, Rank1<2>, i32> {
    Tensor::from_vec(v.to_vec(), &[2], &CpuDevice).unwrap()
}

#[test]
fn a_label_out_of_range_is_named_as_a_label_on_both_paths() {
    let model = Tagger::<Cpu>::init(&CpuDevice, 0).unwrap();
    for fused in [true, false] {
        model.set_fused(fused);
        let e = model
            .loss(&ints(&[1, 2]), &ints(&[0, 5]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("label 5 is out of range for `cross_entropy` over 3 classes: labels are class ids 0..3"),
            "fused {fused}: {e}"
        );
        assert!(!e.contains("gather"), "fused {fused}: {e}");
        let e = refusal(model.loss_and_grad(&ints(&[1, 2]), &ints(&[-1, 0])));
        assert!(e.contains("label -1 is out of range"), "fused {fused}: {e}");
    }
}

#[test]
fn a_token_id_out_of_range_names_its_embedding_on_both_paths() {
    let model = Tagger::<Cpu>::init(&CpuDevice, 0).unwrap();
    for fused in [true, false] {
        model.set_fused(fused);
        let e = model.forward(&ints(&[3, 12])).unwrap_err().to_string();
        assert!(
            e.contains("token id 12 is out of range for the embedding `tok`, of 10 rows: its ids are 0..10"),
            "fused {fused}: {e}"
        );
        let e = refusal(model.loss_and_grad(&ints(&[10, 0]), &ints(&[0, 0])));
        assert!(
            e.contains("token id 10 is out of range for the embedding `tok`"),
            "fused {fused}: {e}"
        );
    }
    // Ids in range still run.
    model.set_fused(true);
    assert!(model.forward(&ints(&[0, 9])).is_ok());
}

/// One output per example, trained by mean squared error: a regression model.
#[model]
pub struct Line {
    fc: Linear<3, 1>,
}

#[model]
impl Line {
    pub fn forward<const B: usize>(&self, x: Tensor<B, 3>) -> Tensor<B, 1> {
        self.fc(x)
    }

    pub fn loss<const B: usize>(&self, x: Tensor<B, 3>, y: Tensor<B, 1>) -> Tensor {
        self.forward(x).mse(y)
    }
}

#[test]
fn a_classification_metric_on_a_regression_model_is_refused_before_training() {
    let xs = Field::new(
        vec![8, 3],
        Values::F32((0..24).map(|v| v as f32 / 24.0).collect()),
    )
    .unwrap();
    let ys = Field::new(
        vec![8, 1],
        Values::F32((0..8).map(|v| v as f32 / 8.0).collect()),
    )
    .unwrap();
    let loader = DataLoader::new(
        InMemory::new(xs, ys).unwrap(),
        LoaderConfig {
            batch_size: 4,
            ..LoaderConfig::default()
        },
    )
    .unwrap();
    let epochs = std::cell::Cell::new(0);
    let mut learner = Learner::new(
        Line::<Cpu>::init(&CpuDevice, 1).unwrap(),
        Sgd::<Cpu>::new(SgdConfig::default()).unwrap(),
        CpuDevice,
    )
    .epochs(2)
    .on_epoch(|_| {
        epochs.set(epochs.get() + 1);
        Ok(())
    })
    .metric(Accuracy::accuracy());
    let e = learner.fit(&loader, Some(&loader)).unwrap_err().to_string();
    assert_eq!(epochs.get(), 0, "no epoch trains before the refusal");
    for part in [
        "the metric `accuracy` cannot read this model's output, so the run is refused before training",
        "the model gives scores f32 [4, 1] for targets f32 [4, 1]",
        "accuracy is a classification metric",
        "a regression model, measured by its loss",
    ] {
        assert!(e.contains(part), "missing {part:?} in: {e}");
    }
}
