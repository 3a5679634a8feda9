//! `kiln-train --ranks N`: data parallelism as one process per rank on the CPU (ranks
//! exchange over loopback sockets; on CUDA the same code goes through NCCL). Two ranks
//! of 64 examples train the MLP as one process on batches of 128 does; only rank 0
//! writes files; a rank that never comes or dies makes the other fail with an error
//! naming it, within the timeout, never a hang.

#[path = "support/output.rs"]
mod output;
#[path = "support/ranks.rs"]
mod ranks;
use output::assert_refused;
use ranks::{assert_same_training, finish};

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const TRAIN: &str = env!("CARGO_BIN_EXE_kiln-train");

fn scratch(name: &str) -> PathBuf {
    ranks::scratch("kiln-dp", name)
}

/// `kiln-train` with `args`, its output, after checking it succeeded.
fn train(args: &[&str]) -> String {
    let out = Command::new(TRAIN).args(args).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{args:?}: {}{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

#[test]
fn two_rank_processes_train_the_mlp_of_one_on_the_whole_batch() {
    let dir = scratch("mlp");
    let one = dir.join("one.safetensors");
    let two = dir.join("two.safetensors");
    let common = [
        "--model",
        "mlp",
        "--limit",
        "1024",
        "--epochs",
        "1",
        "--save-every",
        "0",
    ];
    train(
        &[
            &common[..],
            &["--batch-size", "128", "--out", one.to_str().unwrap()],
        ]
        .concat(),
    );
    let log = train(
        &[
            &common[..],
            &[
                "--ranks",
                "2",
                "--batch-size",
                "64",
                "--out",
                two.to_str().unwrap(),
            ],
        ]
        .concat(),
    );
    assert!(log.contains("batch 128 (2 ranks of 64)"), "{log}");
    assert_eq!(log.matches("saved ").count(), 1, "only rank 0 saves: {log}");
    // Summation orders differ (halves of the batch, then their mean): rounding.
    assert_same_training(&one, &two);
    // Rank 0's files and nothing else.
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|f| f.starts_with("two"))
        .collect();
    files.sort();
    assert_eq!(
        files,
        ["two.png", "two.safetensors", "two.state.safetensors"]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A rank process started by hand, as a launcher would, with its stdout piped.
fn rank_process(
    rank: usize,
    world: usize,
    rendezvous: &Path,
    args: &[&str],
) -> std::process::Child {
    Command::new(TRAIN)
        .args(args)
        .env("KILN_RANK", rank.to_string())
        .env("KILN_WORLD", world.to_string())
        .env("KILN_RENDEZVOUS", rendezvous)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn a_rank_that_never_comes_fails_rank_0_within_the_timeout() {
    let dir = scratch("never");
    let out = dir.join("m.safetensors");
    let args = [
        "--ranks",
        "2",
        "--rank-timeout",
        "2",
        "--limit",
        "1024",
        "--out",
        out.to_str().unwrap(),
    ];
    let rank0 = rank_process(0, 2, &dir, &args);
    let (code, _, err) = finish(rank0, Duration::from_secs(30));
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("waited 2 s for rank(s) 1 to join"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(!out.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_rank_that_dies_mid_run_fails_the_other_at_once() {
    let dir = scratch("dies");
    let out = dir.join("m.safetensors");
    let args = [
        "--ranks",
        "2",
        "--rank-timeout",
        "120",
        "--limit",
        "4096",
        "--epochs",
        "20",
        "--save-every",
        "0",
        "--out",
        out.to_str().unwrap(),
    ];
    let mut rank0 = rank_process(0, 2, &dir, &args);
    let mut rank1 = rank_process(1, 2, &dir, &args);
    // Rank 0 prints the run's settings once both ranks have joined.
    let mut lines = BufReader::new(rank0.stdout.take().unwrap()).lines();
    let joined = lines.find(|l| l.as_ref().is_ok_and(|l| l.starts_with("training Mlp")));
    assert!(joined.is_some(), "rank 0 never started training");
    rank1.kill().unwrap();
    rank1.wait().unwrap();
    let killed = Instant::now();
    let (code, _, err) = finish(rank0, Duration::from_secs(60));
    assert!(
        killed.elapsed() < Duration::from_secs(20),
        "rank 0 waited for the timeout"
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("rank 1 closed its connection (it died or left)"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(!out.exists(), "a failed run saved a checkpoint");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn rank_settings_that_make_no_sense_are_refused() {
    let dir = scratch("flags");
    let out = dir.join("m.safetensors");
    let out = out.to_str().unwrap();
    assert_refused(
        TRAIN,
        &["--ranks", "0", "--out", out],
        "--ranks 0 runs nothing",
    );
    assert_refused(
        TRAIN,
        &["--ranks", "2", "--rank-timeout", "0", "--out", out],
        "--rank-timeout 0",
    );
    assert_refused(
        TRAIN,
        &[
            "--ranks",
            "2",
            "--rank-timeout",
            "18446744073709551615",
            "--out",
            out,
        ],
        "(at most 604800 s, a week)",
    );
    // More ranks than the machine holds are refused before any starts.
    let most = kiln::train::launch::max_ranks();
    let many = (most + 1).to_string();
    assert_refused(
        TRAIN,
        &["--ranks", &many, "--out", out],
        &format!("{many} ranks are more processes than this machine holds: at most {most}"),
    );
    // A rank's environment and its command line must agree.
    let lone = Command::new(TRAIN)
        .args(["--out", out])
        .env("KILN_RANK", "0")
        .env("KILN_WORLD", "2")
        .env("KILN_RENDEZVOUS", &dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&lone.stderr);
    assert!(err.contains("this process is rank 0 of 2 (KILN_RANK, KILN_WORLD), but its command line does not say --ranks 2"), "{err}");
    let partial = Command::new(TRAIN)
        .args(["--out", out])
        .env("KILN_RANK", "3")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&partial.stderr);
    assert!(
        err.contains("are set together (by kiln-train --ranks), not some of them"),
        "{err}"
    );
    let outside = Command::new(TRAIN)
        .args(["--ranks", "2", "--out", out])
        .env("KILN_RANK", "2")
        .env("KILN_WORLD", "2")
        .env("KILN_RENDEZVOUS", &dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&outside.stderr);
    assert!(
        err.contains("KILN_RANK=2 is not a rank of KILN_WORLD=2"),
        "{err}"
    );
    // A launch whose ranks fail says, in one line, which failed first and why.
    let launched = Command::new(TRAIN)
        .args(["--ranks", "2", "--limit", "100", "--out", out])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&launched.stderr);
    assert_eq!(launched.status.code(), Some(1), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.starts_with("error: invalid argument to `launch`: rank "),
        "{err}"
    );
    assert!(
        err.contains("exited with status 1: invalid argument to `kiln-train`: 100 training examples make no full batch of 128 (2 ranks of 64)"),
        "{err}"
    );
    assert!(!std::path::Path::new(out).exists());
    // A nonsense overlap setting fails every rank, in one line.
    let overlap = Command::new(TRAIN)
        .args([
            "--ranks",
            "2",
            "--limit",
            "256",
            "--batch-size",
            "64",
            "--out",
            out,
        ])
        .env("KILN_OVERLAP", "yes")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&overlap.stderr);
    assert_eq!(overlap.status.code(), Some(1), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("invalid argument to `KILN_OVERLAP`: `yes` is neither 1 (gradients sent during the backward pass) nor 0 (after it)"),
        "{err}"
    );
    assert!(!std::path::Path::new(out).exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The processes whose environment names the rendezvous folder `dir` (Linux's /proc).
fn ranks_meeting_in(dir: &Path) -> Vec<u32> {
    let wanted = format!("KILN_RENDEZVOUS={}", dir.display());
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|var| var == wanted.as_bytes()))
        })
        .collect()
}

/// Killing the launcher with SIGKILL (no chance to stop its ranks) stops the ranks
/// within seconds: they remove the rendezvous folder and write no checkpoint.
#[cfg(target_os = "linux")]
#[test]
fn ranks_stop_when_their_launcher_is_killed() {
    let dir = scratch("orphans");
    let out = dir.join("m.safetensors");
    let tmp = dir.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let mut launcher = Command::new(TRAIN)
        .args([
            "--ranks",
            "2",
            "--limit",
            "4096",
            "--epochs",
            "50",
            "--save-every",
            "0",
            "--out",
            out.to_str().unwrap(),
        ])
        .env("TMPDIR", &tmp)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(launcher.stdout.take().unwrap()).lines();
    let joined = lines.find(|l| l.as_ref().is_ok_and(|l| l.starts_with("training Mlp")));
    assert!(joined.is_some(), "rank 0 never started training");
    let rendezvous: Vec<PathBuf> = std::fs::read_dir(&tmp)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("kiln-ranks-"))
        })
        .collect();
    assert_eq!(rendezvous.len(), 1, "{rendezvous:?}");
    let rendezvous = &rendezvous[0];
    assert_eq!(ranks_meeting_in(rendezvous).len(), 2, "two ranks run");
    launcher.kill().unwrap();
    launcher.wait().unwrap();
    let killed = Instant::now();
    while !ranks_meeting_in(rendezvous).is_empty() || rendezvous.exists() {
        assert!(
            killed.elapsed() < Duration::from_secs(20),
            "ranks {:?} outlived their launcher (folder left: {})",
            ranks_meeting_in(rendezvous),
            rendezvous.exists()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!out.exists(), "an orphaned rank saved a checkpoint");
    std::fs::remove_dir_all(&dir).unwrap();
}
