//! The in-process collective (`parallel::ThreadGroup`, ranks as threads): means and
//! broadcasts every rank agrees on bit for bit, and the failures a rank can cause
//! (dying, falling behind, giving other tensors) as one clear error on every other rank
//! within the timeout, never a hang.

use kiln_cpu::{Cpu, CpuDevice};
use kiln_tensor::{Collective, DType, RawTensor};
use kiln_train::parallel::{ThreadGroup, ThreadRank};
use std::time::{Duration, Instant};

const DEV: CpuDevice = CpuDevice;

/// Runs `f` on every rank of a group of `world`, each on its own thread; the results
/// in rank order.
fn on_ranks<T: Send>(
    world: usize,
    timeout: Duration,
    f: impl Fn(ThreadRank) -> T + Sync,
) -> Vec<T> {
    let ranks = ThreadGroup::new(world, timeout).unwrap();
    std::thread::scope(|s| {
        let handles: Vec<_> = ranks.into_iter().map(|r| s.spawn(|| f(r))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn tensor(values: Vec<f32>) -> RawTensor<Cpu> {
    let n = values.len();
    RawTensor::from_vec(values, &[n], &DEV).unwrap()
}

/// One all-reduce of one f32 vector: the mean, or the error as text.
fn mean_of(r: &ThreadRank, values: Vec<f32>) -> Result<Vec<f32>, String> {
    let out =
        Collective::<Cpu>::all_reduce_mean(r, &[tensor(values)]).map_err(|e| e.to_string())?;
    Ok(out[0].to_vec::<f32>().unwrap())
}

#[test]
fn every_rank_gets_the_same_mean_and_the_roots_values() {
    let results = on_ranks(3, Duration::from_secs(10), |r| {
        let me = r.rank() as f32;
        // Values whose sum rounds differently in different orders, and a second tensor
        // of another shape and dtype in the same bucket.
        let first = tensor(vec![0.1 + me, 1e8 * (me - 1.0), 1e-3 * me, -me]);
        let second = RawTensor::<Cpu>::from_vec(vec![me as f64; 6], &[2, 3], &DEV).unwrap();
        let mean = r.all_reduce_mean(&[first, second]).unwrap();
        assert_eq!(mean[1].dims()[..], [2, 3]);
        assert_eq!(mean[1].dtype(), DType::F64);
        let labels = RawTensor::<Cpu>::from_vec(vec![r.rank() as u32; 3], &[3], &DEV).unwrap();
        let rooted = r.broadcast(&[labels], 2).unwrap();
        (
            mean[0].to_vec::<f32>().unwrap(),
            mean[1].to_vec::<f64>().unwrap(),
            rooted[0].to_vec::<u32>().unwrap(),
        )
    });
    let want = [
        (0.1f64 + 1.1 + 2.1) / 3.0,
        (-1e8f64 + 0.0 + 1e8) / 3.0,
        (0.0f64 + 1e-3 + 2e-3) / 3.0,
        -1.0,
    ];
    for (rank, (mean, second, rooted)) in results.iter().enumerate() {
        assert_eq!(mean, &results[0].0, "rank {rank} got other bits");
        for (got, want) in mean.iter().zip(want) {
            assert!(
                (*got as f64 - want).abs() <= 1e-6 * want.abs().max(1.0),
                "{got} != {want}"
            );
        }
        assert_eq!(second, &vec![1.0; 6]);
        assert_eq!(rooted, &vec![2; 3]);
    }
}

#[test]
fn many_rounds_in_a_row_stay_in_step() {
    let results = on_ranks(4, Duration::from_secs(10), |r| {
        let mut total = 0.0f32;
        for round in 0..200 {
            total += mean_of(&r, vec![(r.rank() * 1000 + round) as f32]).unwrap()[0];
        }
        total
    });
    // Round `k`'s mean is 1500 + k.
    let want: f32 = (0..200).map(|k| 1500.0 + k as f32).sum();
    assert!(
        results.iter().all(|&t| t == want),
        "{results:?} against {want}"
    );
}

#[test]
fn a_rank_that_leaves_fails_the_others_at_once() {
    // It leaves while the others wait in an exchange, and before they start one.
    for (leaves_after, others_start_after) in [(200, 0), (0, 200)] {
        a_rank_leaves(leaves_after, others_start_after);
    }
}

/// Rank 1 of 3 leaves after `leaves_after` ms; the others start an exchange after
/// `others_start_after` ms.
fn a_rank_leaves(leaves_after: u64, others_start_after: u64) {
    let started = Instant::now();
    let results = on_ranks(3, Duration::from_secs(30), |r| {
        if r.rank() == 1 {
            // Gives up before its first exchange (an error in its training step).
            std::thread::sleep(Duration::from_millis(leaves_after));
            drop(r);
            return Err("left".to_string());
        }
        std::thread::sleep(Duration::from_millis(others_start_after));
        mean_of(&r, vec![1.0])
    });
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the ranks waited for the timeout"
    );
    for (rank, result) in results.iter().enumerate().filter(|(r, _)| *r != 1) {
        let err = result
            .as_ref()
            .expect_err("an exchange without rank 1 succeeded");
        assert!(err.contains("rank 1 left"), "rank {rank}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}

#[test]
fn a_rank_that_falls_behind_times_the_others_out() {
    let results = on_ranks(2, Duration::from_millis(300), |r| {
        if r.rank() == 1 {
            std::thread::sleep(Duration::from_millis(1500));
        }
        mean_of(&r, vec![1.0])
    });
    let early = results[0].as_ref().expect_err("rank 0 did not time out");
    assert!(
        early.contains("waited 0.3 s in `all_reduce_mean` for rank(s) 1"),
        "{early}"
    );
    let late = results[1]
        .as_ref()
        .expect_err("rank 1 joined a failed group");
    assert!(late.contains("the group has failed"), "{late}");
}

#[test]
fn ranks_that_disagree_on_the_tensors_fail_together() {
    let results = on_ranks(2, Duration::from_secs(10), |r| {
        if r.rank() == 1 {
            // Let rank 0 give its values first.
            std::thread::sleep(Duration::from_millis(200));
        }
        mean_of(&r, vec![1.0; 2 + r.rank()])
    });
    let late = results[1]
        .as_ref()
        .expect_err("rank 1's other shape was taken");
    assert!(
        late.contains("gave tensors [f32[3]] where rank 0 gave [f32[2]]"),
        "{late}"
    );
    let early = results[0]
        .as_ref()
        .expect_err("rank 0 finished a broken exchange");
    assert!(early.contains("the group has failed"), "{early}");
}

#[test]
fn a_group_of_no_ranks_a_root_outside_it_and_integer_means_are_refused() {
    assert!(ThreadGroup::new(0, Duration::from_secs(1)).is_err());
    let ranks = ThreadGroup::new(1, Duration::from_secs(1)).unwrap();
    let err = Collective::<Cpu>::broadcast(&ranks[0], &[tensor(vec![1.0])], 1)
        .unwrap_err()
        .to_string();
    assert!(err.contains("root 1 is not a rank of 1"), "{err}");
    let labels = RawTensor::<Cpu>::from_vec(vec![1u32, 2], &[2], &DEV).unwrap();
    let err = ranks[0].all_reduce_mean(&[labels]).unwrap_err().to_string();
    assert!(err.contains("averages float tensors, not u32"), "{err}");
    // One rank is its own mean.
    assert_eq!(mean_of(&ranks[0], vec![1.5]).unwrap(), [1.5]);
}
