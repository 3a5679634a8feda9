//! The tiny GPT trained by the Learner on windows of the vendored Shakespeare text:
//! `#[model]`'s `Supervised` reads the batch and the window length from the ids, the
//! held-out perplexity falls, and a run resumed from its state (dropout's seeds
//! included) ends with the uninterrupted run's parameters, bit for bit.

#[path = "support/bits.rs"]
mod bits;
#[path = "../src/gpt_instances.rs"]
#[allow(dead_code)]
mod gpt_instances;

use bits::bits;
use gpt_instances::TinyGpt;
use kiln::cpu::{Cpu, CpuDevice};
use kiln::data::{random_split, DataLoader, Dataset, LastBatch, LoaderConfig, TextWindows};
use kiln::train::learner::{EpochReport, Learner};
use kiln::train::metrics::MeanLoss;
use kiln::train::optim::{AdamW, AdamWConfig};

fn loaders() -> (
    DataLoader<kiln::data::Subset<TextWindows>>,
    DataLoader<kiln::data::Subset<TextWindows>>,
) {
    let text =
        std::fs::read(kiln_models::data::data_dir().join("shakespeare/shakespeare_7plays.txt"))
            .expect("the vendored text");
    let tokens = text[..24_000].iter().map(|&b| i32::from(b)).collect();
    let windows = TextWindows::new(tokens, 256, 32, 32).unwrap();
    let n = windows.len();
    let [train, test]: [_; 2] = random_split(windows, &[n - n / 8, n / 8], 1)
        .unwrap()
        .try_into()
        .expect("two parts");
    let config = LoaderConfig {
        batch_size: 16,
        seed: 2,
        workers: 1,
        last_batch: LastBatch::Drop,
        ..LoaderConfig::default()
    };
    (
        DataLoader::new(train, config).unwrap(),
        DataLoader::new(test, config.for_evaluation()).unwrap(),
    )
}

fn learner<'a>(seed: u64) -> Learner<'a, Cpu, TinyGpt<Cpu>, AdamW<Cpu>> {
    let opt = AdamW::new(AdamWConfig {
        lr: 3e-3,
        ..AdamWConfig::default()
    })
    .unwrap();
    Learner::new(
        TinyGpt::<Cpu>::init(&CpuDevice, seed).unwrap(),
        opt,
        CpuDevice,
    )
    .metric(MeanLoss::perplexity())
    .on_epoch(|_: &EpochReport| Ok(()))
}

#[test]
fn the_learner_trains_the_gpt_and_resumes_it_bit_for_bit() {
    let (train, test) = loaders();
    let mut whole = learner(5).epochs(3);
    let reports = whole.fit(&train, Some(&test)).unwrap();
    let perplexity = |r: &EpochReport| r.metrics[0].1;
    // A uniform guess over 256 bytes has perplexity 256.
    assert!(perplexity(&reports[0]) < 60.0, "{reports:?}");
    assert!(
        perplexity(&reports[2]) < perplexity(&reports[0]),
        "{reports:?}"
    );

    let state = std::env::temp_dir().join(format!(
        "kiln-learner-gpt-{}.safetensors",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&state);
    learner(5)
        .epochs(1)
        .state_file(&state)
        .fit(&train, Some(&test))
        .unwrap();
    // A fresh model of other weights: the state brings the trained ones, the moments
    // and the dropout seeds' counter.
    let mut rest = learner(77).epochs(3).state_file(&state);
    let resumed = rest.fit(&train, Some(&test)).unwrap();
    assert_eq!(resumed.len(), 2);
    assert_eq!(bits(&rest.model), bits(&whole.model), "bit for bit");
    std::fs::remove_file(&state).unwrap();
}
