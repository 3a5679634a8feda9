//! `MpiRank` under `mpirun`: ranks get the same bits as the in-process collective, a
//! broadcast from any root reaches every rank, and a rank that comes late to an
//! exchange is named, on every rank, within the timeout. The test starts `mpirun` on
//! this test binary, whose copies run the ranks' side ([`ranks`]).
#![cfg(feature = "mpi")]

use kiln_cpu::{Cpu, CpuDevice};
use kiln_tensor::{Collective, RawTensor};
use kiln_train::mpi_rank::{end_job, MpiRank};
use kiln_train::parallel::ThreadGroup;
use kiln_train::rank_env::RankEnv;
use std::process::Command;
use std::time::{Duration, Instant};

/// Set in the ranks' environment: this copy of the binary is a rank.
const RANK_SIDE: &str = "KILN_MPI_TEST_RANK_SIDE";

fn tensor(values: Vec<f32>) -> RawTensor<Cpu> {
    let n = values.len();
    RawTensor::from_vec(values, &[n], &CpuDevice).unwrap()
}

/// Round `round`'s tensor on rank `me`.
fn round_values(me: usize, round: usize) -> Vec<f32> {
    let me = me as f32;
    vec![
        0.1 + me,
        1e8 * (me - 1.0),
        round as f32 * me,
        1.0 / (3.0 + me),
    ]
}

/// What ranks of `world` ranks hold after each round, by the in-process collective.
fn in_process(world: usize, rounds: usize) -> Vec<f32> {
    let ranks = ThreadGroup::new(world, Duration::from_secs(20)).unwrap();
    let seen = std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .into_iter()
            .enumerate()
            .map(|(me, rank)| {
                s.spawn(move || {
                    (0..rounds)
                        .flat_map(|round| {
                            let t = tensor(round_values(me, round));
                            Collective::<Cpu>::all_reduce_mean(&rank, &[t]).unwrap()[0]
                                .to_vec::<f32>()
                                .unwrap()
                        })
                        .collect::<Vec<f32>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    seen[0].clone()
}

#[test]
fn mpi_ranks_match_the_in_process_collective_and_name_a_late_rank() {
    if std::env::var(RANK_SIDE).is_ok() {
        return ranks();
    }
    let me = std::env::current_exe().unwrap();
    let found = Command::new("mpirun").arg("--version").output();
    assert!(
        found.is_ok_and(|o| o.status.success()),
        "no mpirun: install Open MPI (Debian: apt-get install openmpi-bin libopenmpi-dev libclang-dev), as scripts/test.sh does"
    );
    let out = Command::new("mpirun")
        .args(["--oversubscribe", "-np", "3"])
        .arg(&me)
        .args([
            "--exact",
            "mpi_ranks_match_the_in_process_collective_and_name_a_late_rank",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(RANK_SIDE, "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    // Every rank reached its end and said what it saw.
    for rank in 0..3 {
        assert!(text.contains(&format!("rank {rank} done")), "{text}");
    }
}

/// One rank's side, run by `mpirun`.
fn ranks() {
    let env = RankEnv::from_env().unwrap().expect("a rank of mpirun");
    let timeout = Duration::from_secs(1);
    let rank = MpiRank::join(&env, timeout).unwrap();
    let (me, world) = (env.rank, env.world);
    assert_eq!(Collective::<Cpu>::world(&rank), world);
    let rounds = 20;
    let seen: Vec<f32> = (0..rounds)
        .flat_map(|round| {
            let t = tensor(round_values(me, round));
            rank.all_reduce_mean(&[t]).unwrap()[0]
                .to_vec::<f32>()
                .unwrap()
        })
        .collect();
    assert_eq!(seen, in_process(world, rounds), "rank {me}");
    let rooted = rank
        .broadcast(&[tensor(vec![me as f32; 3]), tensor(vec![-(me as f32)])], 2)
        .unwrap();
    assert_eq!(rooted[0].to_vec::<f32>().unwrap(), vec![2.0; 3]);
    assert_eq!(rooted[1].to_vec::<f32>().unwrap(), vec![-2.0]);
    // Rank 2 comes to the next exchange after the timeout.
    if me == 2 {
        std::thread::sleep(Duration::from_millis(2500));
    }
    let started = Instant::now();
    let err = rank
        .all_reduce_mean(&[tensor(vec![1.0])])
        .expect_err("an exchange with a late rank fails")
        .to_string();
    let want = match me {
        0 => "rank 0: waited 1.0 s for rank 2 (on ",
        _ => "the group has failed (waited 1.0 s for rank 2 (on ",
    };
    assert!(err.contains(want), "rank {me}: {err}");
    assert!(started.elapsed() < Duration::from_secs(5), "rank {me}");
    // And the group stays failed.
    let again = rank.all_reduce_mean(&[tensor(vec![1.0])]).err().unwrap();
    assert!(
        again.to_string().contains("the group has failed"),
        "{again}"
    );
    println!("rank {me} done");
    drop(rank);
    end_job(true);
}
