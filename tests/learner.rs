//! The Learner on `#[model]`s: it trains, reports, evaluates with metrics, resumes
//! from its state file exactly where an uninterrupted run would be, refuses a state of
//! another run, and names a batch that does not fit the model's `loss`.

use kiln::cpu::{Cpu, CpuDevice};
use kiln::data::{DataLoader, Field, InMemory, LoaderConfig, Values};
use kiln::prelude::*;
use kiln::train::learner::{EpochReport, Learner, Resume, Supervised};
use kiln::train::metrics::{Accuracy, MeanLoss};
use kiln::train::optim::{AdamW, AdamWConfig, Sgd, SgdConfig};
use kiln::train::schedule::StepDecay;

/// Two-class points: the class is whether x + y > 0.
#[model]
pub struct Points {
    fc1: Linear<2, 16>,
    fc2: Linear<16, 2>,
}

#[model]
impl Points {
    pub fn forward<const B: usize>(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        self.fc2(self.fc1(x).relu())
    }

    pub fn loss<const B: usize>(&self, x: Tensor<B, 2>, y: Tensor<B, i32>) -> Tensor {
        self.forward(x).cross_entropy(y)
    }
}

/// A model with a `loss` and no `forward`: trains, but gives metrics no scores.
#[model]
pub struct Regressor {
    fc: Linear<3, 1>,
}

#[model]
impl Regressor {
    pub fn loss(&self, x: Tensor<Dyn, 3>, y: Tensor<Dyn, 1>) -> Tensor {
        self.fc(x).mse(y)
    }
}

fn points(n: usize, seed: u64) -> InMemory {
    let mut s = seed;
    let mut next = || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    };
    let xs: Vec<f32> = (0..2 * n).map(|_| next()).collect();
    let ys: Vec<i32> = xs.chunks(2).map(|p| (p[0] + p[1] > 0.0) as i32).collect();
    InMemory::new(
        Field::new(vec![n, 2], Values::F32(xs)).unwrap(),
        Field::new(vec![n], Values::I32(ys)).unwrap(),
    )
    .unwrap()
}

fn loaders(batch_size: usize) -> (DataLoader<InMemory>, DataLoader<InMemory>) {
    let config = LoaderConfig {
        batch_size,
        seed: 5,
        workers: 1,
        ..LoaderConfig::default()
    };
    (
        DataLoader::new(points(200, 1), config).unwrap(),
        DataLoader::new(
            points(100, 2),
            LoaderConfig {
                shuffle: false,
                ..config
            },
        )
        .unwrap(),
    )
}

fn params(m: &Points<Cpu>) -> Vec<u32> {
    let mut out = Vec::new();
    m.visit_params("", &mut |slot| {
        out.extend(
            slot.value
                .to_vec::<f32>()
                .unwrap()
                .into_iter()
                .map(f32::to_bits),
        )
    });
    out
}

fn scratch(name: &str) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("kiln-learner-{}-{name}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

#[test]
fn the_learner_trains_reports_and_evaluates() {
    let (train, test) = loaders(20);
    let mut lines = Vec::new();
    let opt = Sgd::<Cpu>::new(SgdConfig {
        lr: 0.1,
        momentum: 0.9,
        ..Default::default()
    })
    .unwrap();
    let mut learner = Learner::new(Points::<Cpu>::init(&CpuDevice, 1).unwrap(), opt, CpuDevice)
        .epochs(6)
        .schedule(StepDecay::new(0.2, 30, 0.5).unwrap())
        .metric(Accuracy::accuracy())
        .metric(MeanLoss::perplexity())
        .on_epoch(|r: &EpochReport| {
            lines.push(r.to_string());
            Ok(())
        });
    let reports = learner.fit(&train, Some(&test)).unwrap();
    drop(learner);
    assert_eq!(reports.len(), 6);
    assert_eq!(reports[5].step, 60);
    assert_eq!(reports[5].lr, 0.2 * 0.5, "the rate of step 59");
    assert!(
        reports[5].train_loss < reports[0].train_loss * 0.7,
        "{reports:?}"
    );
    let accuracy = &reports[5].metrics[0];
    assert_eq!(accuracy.0, "accuracy");
    assert!(accuracy.1 >= 0.9, "{accuracy:?}");
    let (perplexity, eval) = (reports[5].metrics[1].1, reports[5].eval_loss.unwrap());
    assert!((perplexity - eval.exp()).abs() < 1e-9 * perplexity);
    assert!(lines[0].starts_with("epoch 1/6: loss "), "{}", lines[0]);
    assert!(
        lines[0].contains("examples/s") && lines[0].contains("accuracy"),
        "{}",
        lines[0]
    );
    assert!(
        lines[0].contains("left") && !lines[5].contains("left"),
        "{lines:?}"
    );
}

#[test]
fn a_resumed_run_ends_where_an_uninterrupted_one_does() {
    let (train, test) = loaders(32); // 200 = 6 batches of 32 and one of 8
    let opt = || {
        AdamW::<Cpu>::new(AdamWConfig {
            lr: 0.01,
            ..Default::default()
        })
        .unwrap()
    };
    let model = || Points::<Cpu>::init(&CpuDevice, 4).unwrap();
    let quiet = |_: &EpochReport| Ok(());

    let mut whole = Learner::new(model(), opt(), CpuDevice)
        .epochs(4)
        .on_epoch(quiet);
    whole.fit(&train, Some(&test)).unwrap();

    let state = scratch("resume.safetensors");
    let mut first = Learner::new(model(), opt(), CpuDevice)
        .epochs(2)
        .state_file(&state)
        .on_epoch(quiet);
    first.fit(&train, Some(&test)).unwrap();
    let mut rest = Learner::new(model(), opt(), CpuDevice)
        .epochs(4)
        .state_file(&state)
        .on_epoch(quiet);
    let reports = rest.fit(&train, Some(&test)).unwrap();
    assert_eq!(reports.iter().map(|r| r.epoch).collect::<Vec<_>>(), [2, 3]);
    assert_eq!(params(&rest.model), params(&whole.model), "bit for bit");

    // A state of a run with another batch size is refused, naming the setting.
    let (other, _) = loaders(25);
    let mut wrong = Learner::new(model(), opt(), CpuDevice)
        .epochs(4)
        .state_file(&state)
        .on_epoch(quiet);
    let e = wrong
        .fit(&other, None::<&DataLoader<InMemory>>)
        .unwrap_err()
        .to_string();
    assert!(e.contains("batch_size"), "{e}");
    // A state further along than the run asks for.
    let mut short = Learner::new(model(), opt(), CpuDevice)
        .epochs(1)
        .state_file(&state)
        .on_epoch(quiet);
    let e = short
        .fit(&train, None::<&DataLoader<InMemory>>)
        .unwrap_err()
        .to_string();
    assert!(e.contains("took 28 steps, more than this run's 7"), "{e}");
    std::fs::remove_file(&state).unwrap();
}

#[test]
fn batches_that_do_not_fit_the_loss_are_named() {
    let wide = InMemory::new(
        Field::new(vec![4, 3], Values::F32(vec![0.5; 12])).unwrap(),
        Field::new(vec![4], Values::I32(vec![0, 1, 0, 1])).unwrap(),
    )
    .unwrap();
    let loader = DataLoader::new(
        wide,
        LoaderConfig {
            batch_size: 2,
            ..LoaderConfig::default()
        },
    )
    .unwrap();
    let opt = Sgd::<Cpu>::new(SgdConfig::default()).unwrap();
    let mut learner = Learner::new(Points::<Cpu>::init(&CpuDevice, 1).unwrap(), opt, CpuDevice);
    let e = learner
        .fit(&loader, None::<&DataLoader<InMemory>>)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("Points::loss: `x` is f32 [2, 3] but the method takes f32 [B, 2]"),
        "{e}"
    );
    // Straight through the trait: targets of another batch.
    let model = Points::<Cpu>::init(&CpuDevice, 1).unwrap();
    let x = RawTensor::<Cpu>::from_vec(vec![0.0f32; 4], &[2, 2], &CpuDevice).unwrap();
    let y = RawTensor::<Cpu>::from_vec(vec![0i32; 3], &[3], &CpuDevice).unwrap();
    let e = model.loss_and_grads(&x, &y).err().unwrap().to_string();
    assert!(
        e.contains("axis 0 is 3, but B is 2 from an earlier argument"),
        "{e}"
    );
    let y = RawTensor::<Cpu>::from_vec(vec![0.0f32; 2], &[2], &CpuDevice).unwrap();
    let e = model.eval_loss(&x, &y).err().unwrap().to_string();
    assert!(
        e.contains("`y` is f32 [2] but the method takes i32 [B]"),
        "{e}"
    );
    assert_eq!(model.scores(&x).unwrap().unwrap().dims().as_slice(), [2, 2]);
}

#[test]
fn a_model_without_forward_trains_but_gives_no_scores() {
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
    let model = Regressor::<Cpu>::init(&CpuDevice, 2).unwrap();
    assert!(model
        .scores(&RawTensor::zeros(&[1, 3], DType::F32, &CpuDevice).unwrap())
        .unwrap()
        .is_none());
    let opt = Sgd::<Cpu>::new(SgdConfig {
        lr: 0.1,
        ..Default::default()
    })
    .unwrap();
    let mut learner = Learner::new(model, opt, CpuDevice)
        .epochs(2)
        .on_epoch(|_| Ok(()));
    let reports = learner.fit(&loader, Some(&loader)).unwrap();
    assert!(reports[1].eval_loss.is_some() && reports[1].metrics.is_empty());
    let mut learner = learner.metric(Accuracy::accuracy());
    let e = learner.fit(&loader, Some(&loader)).unwrap_err().to_string();
    assert!(
        e.contains("accuracy needs the batch's scores and targets"),
        "{e}"
    );
    let e = Learner::new(
        Regressor::<Cpu>::init(&CpuDevice, 2).unwrap(),
        Sgd::<Cpu>::new(SgdConfig::default()).unwrap(),
        CpuDevice,
    )
    .epochs(0)
    .fit(&loader, None::<&DataLoader<InMemory>>)
    .unwrap_err()
    .to_string();
    assert!(e.contains("a run of 0 epochs"), "{e}");
}

#[test]
fn steps_through_the_callback_train_as_the_plain_path_does() {
    use kiln::train::learner::StepInfo;
    let (train, test) = loaders(32);
    let opt = || {
        AdamW::<Cpu>::new(AdamWConfig {
            lr: 0.01,
            ..Default::default()
        })
        .unwrap()
    };
    let model = || Points::<Cpu>::init(&CpuDevice, 4).unwrap();
    let mut plain = Learner::new(model(), opt(), CpuDevice)
        .epochs(2)
        .on_epoch(|_| Ok(()));
    let plain_reports = plain.fit(&train, Some(&test)).unwrap();

    let state = scratch("every.safetensors");
    let mut seen: Vec<StepInfo> = Vec::new();
    let mut saved_at_six = None;
    let mut stepped = Learner::new(model(), opt(), CpuDevice)
        .epochs(2)
        .state_file(&state)
        .save_every(5)
        .on_epoch(|_| Ok(()))
        .on_step(|_, _, info: &StepInfo| {
            if info.step == 6 {
                saved_at_six = Some(kiln::train::state::verify(&state)?);
            }
            seen.push(info.clone());
            Ok(())
        });
    let reports = stepped.fit(&train, Some(&test)).unwrap();
    assert_eq!(params(&stepped.model), params(&plain.model), "bit for bit");
    drop(stepped);
    // 200 examples in batches of 32: six full ones and one of 8, per epoch.
    assert_eq!(seen.len(), 14);
    assert_eq!(
        seen.iter().map(|s| s.step).collect::<Vec<_>>(),
        (0..14).collect::<Vec<_>>()
    );
    assert!(seen
        .iter()
        .all(|s| s.steps == 14 && s.epoch == s.step / 7 && s.loss.is_finite()));
    assert_eq!(saved_at_six, Some(5), "the state saved after step 5");
    assert_eq!(kiln::train::state::verify(&state).unwrap(), 14);
    let weights = [32.0, 32.0, 32.0, 32.0, 32.0, 32.0, 8.0];
    let mean: f64 = seen[7..]
        .iter()
        .zip(weights)
        .map(|(s, w)| s.loss as f64 * w)
        .sum::<f64>()
        / 200.0;
    assert!(
        (reports[1].train_loss - mean).abs() < 1e-5,
        "{} against {mean}",
        reports[1].train_loss
    );
    assert!((reports[1].train_loss - plain_reports[1].train_loss).abs() < 1e-5);
    std::fs::remove_file(&state).unwrap();
}

#[test]
fn two_ranks_train_as_one_process_on_the_whole_batch() {
    use kiln::data::LastBatch;
    use kiln::train::parallel::ThreadGroup;
    let config = LoaderConfig {
        batch_size: 40,
        seed: 9,
        workers: 0,
        last_batch: LastBatch::Drop,
        ..LoaderConfig::default()
    };
    let opt = || {
        Sgd::<Cpu>::new(SgdConfig {
            lr: 0.1,
            momentum: 0.9,
            ..Default::default()
        })
        .unwrap()
    };
    let mut single = Learner::new(
        Points::<Cpu>::init(&CpuDevice, 7).unwrap(),
        opt(),
        CpuDevice,
    )
    .epochs(2)
    .on_epoch(|_| Ok(()));
    single
        .fit(
            &DataLoader::new(points(200, 1), config).unwrap(),
            None::<&DataLoader<InMemory>>,
        )
        .unwrap();
    let want: Vec<f32> = params(&single.model)
        .into_iter()
        .map(f32::from_bits)
        .collect();

    let ranks = ThreadGroup::new(2, std::time::Duration::from_secs(30)).unwrap();
    let handles: Vec<_> = ranks
        .into_iter()
        .map(|rank| {
            std::thread::spawn(move || {
                // Rank 1 starts from other weights: the run starts from rank 0's.
                let seed = if rank.rank() == 0 { 7 } else { 99 };
                let mut learner = Learner::new(
                    Points::<Cpu>::init(&CpuDevice, seed).unwrap(),
                    opt(),
                    CpuDevice,
                )
                .epochs(2)
                .ranks(Box::new(rank))
                .on_epoch(|_| Ok(()));
                let loader = DataLoader::new(points(200, 1), config).unwrap();
                learner.fit(&loader, None::<&DataLoader<InMemory>>).unwrap();
                params(&learner.model)
                    .into_iter()
                    .map(f32::from_bits)
                    .collect::<Vec<f32>>()
            })
        })
        .collect();
    for h in handles {
        let got = h.join().unwrap();
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= 1e-5 * (1.0 + w.abs()), "{g} against {w}");
        }
    }
}

#[test]
fn replayed_or_split_steps_need_batches_of_one_size() {
    let (train, _) = loaders(32); // the last batch kept
    let opt = Sgd::<Cpu>::new(SgdConfig::default()).unwrap();
    let mut learner =
        Learner::new(Points::<Cpu>::init(&CpuDevice, 1).unwrap(), opt, CpuDevice).replay(true);
    let e = learner
        .fit(&train, None::<&DataLoader<InMemory>>)
        .unwrap_err()
        .to_string();
    assert!(e.contains("drop the last batch"), "{e}");
    let opt = Sgd::<Cpu>::new(SgdConfig::default()).unwrap();
    let mut learner =
        Learner::new(Points::<Cpu>::init(&CpuDevice, 1).unwrap(), opt, CpuDevice).save_every(3);
    let e = learner
        .fit(&train, None::<&DataLoader<InMemory>>)
        .unwrap_err()
        .to_string();
    assert!(e.contains("save_every needs a state file"), "{e}");
}

/// What `kiln-train` asks of the Learner: the progress display and the curve (which
/// read every step's loss) train as the plain run does, bit for bit; the checkpoint at
/// the end carries the given metadata and the last evaluation; `Resume::Never` starts
/// afresh over an old state, `Resume::Required` refuses a missing one; a state of
/// other settings is refused, naming the setting.
#[test]
fn progress_curve_checkpoint_and_resume_policy() {
    let (train, test) = loaders(20);
    let opt = || {
        Sgd::<Cpu>::new(SgdConfig {
            lr: 0.1,
            momentum: 0.9,
            ..Default::default()
        })
        .unwrap()
    };
    let model = || Points::<Cpu>::init(&CpuDevice, 4).unwrap();
    let quiet = |_: &EpochReport| Ok(());
    let mut plain = Learner::new(model(), opt(), CpuDevice)
        .epochs(2)
        .on_epoch(quiet);
    plain.fit(&train, Some(&test)).unwrap();

    let (state, ckpt, png) = (
        scratch("policy.state.safetensors"),
        scratch("policy.safetensors"),
        scratch("policy.png"),
    );
    let shown = |resume| {
        Learner::new(model(), opt(), CpuDevice)
            .epochs(2)
            .metric(Accuracy::accuracy())
            .state_file(&state)
            .resume(resume)
            .setting("--lr", 0.1)
            .checkpoint_file(&ckpt)
            .metadata("model", "points")
            .progress(true)
            .curve(&png, "Points")
            .on_epoch(quiet)
    };
    let mut first = shown(Resume::Required);
    let e = first.fit(&train, Some(&test)).unwrap_err().to_string();
    assert!(e.contains("there is no training state at"), "{e}");
    let mut first = shown(Resume::IfPresent);
    let reports = first.fit(&train, Some(&test)).unwrap();
    assert_eq!(params(&first.model), params(&plain.model), "bit for bit");
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    let meta = kiln::train::checkpoint::read_metadata(&ckpt).unwrap();
    assert_eq!(meta.get("model").map(String::as_str), Some("points"));
    let accuracy = reports[1].metrics[0].1;
    assert_eq!(meta["eval_accuracy"], format!("{accuracy:.6}"));
    assert!(meta.contains_key("eval_loss"), "{meta:?}");

    // Never: a fresh run over the finished run's state takes all its steps again.
    let mut again = shown(Resume::Never);
    assert_eq!(again.fit(&train, Some(&test)).unwrap().len(), 2);
    assert_eq!(again.first_step(), 0);
    assert_eq!(params(&again.model), params(&plain.model));
    // IfPresent on a finished run: nothing left, no epochs, and the curve of the run
    // that took the steps stays.
    let drawn = std::fs::read(&png).unwrap();
    let mut done = shown(Resume::IfPresent);
    assert!(done.fit(&train, Some(&test)).unwrap().is_empty());
    assert_eq!(done.first_step(), 20);
    assert!(
        std::fs::read(&png).unwrap() == drawn,
        "an empty curve replaced it"
    );
    // Another rate than the state's is refused, naming it.
    let mut other = shown(Resume::IfPresent).setting("--lr", 0.2);
    let e = other.fit(&train, Some(&test)).unwrap_err().to_string();
    assert!(e.contains("--lr: 0.1 there, 0.2 here"), "{e}");
    for f in [&state, &ckpt, &png] {
        std::fs::remove_file(f).unwrap();
    }
    // A curve that could not be written is refused before the first step, not after
    // the last.
    let mut folder = shown(Resume::Never).curve(std::env::temp_dir(), "Points");
    let e = folder.fit(&train, Some(&test)).unwrap_err().to_string();
    assert!(
        e.contains("the training curve path") && e.contains("is a folder"),
        "{e}"
    );
    assert!(!state.exists(), "a step was taken");
}

/// A loss that is not finite stops the run at its step, before a state is saved.
#[test]
fn a_loss_that_is_not_finite_stops_the_run_at_its_step() {
    let (train, _) = loaders(20);
    let opt = Sgd::<Cpu>::new(SgdConfig {
        lr: 1e30,
        ..Default::default()
    })
    .unwrap();
    let state = scratch("nan.state.safetensors");
    let mut learner = Learner::new(Points::<Cpu>::init(&CpuDevice, 1).unwrap(), opt, CpuDevice)
        .epochs(3)
        .state_file(&state)
        .progress(true);
    let e = learner
        .fit(&train, None::<&DataLoader<InMemory>>)
        .unwrap_err()
        .to_string();
    assert!(e.contains("the loss became"), "{e}");
    assert!(e.contains("KILN_ANOMALY=1"), "{e}");
    assert!(!state.exists(), "a state of a diverged run was saved");
}
