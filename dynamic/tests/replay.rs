//! Cached programs replayed as captured graphs, held to plain runs bit for bit.
//!
//! CUDA is the backend that captures, and CI has no GPU, so these tests run on `Taped`
//! (`support/taped.rs`): the CPU backend capturing as a graph does. What the dynamic
//! path must get right is the same there: which inputs a replay reads where they are
//! and which it copies, that it never writes over outputs a caller still holds, one
//! capture per length, and plain runs wherever a replay would be wrong. The scenarios
//! (`support/replay_scenarios.rs`) run on CUDA too, in `kiln-gpu-system`'s
//! `dynamic_replay` test.
//!
//! One test function: the replay switch and the cache counters are the process's.

#[path = "support/replay_scenarios.rs"]
mod replay_scenarios;
#[path = "support/taped.rs"]
mod taped;

use kiln_cpu::{Cpu, CpuDevice};
use kiln_dynamic::LazyTensor;
use kiln_tensor::RawTensor;
use taped::Taped;

#[test]
fn replays_equal_plain_runs() {
    // The tape computes what the CPU computes.
    let wave: Vec<f32> = (0..6).map(|i| i as f32 / 3.0 - 1.0).collect();
    let cpu = RawTensor::<Cpu>::from_vec(wave.clone(), &[2, 3], &CpuDevice).unwrap();
    let taped = RawTensor::<Taped>::from_vec(wave, &[2, 3], &CpuDevice).unwrap();
    assert_eq!(
        LazyTensor::from_raw(cpu)
            .exp()
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        LazyTensor::from_raw(taped)
            .exp()
            .unwrap()
            .to_vec::<f32>()
            .unwrap()
    );
    replay_scenarios::all::<Taped>(&CpuDevice);
}
