//! With static shapes, a training step's memory plan is static: after the first steps
//! the fused step (forward, backward, optimizer update) reuses every buffer it
//! allocated, for the MLP, for the GPTs (attention, embeddings, layer norms, GELU,
//! dropout), in f32 and with bf16 products, and for the CNN (convolutions, batch norm,
//! pooling). A counting global allocator verifies it.
//!
//! The step runs inside rayon's pool (as a training loop should): a parallel loop
//! started from outside the pool goes through rayon's global queue, which allocates a
//! block every 63 submissions.

use kiln::cpu::{Cpu, CpuDevice};
use kiln::prelude::*;
use kiln::train::optim::{AdamW, AdamWConfig, Optimizer, Sgd, SgdConfig};
use kiln_models::gpt::GptModel;
use kiln_models::mlp::Mlp;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

#[path = "../src/gpt_instances.rs"]
#[allow(dead_code)]
mod gpt_instances;
use gpt_instances::{SmallGpt, TinyGpt};

/// The system allocator, counting allocations and bytes.
struct Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);
static BYTES: AtomicUsize = AtomicUsize::new(0);
static LARGEST: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(layout.size(), Ordering::Relaxed);
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(new_size, Ordering::Relaxed);
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

// One test, the models and optimizers in turn: the counters are global.
#[test]
fn a_steady_state_training_step_allocates_nothing() -> Result<()> {
    mlp_step_allocates_nothing(Sgd::<Cpu>::new(SgdConfig {
        lr: 0.01,
        momentum: 0.9,
        ..SgdConfig::default()
    })?)?;
    // AdamW updates each parameter and its moments in place, in one fused pass.
    let adamw = || {
        AdamW::<Cpu>::new(AdamWConfig {
            weight_decay: 0.1,
            ..AdamWConfig::default()
        })
    };
    mlp_step_allocates_nothing(adamw()?)?;
    // The GPTs: attention's passes, embeddings, layer norms, GELU and dropout (drawn
    // anew each step) on top, the small one at sizes where every kernel runs on the
    // pool's threads.
    gpt_step_allocates_nothing::<TinyGpt<Cpu>, 4, 32>(adamw()?)?;
    gpt_step_allocates_nothing::<SmallGpt<Cpu>, 8, 128>(adamw()?)?;
    // Mixed precision: bf16 products (on the CPU's bf16 dot-product kernel where it has
    // one), attention over bf16 heads, the casts between.
    gpt_step_allocates_nothing::<SmallGptBf16<Cpu>, 8, 128>(adamw()?)?;
    // The CNN: convolutions (unfold, products, fold), batch norm, max pooling, dropout.
    lenet_step_allocates_nothing(Sgd::<Cpu>::new(SgdConfig {
        lr: 0.01,
        momentum: 0.9,
        ..SgdConfig::default()
    })?)
}

fn lenet_step_allocates_nothing<O: Optimizer<Cpu> + Send>(opt: O) -> Result<()> {
    let dev = CpuDevice;
    let model = kiln_models::lenet::LeNet::<Cpu>::init(&dev, 1)?;
    let x = Tensor::<Cpu, (Const<32>, Const<1>, Const<28>, Const<28>)>::normal(0.0, 1.0, 5, &dev)?;
    let y =
        Tensor::<Cpu, (Const<32>,), i32>::from_vec((0..32).map(|i| i % 10).collect(), &[32], &dev)?;
    // Each step hands batch norm's four running statistics ([32] and [64] values) to
    // the model, which keeps them (the CPU's `assign` does not write in place), so the
    // step allocates their buffers anew: a value and its handle each, nothing else.
    let statistics = Allowance {
        allocations: 4 * 2,
        largest: 64 * 4,
    };
    steady_state_allocates_at_most("LeNet", statistics, model, opt, |model, opt| {
        let (_, grads) = model.loss_and_grad(&x, &y)?;
        opt.step(model, &grads)
    })
}

/// What a step may allocate: this many allocations, none larger than `largest` bytes.
struct Allowance {
    allocations: usize,
    largest: usize,
}

/// The small GPT with bf16 matrix products.
#[model(precision = bf16)]
type SmallGptBf16 = kiln_models::gpt::Gpt<128, 4, 4, 128>;
kiln_models::gpt_model!(SmallGptBf16 as SmallGpt);

fn mlp_step_allocates_nothing<O: Optimizer<Cpu> + Send>(opt: O) -> Result<()> {
    let dev = CpuDevice;
    let model = Mlp::<Cpu>::init(&dev, 1)?;
    let x = Tensor::<Cpu, Rank2<64, 784>>::normal(0.0, 1.0, 5, &dev)?;
    let y =
        Tensor::<Cpu, (Const<64>,), i32>::from_vec((0..64).map(|i| i % 10).collect(), &[64], &dev)?;
    steady_state_allocates_nothing("the MLP", model, opt, |model, opt| {
        let (_, grads) = model.loss_and_grad(&x, &y)?;
        opt.step(model, &grads)
    })
}

fn gpt_step_allocates_nothing<M, const B: usize, const T: usize>(opt: AdamW<Cpu>) -> Result<()>
where
    M: GptModel<Cpu> + Send,
{
    let dev = CpuDevice;
    let model = M::init(&dev, 1)?;
    let ids = |k: usize| {
        Tensor::<Cpu, (Const<B>, Const<T>), i32>::from_vec(
            (0..B * T).map(|i| (i * k % 256) as i32).collect(),
            &[B, T],
            &dev,
        )
    };
    let (ids, next) = (ids(7)?, ids(5)?);
    steady_state_allocates_nothing(M::NAME, model, opt, |model, opt| {
        let (_, grads) = model.loss_and_grad(&ids, &next)?;
        opt.step(model, &grads)
    })
}

/// Runs `step` until every buffer and per-thread scratch has grown, then asserts that
/// three more steps allocate nothing.
fn steady_state_allocates_nothing<M: Send, O: Send>(
    what: &str,
    model: M,
    opt: O,
    step: impl Fn(&mut M, &mut O) -> Result<()> + Sync,
) -> Result<()> {
    let nothing = Allowance {
        allocations: 0,
        largest: 0,
    };
    steady_state_allocates_at_most(what, nothing, model, opt, step)
}

/// [`steady_state_allocates_nothing`] with `allowed` allocations per step.
fn steady_state_allocates_at_most<M: Send, O: Send>(
    what: &str,
    allowed: Allowance,
    mut model: M,
    mut opt: O,
    step: impl Fn(&mut M, &mut O) -> Result<()> + Sync,
) -> Result<()> {
    // Warm-up on every pool thread in turn (`broadcast`), so that whichever thread
    // runs the measured steps has grown its per-thread scratch (GEMM panels, fused
    // kernel staging, attention's blocks) before.
    let shared = std::sync::Mutex::new((&mut model, &mut opt));
    for _ in 0..4 {
        for r in rayon::broadcast(|_| {
            let mut guard = shared.lock().unwrap();
            let (m, o) = &mut *guard;
            step(m, o)
        }) {
            r?;
        }
    }
    let (model, opt) = shared.into_inner().unwrap();
    let mut step = || -> Result<()> { rayon::scope(|_| step(model, opt)) };
    for _ in 0..4 {
        step()?;
    }
    let (a0, b0) = (
        ALLOCS.load(Ordering::Relaxed),
        BYTES.load(Ordering::Relaxed),
    );
    LARGEST.store(0, Ordering::Relaxed);
    for _ in 0..3 {
        step()?;
    }
    let (allocs, bytes) = (
        ALLOCS.load(Ordering::Relaxed) - a0,
        BYTES.load(Ordering::Relaxed) - b0,
    );
    let largest = LARGEST.load(Ordering::Relaxed);
    println!(
        "{what}: three steady-state steps: {allocs} allocations, {bytes} bytes, largest {largest}"
    );
    assert!(
        allocs <= 3 * allowed.allocations && largest <= allowed.largest,
        "{what}: {allocs} allocations in three steps (at most {} allowed), largest {largest} bytes (at most {})",
        3 * allowed.allocations,
        allowed.largest
    );
    assert!(
        allowed.allocations > 0 || bytes == 0,
        "{what}: {bytes} bytes"
    );
    Ok(())
}
