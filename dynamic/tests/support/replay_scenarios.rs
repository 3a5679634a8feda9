//! Scenarios of replayed dynamic programs, on any backend that captures: each runs with
//! replay on and off from an empty plan cache and asserts the two bit for bit, with
//! the captures and replays the first made. `all` runs them in order (the replay switch
//! and the cache counters are the process's: call it from one test). Included with
//! `#[path = "…/replay_scenarios.rs"] mod replay_scenarios;`.

use kiln_dynamic::{cache_stats, clear_cache, set_replay, LazyTensor};
use kiln_tensor::{Backend, DType, RandDist, RawTensor};

/// Every scenario, in order.
pub fn all<B: Backend>(dev: &B::Device) {
    assert!(
        B::captures(dev),
        "the scenarios need a backend that captures"
    );
    training_replays_bit_for_bit::<B>(dev);
    each_length_has_its_own_capture::<B>(dev);
    held_outputs_are_not_overwritten::<B>(dev);
    a_moved_input_is_read_where_it_now_is::<B>(dev);
    draws_are_not_replayed::<B>(dev);
    errors_in_a_replay_are_the_plain_runs::<B>(dev);
    outputs_in_an_input_buffer_are_the_callers::<B>(dev);
}

fn raw<B: Backend>(values: Vec<f32>, dims: &[usize], dev: &B::Device) -> RawTensor<B> {
    RawTensor::from_vec(values, dims, dev).unwrap()
}

fn lazy<B: Backend>(t: &RawTensor<B>) -> LazyTensor<B> {
    LazyTensor::from_raw(t.clone())
}

/// Values that differ from step to step and element to element.
pub fn wave(n: usize, phase: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (((i * 7 + phase * 13) % 17) as f32 - 8.0) / 9.0)
        .collect()
}

/// `f` with replay on, then off, each from an empty cache: their results, and the
/// captures and replays of the first.
pub fn both<B: Backend, R>(f: impl Fn() -> R) -> (R, R, u64, u64) {
    set_replay(true);
    clear_cache::<B>();
    let replayed = f();
    let stats = cache_stats::<B>();
    set_replay(false);
    clear_cache::<B>();
    let plain = f();
    assert_eq!(cache_stats::<B>().replays, 0, "replay off runs plainly");
    set_replay(true);
    (replayed, plain, stats.captures, stats.replays)
}

/// A small model's training step: `relu(x·w1)·w2` against `y` by mean squared error,
/// its gradients, and plain SGD written into the parameters in place (so they stay in
/// their buffers). Returns the loss.
fn sgd_step<B: Backend>(
    w1: &RawTensor<B>,
    w2: &RawTensor<B>,
    x: RawTensor<B>,
    y: RawTensor<B>,
) -> f64 {
    let (l1, l2) = (
        LazyTensor::leaf(w1.clone(), true),
        LazyTensor::leaf(w2.clone(), true),
    );
    let (x, y) = (LazyTensor::from_raw(x), LazyTensor::from_raw(y));
    let h = x.matmul(&l1).unwrap().relu().unwrap();
    let d = h.matmul(&l2).unwrap().sub(&y).unwrap();
    let loss = d.mul(&d).unwrap().mean_all().unwrap();
    let grads = loss.backward().unwrap();
    let value = loss.scalar_value().unwrap();
    for (w, l) in [(w1, &l1), (w2, &l2)] {
        let g = LazyTensor::from_raw(grads.get(l).expect("a gradient").clone());
        let next = lazy(w).sub(&g.mul_scalar(0.1).unwrap()).unwrap();
        let next = next.value().unwrap();
        assert!(B::assign(w, &next).unwrap(), "the backend writes in place");
    }
    value
}

/// Trains the model for `steps` steps at batch sizes cycling through `batches`, a new
/// batch tensor each step; returns the losses and the final parameters.
fn train<B: Backend>(
    dev: &B::Device,
    batches: &[usize],
    steps: usize,
) -> (Vec<f64>, Vec<f32>, Vec<f32>) {
    let (w1, w2) = (
        raw::<B>(wave(6 * 5, 1), &[6, 5], dev),
        raw::<B>(wave(5 * 2, 2), &[5, 2], dev),
    );
    let losses = (0..steps)
        .map(|s| {
            let n = batches[s % batches.len()];
            let x = raw::<B>(wave(n * 6, s), &[n, 6], dev);
            let y = raw::<B>(wave(n * 2, s + 3), &[n, 2], dev);
            sgd_step(&w1, &w2, x, y)
        })
        .collect();
    (losses, w1.to_vec().unwrap(), w2.to_vec().unwrap())
}

fn training_replays_bit_for_bit<B: Backend>(dev: &B::Device) {
    let (replayed, plain, captures, replays) = both::<B, _>(|| train::<B>(dev, &[4], 8));
    assert_eq!(replayed, plain, "replayed training equals plain training");
    assert!(replayed.0[7] < replayed.0[0], "it trains: {:?}", replayed.0);
    // Two programs (the training step, and the update, whose sizes are symbolic, at
    // the two parameters' sizes): each length seen once plainly, then captured, then
    // replayed.
    assert_eq!(captures, 3);
    assert_eq!(replays, 6 + 2 * 6);
}

fn each_length_has_its_own_capture<B: Backend>(dev: &B::Device) {
    let (replayed, plain, captures, replays) = both::<B, _>(|| train::<B>(dev, &[3, 5, 3, 7], 12));
    assert_eq!(replayed, plain);
    // The training program at three lengths (batch 3 on six steps, 5 and 7 on three
    // each: run plainly, captured, then replayed), the updates at their two.
    assert_eq!(captures, 3 + 2);
    assert_eq!(replays, (4 + 1 + 1) + 2 * 10);
}

/// A program run again on other inputs while a caller still holds the result of the
/// run before: the held result keeps its values.
fn held_outputs_are_not_overwritten<B: Backend>(dev: &B::Device) {
    let run = || {
        let w = raw::<B>(wave(4 * 3, 0), &[4, 3], dev);
        let mut results = Vec::new();
        let mut kept: Option<(LazyTensor<B>, Vec<f32>)> = None;
        let mut kept_later = Vec::new();
        for s in 0..6 {
            let x = lazy(&raw::<B>(wave(2 * 4, s), &[2, 4], dev));
            let y = x.matmul(&lazy(&w)).unwrap().tanh().unwrap();
            let v = y.to_vec::<f32>().unwrap();
            results.push(v.clone());
            // Even steps' results are kept across the next step, then read and dropped.
            match kept.take() {
                Some((held, then)) => kept_later.push((held.to_vec::<f32>().unwrap(), then)),
                None => kept = Some((y, v)),
            }
        }
        (results, kept_later)
    };
    let ((results, kept), plain, captures, replays) = both::<B, _>(run);
    assert_eq!((results, kept.clone()), plain);
    for (later, then) in &kept {
        assert_eq!(later, then, "a kept result keeps its values");
    }
    assert_eq!(captures, 1);
    // Step 1 is captured; steps 2 and 4 replay; steps 3 and 5 run plainly, as the
    // results of 2 and 4 are held then.
    assert_eq!(replays, 2);
}

/// A parameter read where it is, then moved to another buffer: the capture stops
/// reading the old one.
fn a_moved_input_is_read_where_it_now_is<B: Backend>(dev: &B::Device) {
    let run = || {
        let x = raw::<B>(wave(3 * 4, 5), &[3, 4], dev);
        let mut w = raw::<B>(wave(4 * 2, 0), &[4, 2], dev);
        let mut out = Vec::new();
        for s in 0..9 {
            // The same buffer for three steps, then a new one.
            if s % 3 == 0 {
                w = raw::<B>(wave(4 * 2, s + 1), &[4, 2], dev);
            }
            let y = lazy(&x).matmul(&lazy(&w)).unwrap().exp().unwrap();
            out.push(y.to_vec::<f32>().unwrap());
        }
        out
    };
    let (replayed, plain, captures, replays) = both::<B, _>(run);
    assert_eq!(replayed, plain);
    assert!(captures >= 2, "moved, captured again ({captures})");
    assert!(replays >= 2, "{replays} replays");
}

/// Programs that draw random numbers run plainly, each with fresh draws.
fn draws_are_not_replayed<B: Backend>(dev: &B::Device) {
    let run = || {
        let x = raw::<B>(vec![1.0; 64], &[64], dev);
        (0..4)
            .map(|s| {
                let uniform = RandDist::Uniform {
                    low: 0.0,
                    high: 1.0,
                };
                let r = LazyTensor::rand(&[64], uniform, 100 + s, DType::F32, dev).unwrap();
                let y = lazy(&x).mul(&r).unwrap();
                y.to_vec::<f32>().unwrap()
            })
            .collect::<Vec<_>>()
    };
    let (replayed, plain, captures, replays) = both::<B, _>(run);
    assert_eq!(replayed, plain);
    assert_ne!(replayed[1], replayed[2], "fresh draws");
    assert_eq!((captures, replays), (0, 0));
}

/// An out-of-range index in a replayed gather gives the plain run's error, and the
/// next run goes on.
fn errors_in_a_replay_are_the_plain_runs<B: Backend>(dev: &B::Device) {
    let run = || {
        let table = raw::<B>(wave(5 * 3, 0), &[5, 3], dev);
        (0..5)
            .map(|s| {
                let first = if s == 3 { 9 } else { s };
                let idx = RawTensor::<B>::from_vec(vec![first, 1, 2, 0], &[4, 1], dev).unwrap();
                let idx = lazy(&idx).broadcast_to(&[4, 3]).unwrap();
                let g = lazy(&table).gather(0, &idx).unwrap();
                let g = g.mul_scalar(2.0).unwrap();
                g.to_vec::<f32>().map_err(|e| e.to_string())
            })
            .collect::<Vec<_>>()
    };
    let (replayed, plain, _, replays) = both::<B, _>(run);
    assert!(replays >= 2, "{replays} replays");
    assert_eq!(replayed, plain);
    assert!(replayed[3].is_err(), "{:?}", replayed[3]);
    assert!(replayed[4].is_ok(), "{:?}", replayed[4]);
}

/// An output that is a view of an input (a reshape the caller keeps) is handed out as
/// a view of the caller's input, never of the capture's copy of it, which the next
/// replay writes again.
fn outputs_in_an_input_buffer_are_the_callers<B: Backend>(dev: &B::Device) {
    let run = || {
        let mut kept = Vec::new();
        let mut computed = Vec::new();
        for s in 0..5 {
            let x = lazy(&raw::<B>(wave(6, s), &[2, 3], dev));
            let y = x.reshape(&[3, 2]).unwrap();
            let z = x.exp().unwrap();
            kept.push(y.value().unwrap());
            computed.push(z.to_vec::<f32>().unwrap());
        }
        let kept: Vec<Vec<f32>> = kept.iter().map(|y| y.to_vec().unwrap()).collect();
        (kept, computed)
    };
    let ((kept, computed), plain, _, replays) = both::<B, _>(run);
    assert_eq!((kept.clone(), computed), plain);
    assert_eq!(kept[1], wave(6, 1), "a kept view keeps the caller's values");
    // The reshape's program and the exp's, each replayed from the third step.
    assert_eq!(replays, 2 * 3);
}
