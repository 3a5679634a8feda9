//! cuBLASLt's timed algorithm search: the switch that turns it on (off by default), the
//! record each search leaves ([`AlgorithmSearch`]), and how candidates are timed
//! ([`fastest`]). Which algorithm a product runs (the one kept for its problem, the
//! heuristic's first choice, or the search's pick) is chosen in [`super::cublaslt`],
//! whose per-device state keeps the choices and the records.

use crate::driver::driver_error;
use cudarc::cublaslt::result as lt;
use cudarc::driver::{result as drv, sys as dsys};
use kiln_tensor::Result;
use std::sync::atomic::{AtomicBool, Ordering};

static SEARCH: AtomicBool = AtomicBool::new(false);

/// Whether the first product of each shape times cuBLASLt's candidate algorithms and
/// keeps the fastest, or takes its heuristic's first choice (the default). Off by
/// default, like PyTorch's `cudnn.benchmark`: timing noise picks different algorithms
/// in different processes, whose results differ in the last bits, and on the H200 it
/// did not make W1's step faster (BENCHMARKS.md).
pub fn set_algorithm_search(on: bool) {
    SEARCH.store(on, Ordering::SeqCst);
}

/// Whether products search for their fastest algorithm.
pub fn algorithm_search() -> bool {
    SEARCH.load(Ordering::SeqCst)
}

/// One timed algorithm search: the problem, the heuristic's first choice's time and the
/// chosen one's (microseconds), and how many candidates were timed.
#[derive(Clone, Debug)]
pub struct AlgorithmSearch {
    /// The product: dtype, TF32, `m x n x k`, leading dims, transposes, batch, alignments.
    pub problem: String,
    /// The heuristic's first choice, in microseconds.
    pub heuristic_us: f64,
    /// The fastest candidate, in microseconds.
    pub chosen_us: f64,
    /// How many candidates the heuristic offered.
    pub candidates: usize,
}

/// How many of cuBLASLt's heuristic candidates the timed search tries.
pub(super) const CANDIDATES: usize = 8;

/// The candidate that runs fastest on `stream` (median of three timed runs after a
/// warm one; a candidate that fails to launch is skipped) and every candidate's time
/// in microseconds (`f64::INFINITY` for those skipped).
pub(super) fn fastest<T>(
    candidates: &[T],
    stream: dsys::CUstream,
    mut run: impl FnMut(&T) -> std::result::Result<(), lt::CublasError>,
) -> Result<(usize, Vec<f64>)> {
    let event = || {
        drv::event::create(dsys::CUevent_flags::CU_EVENT_DEFAULT)
            .map_err(|e| driver_error("cuEventCreate", e))
    };
    let (start, end) = (event()?, event()?);
    let mut times = Vec::with_capacity(candidates.len());
    let timed =
        |run: &mut dyn FnMut() -> std::result::Result<(), lt::CublasError>| -> Result<Option<f64>> {
            if run().is_err() {
                return Ok(None);
            }
            let mut reps = [0f64; 3];
            for r in &mut reps {
                unsafe {
                    drv::event::record(start, stream)
                        .map_err(|e| driver_error("cuEventRecord", e))?;
                    if run().is_err() {
                        return Ok(None);
                    }
                    drv::event::record(end, stream)
                        .map_err(|e| driver_error("cuEventRecord", e))?;
                    drv::event::synchronize(end)
                        .map_err(|e| driver_error("cuEventSynchronize", e))?;
                    *r = drv::event::elapsed(start, end)
                        .map_err(|e| driver_error("cuEventElapsedTime", e))?
                        as f64
                        * 1e3;
                }
            }
            reps.sort_by(f64::total_cmp);
            Ok(Some(reps[1]))
        };
    for c in candidates {
        let t = timed(&mut || run(c));
        times.push(t.map(|t| t.unwrap_or(f64::INFINITY)));
    }
    unsafe {
        let _ = drv::event::destroy(start);
        let _ = drv::event::destroy(end);
    }
    let times = times.into_iter().collect::<Result<Vec<f64>>>()?;
    let best = (0..times.len())
        .min_by(|&a, &b| times[a].total_cmp(&times[b]))
        .unwrap_or(0);
    Ok((best, times))
}
