//! Ranks as processes: the launcher stops every rank when one fails and names it, and
//! the loopback collective (`TcpRank`) agrees with the in-process one bit for bit and
//! turns a rank that never comes, dies or gives other tensors into one error on the
//! others, within the timeout.

use kiln_cpu::{Cpu, CpuDevice};
use kiln_tensor::{Collective, RawTensor};
use kiln_train::launch::{launch, RankEnv, TcpRank};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const DEV: CpuDevice = CpuDevice;

/// A fresh rendezvous folder for `world` ranks, and each rank's environment.
fn envs(name: &str, world: usize) -> Vec<RankEnv> {
    let dir = std::env::temp_dir().join(format!("kiln-launch-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    (0..world)
        .map(|rank| RankEnv {
            launcher: None,
            rank,
            world,
            rendezvous: dir.clone(),
            launched: false,
        })
        .collect()
}

/// Runs `f` for every rank of `envs` on its own thread; results in rank order.
fn on_ranks<T: Send>(envs: Vec<RankEnv>, f: impl Fn(RankEnv) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let handles: Vec<_> = envs.into_iter().map(|e| s.spawn(|| f(e))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn tensor(values: Vec<f32>) -> RawTensor<Cpu> {
    let n = values.len();
    RawTensor::from_vec(values, &[n], &DEV).unwrap()
}

fn sh() -> PathBuf {
    PathBuf::from("/bin/sh")
}

#[test]
fn the_launcher_waits_for_every_rank_and_gives_each_its_place() {
    let dir = std::env::temp_dir().join(format!("kiln-launch-places-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Each rank writes its place where the test can read it.
    let script = format!(
        "echo $KILN_RANK $KILN_WORLD > {}/rank-$KILN_RANK; test -d \"$KILN_RENDEZVOUS\"",
        dir.display()
    );
    launch(3, &sh(), &["-c".into(), script]).unwrap();
    for rank in 0..3 {
        let place = std::fs::read_to_string(dir.join(format!("rank-{rank}"))).unwrap();
        assert_eq!(place.trim(), format!("{rank} 3"));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_failing_rank_stops_the_others_and_is_named() {
    let started = Instant::now();
    let script = "if [ $KILN_RANK = 1 ]; then sleep 0.2; exit 3; fi; sleep 60".to_string();
    let err = launch(3, &sh(), &["-c".into(), script])
        .unwrap_err()
        .to_string();
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the launcher waited for the sleepers"
    );
    assert!(
        err.contains("rank 1 exited with status 3; stopped rank(s) 0, 2"),
        "{err}"
    );
    let missing = launch(2, Path::new("/kiln-nowhere/bin"), &[])
        .unwrap_err()
        .to_string();
    assert!(
        missing.contains("starting rank 0 (/kiln-nowhere/bin)"),
        "{missing}"
    );
}

#[test]
fn loopback_ranks_agree_bit_for_bit_over_many_rounds() {
    let results = on_ranks(envs("rounds", 3), |env| {
        let rank = TcpRank::join(&env, Duration::from_secs(20)).unwrap();
        let me = env.rank as f32;
        let mut seen = Vec::new();
        for round in 0..50 {
            let t = tensor(vec![0.1 + me, 1e8 * (me - 1.0), round as f32 * me]);
            let mean = rank.all_reduce_mean(&[t]).unwrap();
            seen.extend(mean[0].to_vec::<f32>().unwrap());
        }
        let rooted = rank.broadcast(&[tensor(vec![me; 2])], 2).unwrap();
        (seen, rooted[0].to_vec::<f32>().unwrap())
    });
    for (rank, (seen, rooted)) in results.iter().enumerate() {
        assert_eq!(seen, &results[0].0, "rank {rank} got other bits");
        assert_eq!(rooted, &vec![2.0; 2]);
    }
    // Round 7's mean: (0.1 + 1.1 + 2.1) / 3, 0, 7 · (0 + 1 + 2) / 3.
    let round7 = &results[0].0[21..24];
    assert!(
        (round7[0] - 1.1).abs() < 1e-6 && round7[1] == 0.0 && round7[2] == 7.0,
        "{round7:?}"
    );
}

#[test]
fn a_rank_that_never_comes_times_rank_0_out() {
    let env = envs("never", 2).remove(0);
    let started = Instant::now();
    let err = TcpRank::join(&env, Duration::from_millis(500))
        .err()
        .unwrap()
        .to_string();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(
        err.contains("waited 0 s for rank(s) 1 to join")
            || err.contains("waited 1 s for rank(s) 1 to join"),
        "{err}"
    );
    let late = envs("no-rank-0", 2).remove(1);
    let err = TcpRank::join(&late, Duration::from_millis(300))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("for rank 0 to publish"), "{err}");
}

#[test]
fn a_rank_that_dies_fails_the_others_at_once() {
    let started = Instant::now();
    let results = on_ranks(envs("dies", 3), |env| {
        let rank = TcpRank::join(&env, Duration::from_secs(30)).unwrap();
        if env.rank == 2 {
            // Its process ends: the connection closes.
            drop(rank);
            return Ok::<Vec<f32>, String>(Vec::new());
        }
        let first = rank
            .all_reduce_mean(&[tensor(vec![1.0])])
            .map_err(|e| e.to_string())?;
        Ok(first[0].to_vec::<f32>().unwrap())
    });
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the ranks waited for the timeout"
    );
    let err0 = results[0].as_ref().unwrap_err();
    assert!(
        err0.contains("rank 2 closed its connection (it died or left)"),
        "{err0}"
    );
    let err1 = results[1].as_ref().unwrap_err();
    assert!(
        err1.contains("the group has failed (rank 2 closed its connection"),
        "{err1}"
    );
}

#[test]
fn ranks_that_disagree_on_the_tensors_fail_together_and_stay_failed() {
    let results = on_ranks(envs("disagree", 2), |env| {
        let rank = TcpRank::join(&env, Duration::from_secs(30)).unwrap();
        let first = rank
            .all_reduce_mean(&[tensor(vec![1.0; 2 + env.rank])])
            .map_err(|e| e.to_string());
        let again = rank
            .all_reduce_mean(&[tensor(vec![1.0; 2])])
            .map_err(|e| e.to_string());
        (first, again)
    });
    let err = results[0].0.as_ref().unwrap_err();
    assert!(
        err.contains("rank 1 gave mean [f32[3]] where rank 0 gave mean [f32[2]]"),
        "{err}"
    );
    let err = results[1].0.as_ref().unwrap_err();
    assert!(err.contains("the group has failed (rank 1 gave"), "{err}");
    for (first, again) in &results {
        assert!(first.is_err());
        assert!(
            again.as_ref().unwrap_err().contains("the group has failed"),
            "{again:?}"
        );
    }
}
