//! Nothing lost: a training run interrupted at any moment resumes from its training
//! state to the parameters of the run that was never interrupted, bit for bit on the
//! CPU: in process through the Learner (the CNN with dropout, batch norm and AdamW), and against the real
//! binary killed with SIGKILL over and over (the MLP), or once (the GPT).

#[path = "support/bits.rs"]
mod bits;
#[path = "support/output.rs"]
mod output;
use bits::bits;

use kiln::cpu::{Cpu, CpuDevice};
use kiln::data::{DataLoader, LastBatch, LoaderConfig};
use kiln::prelude::*;
use kiln::train::learner::{Learner, Resume};
use kiln::train::optim::{AdamW, AdamWConfig};
use kiln::train::schedule::CosineWithWarmup;
use kiln::train::{checkpoint, state};
use kiln_models::classify::Examples;
use kiln_models::data::ImageDataset;
use kiln_models::lenet::LeNet;
use kiln_models::mlp::Mlp;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const TRAIN: &str = env!("CARGO_BIN_EXE_kiln-train");
const DEV: CpuDevice = CpuDevice;

/// A fresh, empty folder for one test.
fn scratch(test: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("kiln-resume")
        .join(test);
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// LeNet (dropout draws a mask each step, batch norm updates its statistics) trained
/// with AdamW by the Learner for 2 epochs of 8 steps: straight through, or failing
/// after step 11 (mid-epoch, after the state was saved at step 10) and resumed from
/// the state in a fresh model and optimizer.
#[test]
fn the_cnn_with_dropout_and_adamw_resumes_bit_for_bit() -> Result<()> {
    let path = scratch("cnn").join("state.safetensors");
    let mut data = ImageDataset::mnist()?;
    data.train = data.train.take(512);
    let train = DataLoader::new(
        Examples::of::<Cpu, LeNet<Cpu>>(Arc::new(data.train))?,
        LoaderConfig {
            batch_size: 64,
            seed: 3,
            last_batch: LastBatch::Drop,
            workers: 1,
            ..LoaderConfig::default()
        },
    )?;
    let adamw = || {
        AdamW::<Cpu>::new(AdamWConfig {
            lr: 0.01,
            weight_decay: 0.05,
            ..AdamWConfig::default()
        })
    };
    let learner = |model: LeNet<Cpu>, crash: Option<u64>, saves: bool| -> Result<_> {
        let mut l = Learner::new(model, adamw()?, DEV)
            .epochs(2)
            .schedule(CosineWithWarmup::new(0.01, 1e-4, 4, 16)?)
            .replay(true)
            .setting("run", "cnn test")
            .on_epoch(|_| Ok(()))
            .on_step(move |_, _, r| match crash {
                Some(at) if r.step + 1 == at => Err(Error::invalid("test", "crashed")),
                _ => Ok(()),
            });
        if saves {
            l = l.state_file(&path).save_every(10);
        }
        Ok(l)
    };
    let none = None::<&DataLoader<Examples>>;

    let mut straight = learner(LeNet::<Cpu>::init(&DEV, 3)?, None, false)?;
    straight.fit(&train, none)?;

    let mut crashed = learner(LeNet::<Cpu>::init(&DEV, 3)?, Some(11), true)?;
    let e = crashed.fit(&train, none).unwrap_err();
    assert!(e.to_string().contains("crashed"), "{e}");
    assert_eq!(state::verify(&path)?, 10, "the state of step 10 was saved");
    let mut resumed = learner(LeNet::<Cpu>::init(&DEV, 77)?, None, true)?.resume(Resume::Required);
    resumed.fit(&train, none)?;
    assert_eq!(resumed.first_step(), 10);
    assert_eq!(bits(&resumed.model), bits(&straight.model));
    assert_eq!(
        resumed.model.step_seeds().steps(),
        straight.model.step_seeds().steps(),
        "the dropout seeds went on from the same step"
    );
    Ok(())
}

/// The flags of the killed runs: the MLP on 1,536 MNIST images, 8 epochs of 24 steps,
/// a training state every 2 steps.
fn mlp_args(out: &Path) -> Vec<String> {
    let flags = [
        "--limit",
        "1536",
        "--epochs",
        "8",
        "--batch-size",
        "64",
        "--save-every",
        "2",
        "--warmup",
        "5",
    ];
    with_out(&flags, out)
}

/// `flags`, then `--out out`.
fn with_out(flags: &[&str], out: &Path) -> Vec<String> {
    flags
        .iter()
        .map(|s| s.to_string())
        .chain(["--out".to_string(), out.to_str().unwrap().to_string()])
        .collect()
}

fn spawn(args: &[String]) -> Child {
    Command::new(TRAIN)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kiln-train starts")
}

/// Temporary files of killed saves in `dir`.
fn temp_files(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect()
}

/// A small seeded generator for the kill times (xorshift).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// `kiln-train` killed with SIGKILL at 24 seeded random moments, each time resumed
/// with `--resume` (or started afresh when no state was written yet): after every
/// kill, the training state and the checkpoint are each absent or complete (they load
/// and verify), a later save removes the temporary files of killed saves, and the run
/// finishes with the very bytes of a run never interrupted (as does any run that got
/// to its end before its kill, after which the kills start over).
#[test]
fn a_run_killed_24_times_ends_as_the_uninterrupted_run() {
    const KILLS: usize = 24;
    let dir = scratch("kills");
    let reference = dir.join("reference.safetensors");
    let (code, _, err) = output::run(TRAIN, &refs(&mlp_args(&reference)));
    assert_eq!(code, Some(0), "{err}");

    let out = dir.join("model.safetensors");
    let state_path = dir.join("model.state.safetensors");
    let mut rng = Rng(0x6b69_6c6e_2026);
    let (mut mid_save, mut steps_at_kills, mut finished) = (0, Vec::new(), 0);
    let mut kill = 0;
    while kill < KILLS {
        assert!(
            finished < 8,
            "runs keep finishing before their kill: kill sooner"
        );
        let mut args = mlp_args(&out);
        if state_path.exists() {
            args.push("--resume".into());
        }
        let mut child = spawn(&args);
        // From the start (loading data) to well into training.
        std::thread::sleep(Duration::from_millis(200 + rng.below(800)));
        if let Some(status) = child.try_wait().unwrap() {
            // The run got to its end first (a fast machine): it must have ended as
            // the uninterrupted run did; start over so that the kills go on.
            assert!(status.success(), "a resumed run failed");
            assert!(fs::read(&out).unwrap() == fs::read(&reference).unwrap());
            fs::remove_file(&out).unwrap();
            fs::remove_file(&state_path).unwrap();
            finished += 1;
            continue;
        }
        child.kill().unwrap();
        child.wait().unwrap();
        kill += 1;
        if !temp_files(&dir).is_empty() {
            mid_save += 1;
        }
        if state_path.exists() {
            let step = state::verify(&state_path)
                .unwrap_or_else(|e| panic!("kill {kill}: the state is torn: {e}"));
            steps_at_kills.push(step);
        }
        if out.exists() {
            checkpoint::load(&mut Mlp::<Cpu>::init(&DEV, 0).unwrap(), &out)
                .unwrap_or_else(|e| panic!("kill {kill}: the checkpoint is torn: {e}"));
        }
    }
    eprintln!(
        "{KILLS} kills, {mid_save} left a temporary file, {finished} runs finished first; steps saved at each kill: {steps_at_kills:?}"
    );
    assert!(
        steps_at_kills.len() >= KILLS / 2,
        "too few kills landed after a state was saved: {steps_at_kills:?}"
    );

    let mut args = mlp_args(&out);
    args.push("--resume".into());
    let (code, stdout, err) = output::run(TRAIN, &refs(&args));
    assert_eq!(code, Some(0), "{err}");
    assert!(stdout.contains("resumed from"), "{stdout}");
    assert_eq!(
        temp_files(&dir),
        Vec::<String>::new(),
        "temporary files left"
    );
    assert!(
        fs::read(&out).unwrap() == fs::read(&reference).unwrap(),
        "the resumed run's checkpoint differs from the uninterrupted run's"
    );
    let mut straight = Mlp::<Cpu>::init(&DEV, 0).unwrap();
    checkpoint::load(&mut straight, &reference).unwrap();
    let mut resumed = Mlp::<Cpu>::init(&DEV, 0).unwrap();
    checkpoint::load(&mut resumed, &out).unwrap();
    assert_eq!(bits(&resumed), bits(&straight));
}

fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// Kills `args`' run as soon as its training state exists.
fn kill_after_first_state(args: &[String], state_path: &Path) {
    let mut child = spawn(args);
    let deadline = Instant::now() + Duration::from_secs(300);
    while !state_path.exists() {
        assert!(Instant::now() < deadline, "no training state was written");
        assert!(child.try_wait().unwrap().is_none(), "the run ended first");
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap();
    child.wait().unwrap();
}

/// The GPT's loop (windows drawn per step, dropout, AdamW) resumes to the bytes of the
/// uninterrupted run after a kill.
#[test]
fn the_gpt_resumes_after_a_kill_to_the_uninterrupted_run() {
    let dir = scratch("gpt");
    let args = |out: &Path| -> Vec<String> {
        let flags = [
            "--model",
            "gpt-tiny",
            "--optimizer",
            "adamw",
            "--lr",
            "0.003",
            "--batch-size",
            "16",
            "--limit",
            "8192",
            "--epochs",
            "2",
            "--save-every",
            "3",
        ];
        with_out(&flags, out)
    };
    let reference = dir.join("reference.safetensors");
    let (code, _, err) = output::run(TRAIN, &refs(&args(&reference)));
    assert_eq!(code, Some(0), "{err}");

    let out = dir.join("gpt.safetensors");
    kill_after_first_state(&args(&out), &dir.join("gpt.state.safetensors"));
    let mut resume = args(&out);
    resume.push("--resume".into());
    let (code, stdout, err) = output::run(TRAIN, &refs(&resume));
    assert_eq!(code, Some(0), "{err}");
    assert!(stdout.contains("resumed from"), "{stdout}");
    assert!(
        fs::read(&out).unwrap() == fs::read(&reference).unwrap(),
        "the resumed GPT differs from the uninterrupted one"
    );

    // Resuming with other settings is refused, naming them.
    let mut other = resume.clone();
    other[5] = "0.001".into();
    output::assert_refused(TRAIN, &refs(&other), "--lr: 0.003 there, 0.001 here");
}

/// Nonsense around resuming: no state to resume, and a checkpoint given as the state.
#[test]
fn resuming_nothing_is_refused_in_one_line() {
    let dir = scratch("nothing");
    let out = dir.join("m.safetensors");
    let mut args = mlp_args(&out);
    args.push("--resume".into());
    output::assert_refused(TRAIN, &refs(&args), "there is no training state at");

    let plain = dir.join("plain.safetensors");
    checkpoint::save(&Mlp::<Cpu>::init(&DEV, 1).unwrap(), &plain).unwrap();
    args.extend(["--state".into(), plain.to_str().unwrap().into()]);
    output::assert_refused(TRAIN, &refs(&args), "is not a training state");
}
