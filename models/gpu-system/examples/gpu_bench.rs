//! `gpu_bench`: DESIGN.md's shared workloads on a GPU backend, one parseable line per
//! figure (`bench=W4 impl=kiln backend=cuda dtype=bf16 ... ms=… tflops=…`), and a short
//! MNIST training run. `scripts/bench_gpu.py` prints PyTorch's figures for the same
//! work on the same machine.
//!
//! `cargo run --release -p kiln-gpu-system --features cuda,wgpu --example gpu_bench -- \
//!     --backend cuda --workloads w1,w2,w4,mnist`
//! (`dynamic` and `dynamic-first`: the same work on the dynamic path, and its first
//! compile; run `dynamic-first` first in its process). On wgpu, `--product-kernel
//! auto|unsplit|direct` pins the product kernel and `--wait-spin-us N` sets how long a
//! wait polls before it blocks, for A/B runs of one binary.

#![cfg_attr(
    not(any(feature = "cuda", feature = "wgpu")),
    allow(dead_code, unused_imports, unused_variables)
)]

use kiln_models::chain::Chain;
use kiln_models::classify::mnist_mlp_run;
use kiln_models::data::{ImageDataset, MNIST_NORM};
use kiln_models::mlp::Mlp;
use kiln_tensor::attention::{attention_by_primitives, attention_vjp};
use kiln_tensor::testing::Config;
use kiln_tensor::{
    AttentionSpec, Backend, BuilderExt, Const, DType, Eager, RandDist, Rank2, RawTensor, Result,
    Tensor,
};
use kiln_train::optim::{Optimizer, Sgd, SgdConfig};
use std::time::Instant;

/// Median wall time in milliseconds of `reps` runs of `f`, each followed by a device
/// synchronisation, after two warm-up runs.
fn time_ms<B: Backend>(
    dev: &B::Device,
    reps: usize,
    mut f: impl FnMut() -> Result<()>,
) -> Result<f64> {
    for _ in 0..2 {
        f()?;
        B::synchronize(dev)?;
    }
    let mut t = Vec::with_capacity(reps);
    for _ in 0..reps.max(1) {
        let s = Instant::now();
        f()?;
        B::synchronize(dev)?;
        t.push(s.elapsed().as_secs_f64() * 1e3);
    }
    t.sort_by(f64::total_cmp);
    Ok(t[t.len() / 2])
}

/// Largest relative error of `got` against an f64 reference product of a few rows.
fn check_rows(a: &[f32], b: &[f32], c: &[f32], n: usize, rows: &[usize]) -> f64 {
    let mut worst = 0f64;
    for &i in rows {
        for j in (0..n).step_by(97) {
            let mut s = 0f64;
            let mut mag = 0f64;
            for k in 0..n {
                let p = a[i * n + k] as f64 * b[k * n + j] as f64;
                s += p;
                mag += p.abs();
            }
            worst = worst.max((c[i * n + j] as f64 - s).abs() / mag.max(1e-30));
        }
    }
    worst
}

fn w4<B: Backend>(dev: &B::Device, name: &str, reps: usize) -> Result<()> {
    let n = 4096;
    let dist = RandDist::Normal {
        mean: 0.0,
        std: 1.0,
    };
    let a32 = RawTensor::<B>::rand(&[n, n], dist, 1, DType::F32, dev)?;
    let b32 = RawTensor::<B>::rand(&[n, n], dist, 2, DType::F32, dev)?;
    let (ha, hb) = (a32.to_vec::<f32>()?, b32.to_vec::<f32>()?);
    let mut variants: Vec<(&str, DType, bool)> = vec![("f32", DType::F32, false)];
    if name == "cuda" {
        variants.push(("tf32", DType::F32, true));
        variants.push(("bf16", DType::BF16, false));
        variants.push(("f16", DType::F16, false));
    }
    for (label, dtype, tf32) in variants {
        #[cfg(feature = "cuda")]
        kiln_cubecl::cuda::set_allow_tf32(tf32);
        #[cfg(not(feature = "cuda"))]
        let _ = tf32;
        let (a, b) = (a32.cast(dtype)?, b32.cast(dtype)?);
        let c = a.matmul(&b)?.cast(DType::F32)?.to_vec::<f32>()?;
        let err = check_rows(&ha, &hb, &c, n, &[0, 1234, n - 1]);
        let ms = time_ms::<B>(dev, reps, || a.matmul(&b).map(|_| ()))?;
        let tflops = 2.0 * (n as f64).powi(3) / (ms * 1e-3) / 1e12;
        println!(
            "bench=W4 impl=kiln backend={name} dtype={label} mode=latency shape={n}x{n}x{n} ms={ms:.3} tflops={tflops:.1} max_rel_err={err:.2e}"
        );
        // Throughput: 10 products queued back to back, one synchronisation.
        let ms = time_ms::<B>(dev, reps.div_ceil(4), || {
            for _ in 0..10 {
                a.matmul(&b)?;
            }
            Ok(())
        })? / 10.0;
        let tflops = 2.0 * (n as f64).powi(3) / (ms * 1e-3) / 1e12;
        println!(
            "bench=W4 impl=kiln backend={name} dtype={label} mode=throughput shape={n}x{n}x{n} ms={ms:.3} tflops={tflops:.1}"
        );
    }
    #[cfg(feature = "cuda")]
    kiln_cubecl::cuda::set_allow_tf32(false);
    Ok(())
}

/// W2's input: `n` seeded standard normal f32 values.
fn w2_input<B: Backend>(dev: &B::Device, n: usize) -> Result<RawTensor<B>> {
    let dist = RandDist::Normal {
        mean: 0.0,
        std: 1.0,
    };
    RawTensor::<B>::rand(&[n], dist, 3, DType::F32, dev)
}

/// The largest relative error of W2's result `got` for input `x` (host values), sampled
/// every 4099 elements; an error above 1e-4. Correctness first: a skipped launch would
/// time as infinitely fast.
fn w2_check(x: &[f32], got: &[f32]) -> Result<f32> {
    let mut worst = 0f32;
    for i in (0..x.len()).step_by(4099) {
        let v = x[i];
        let want = (v * 1.5 + 0.5).max(0.0) * (1.0 / (1.0 + (-v).exp()));
        worst = worst.max((got[i] - want).abs() / want.abs().max(1e-3));
    }
    if worst > 1e-4 {
        return Err(kiln_tensor::Error::Device(format!(
            "W2 chain wrong: relative error {worst}"
        )));
    }
    Ok(worst)
}

fn w2<B: Backend>(dev: &B::Device, name: &str, reps: usize) -> Result<()> {
    // 2^26 f32 is 256 MiB: over lavapipe's 128 MiB binding cap, fine on real GPUs.
    let n = 1usize << 26;
    let x = w2_input::<B>(dev, n)?;
    let chain = || -> Result<RawTensor<B>> {
        let h = x.mul_scalar(1.5)?.add_scalar(0.5)?.relu()?;
        h.mul(&x.sigmoid()?)
    };
    let hx = x.to_vec::<f32>()?;
    let check = |got: Vec<f32>| w2_check(&hx, &got);
    let worst = check(chain()?.to_vec::<f32>()?)?;
    let ms = time_ms::<B>(dev, reps, || chain().map(|_| ()))?;
    // Counted as one read and one write of f32 per element, whatever the kernels do.
    let gbps = (n * 8) as f64 / (ms * 1e-3) / 1e9;
    println!("bench=W2 impl=kiln backend={name} variant=unfused n={n} ms={ms:.3} gbps={gbps:.1} max_rel_err={worst:.1e}");
    // The same chain as a `#[model]`: one fused kernel planned at build time.
    let model = Chain::<B>::init(dev, 0)?;
    let typed = Tensor::<B, (Const<{ 1usize << 26 }>,)>::from_raw(x.clone())?;
    let worst = check(model.forward(&typed)?.raw().to_vec::<f32>()?)?;
    let ms = time_ms::<B>(dev, reps, || model.forward(&typed).map(|_| ()))?;
    let gbps = (n * 8) as f64 / (ms * 1e-3) / 1e9;
    println!("bench=W2 impl=kiln backend={name} variant=fused n={n} ms={ms:.3} gbps={gbps:.1} max_rel_err={worst:.1e}");
    // Ten passes queued before one synchronisation: the kernel's own rate, without the
    // round trip of a synchronisation per pass in the figure above.
    let ms = time_ms::<B>(dev, reps, || {
        for _ in 0..10 {
            model.forward(&typed)?;
        }
        Ok(())
    })? / 10.0;
    let gbps = (n * 8) as f64 / (ms * 1e-3) / 1e9;
    println!(
        "bench=W2 impl=kiln backend={name} variant=fused-queued n={n} ms={ms:.3} gbps={gbps:.1}"
    );
    Ok(())
}

/// W2's chain on the dynamic path, read. The result is bound before the read: a
/// pending value something still holds at a read is computed too (the caller may read
/// it later), and the temporaries of a method chain ending in `.value()` live until the
/// end of the statement, which would make each op an output of its own kernel.
fn w2_dynamic<B: Backend>(x: &kiln::dynamic::LazyTensor<B>) -> Result<RawTensor<B>> {
    let y = x
        .mul_scalar(1.5)?
        .add_scalar(0.5)?
        .relu()?
        .mul(&x.sigmoid()?)?;
    y.value()
}

/// The dynamic path on this backend: W1's training step (the MLP of
/// `kiln_models::dynamic`, recorded lazily, planned and cached at run time) at batch 256
/// and 4096 beside nothing else (the static figures are `w1`'s), W2's chain recorded
/// lazily (`n` elements, checked), and the host cost of a plan-cache hit on a tiny graph.
fn dynamic<B: Backend>(dev: &B::Device, name: &str, reps: usize, n: usize) -> Result<()> {
    use kiln::dynamic::LazyTensor;
    use kiln_models::dynamic::DynamicMlp;
    // Each step with its cached program replayed where the backend captures (CUDA),
    // then with replay off; the counters say which ran.
    fn step<B: Backend, const BS: usize>(dev: &B::Device, name: &str, reps: usize) -> Result<()> {
        for replay in [true, false] {
            kiln::dynamic::set_replay(replay);
            let (_, mut opt, x, y) = w1_setup::<B, BS>(dev)?;
            let mut model = DynamicMlp::<B>::new(784, 1024, 10, dev, 1)?;
            let (x, y) = (
                LazyTensor::from_raw(x.raw().clone()),
                LazyTensor::from_raw(y.raw().clone()),
            );
            let before = kiln::dynamic::cache_stats::<B>();
            let ms = time_ms::<B>(dev, reps, || {
                let grads = model.loss(&x, &y)?.backward()?;
                opt.step(&mut model, &grads)
            })?;
            let after = kiln::dynamic::cache_stats::<B>();
            let variant = if replay {
                "dynamic"
            } else {
                "dynamic-noreplay"
            };
            println!(
                "bench=W1 impl=kiln backend={name} variant={variant} task=train batch={BS} ms={ms:.3} captures={} replays={}",
                after.captures - before.captures,
                after.replays - before.replays
            );
            // Queued back to back, as `w1`'s static train-pipelined figure.
            let steps = reps.max(1) * 5;
            let ms = time_ms::<B>(dev, 3, || {
                for _ in 0..steps {
                    let grads = model.loss(&x, &y)?.backward()?;
                    opt.step(&mut model, &grads)?;
                }
                Ok(())
            })? / steps as f64;
            println!(
                "bench=W1 impl=kiln backend={name} variant={variant} task=train-pipelined batch={BS} ms={ms:.3}"
            );
        }
        kiln::dynamic::set_replay(true);
        Ok(())
    }
    step::<B, 256>(dev, name, reps)?;
    step::<B, 4096>(dev, name, reps)?;
    let x = w2_input::<B>(dev, n)?;
    let lazy_x = LazyTensor::from_raw(x.clone());
    let chain = || w2_dynamic(&lazy_x);
    let worst = w2_check(&x.to_vec::<f32>()?, &chain()?.to_vec::<f32>()?)?;
    let ms = time_ms::<B>(dev, reps, || chain().map(|_| ()))?;
    let gbps = (n * 8) as f64 / (ms * 1e-3) / 1e9;
    println!("bench=W2 impl=kiln backend={name} variant=dynamic n={n} ms={ms:.3} gbps={gbps:.1} max_rel_err={worst:.1e}");
    let tiny = LazyTensor::from_raw(RawTensor::<B>::from_vec(
        vec![1.0f32, -2.0, 3.0, -4.0],
        &[4],
        dev,
    )?);
    let us = 1e3
        * time_ms::<B>(dev, reps * 50, || {
            let y = tiny.mul_scalar(1.5)?.add_scalar(0.5)?.relu()?.mul(&tiny)?;
            y.value().map(|_| ())
        })?;
    println!("bench=dynamic-hit impl=kiln backend={name} graph=4ops n=4 us={us:.2}");
    Ok(())
}

/// The dynamic path's first compile, in a fresh process (run it as the first
/// workload: kernels another workload compiled would be found in the backend's cache):
/// W1's first training step (recording, planning, compiling the kernels, running),
/// the first step at a new batch size (the plan reused), and a warm step.
fn dynamic_first<B: Backend>(dev: &B::Device, name: &str, reps: usize) -> Result<()> {
    use kiln::dynamic::{cache_stats, LazyTensor};
    use kiln_models::dynamic::DynamicMlp;
    let (_, _, x, y) = w1_setup::<B, 256>(dev)?;
    let (_, _, x2, y2) = w1_setup::<B, 128>(dev)?;
    let model = DynamicMlp::<B>::new(784, 1024, 10, dev, 1)?;
    let lazy = |t: &RawTensor<B>| LazyTensor::from_raw(t.clone());
    let (x, y, x2, y2) = (lazy(x.raw()), lazy(y.raw()), lazy(x2.raw()), lazy(y2.raw()));
    B::synchronize(dev)?;
    let start = Instant::now();
    model.loss(&x, &y)?.backward()?;
    B::synchronize(dev)?;
    let first = start.elapsed().as_secs_f64() * 1e3;
    let s = cache_stats::<B>();
    let start = Instant::now();
    model.loss(&x2, &y2)?.backward()?;
    B::synchronize(dev)?;
    let new_batch = start.elapsed().as_secs_f64() * 1e3;
    let after = cache_stats::<B>();
    let warm = time_ms::<B>(dev, reps, || model.loss(&x, &y)?.backward().map(|_| ()))?;
    println!(
        "bench=dynamic-first-plan impl=kiln backend={name} graph=W1-step batch=256 first_ms={first:.3} planning_ms={:.3} first_run_ms={:.3} new_batch_ms={new_batch:.3} new_batch_misses={} warm_ms={warm:.3}",
        s.planning.as_secs_f64() * 1e3,
        s.first_runs.as_secs_f64() * 1e3,
        after.misses - s.misses
    );
    Ok(())
}

/// W1's model (seed 1), its SGD (lr 0.01, momentum 0.9) and one batch of `BS` random
/// images with cycling labels.
#[allow(clippy::type_complexity)]
fn w1_setup<B: Backend, const BS: usize>(
    dev: &B::Device,
) -> Result<(
    Mlp<B>,
    Sgd<B>,
    Tensor<B, Rank2<BS, 784>>,
    Tensor<B, (Const<BS>,), i32>,
)> {
    let model = Mlp::<B>::init(dev, 1)?;
    let opt = Sgd::<B>::new(SgdConfig {
        lr: 0.01,
        momentum: 0.9,
        ..SgdConfig::default()
    })?;
    let x = Tensor::normal(0.0, 1.0, 5, dev)?;
    let labels: Vec<i32> = (0..BS as i32).map(|i| i % 10).collect();
    let y = Tensor::from_vec(labels, &[BS], dev)?;
    Ok((model, opt, x, y))
}

fn w1_batch<B: Backend, const BS: usize>(dev: &B::Device, name: &str, reps: usize) -> Result<()> {
    let (mut model, mut opt, x, y) = w1_setup::<B, BS>(dev)?;
    for fused in [true, false] {
        model.set_fused(fused);
        let ms = time_ms::<B>(dev, reps, || {
            let (_, grads) = model.loss_and_grad(&x, &y)?;
            opt.step(&mut model, &grads)
        })?;
        let variant = if fused { "static" } else { "static-unfused" };
        println!(
            "bench=W1 impl=kiln backend={name} variant={variant} task=train batch={BS} ms={ms:.3}"
        );
    }
    // Steps queued back to back with one synchronisation at the end: the host's cost
    // per step when it runs ahead of the device (against the latency above, it shows
    // whether a step waits on the host or on the device).
    model.set_fused(true);
    let steps = reps.max(1) * 5;
    let ms = time_ms::<B>(dev, 3, || {
        for _ in 0..steps {
            let (_, grads) = model.loss_and_grad(&x, &y)?;
            opt.step(&mut model, &grads)?;
        }
        Ok(())
    })? / steps as f64;
    println!("bench=W1 impl=kiln backend={name} variant=static task=train-pipelined batch={BS} ms={ms:.3}");
    Ok(())
}

/// One steady-state W1 training step (batch 256) between `cuProfilerStart` and
/// `cuProfilerStop`, for `ncu --profile-from-start off`: the kernels of exactly one step.
#[cfg(feature = "cuda")]
fn w1_profile(dev: &kiln_cubecl::CudaDevice) -> Result<()> {
    type B = kiln_cubecl::Cuda;
    let (mut model, mut opt, x, y) = w1_setup::<B, 256>(dev)?;
    let mut step = || -> Result<()> {
        let (_, grads) = model.loss_and_grad(&x, &y)?;
        opt.step(&mut model, &grads)?;
        B::synchronize(dev)
    };
    for _ in 0..3 {
        step()?;
    }
    // SAFETY: plain driver calls on the current context; failures only mean no profile.
    unsafe { cudarc::driver::sys::cuProfilerStart() };
    step()?;
    unsafe { cudarc::driver::sys::cuProfilerStop() };
    println!("bench=W1 impl=kiln backend=cuda task=profiled-step batch=256");
    Ok(())
}

/// One warm call of the dynamic path (`what`: `w2`, W2's chain on 2^26 elements, or
/// `w1`, W1's training step at batch 256) between `cuProfilerStart` and
/// `cuProfilerStop`, for `ncu --profile-from-start off`: the kernels it launches.
#[cfg(feature = "cuda")]
fn dynamic_profile(dev: &kiln_cubecl::CudaDevice, what: &str) -> Result<()> {
    use kiln::dynamic::LazyTensor;
    use kiln_models::dynamic::DynamicMlp;
    type B = kiln_cubecl::Cuda;
    let mut call: Box<dyn FnMut() -> Result<()>> = match what {
        "w2" => {
            let x = LazyTensor::from_raw(w2_input::<B>(dev, 1 << 26)?);
            Box::new(move || w2_dynamic(&x).map(|_| ()))
        }
        _ => {
            let (_, mut opt, x, y) = w1_setup::<B, 256>(dev)?;
            let mut model = DynamicMlp::<B>::new(784, 1024, 10, dev, 1)?;
            let (x, y) = (
                LazyTensor::from_raw(x.raw().clone()),
                LazyTensor::from_raw(y.raw().clone()),
            );
            Box::new(move || {
                let grads = model.loss(&x, &y)?.backward()?;
                opt.step(&mut model, &grads)
            })
        }
    };
    for _ in 0..3 {
        call()?;
        B::synchronize(dev)?;
    }
    // SAFETY: plain driver calls on the current context; failures only mean no profile.
    unsafe { cudarc::driver::sys::cuProfilerStart() };
    call()?;
    B::synchronize(dev)?;
    unsafe { cudarc::driver::sys::cuProfilerStop() };
    println!("bench=dynamic-profile impl=kiln backend=cuda what={what}");
    Ok(())
}

fn w1<B: Backend>(dev: &B::Device, name: &str, reps: usize) -> Result<()> {
    w1_batch::<B, 256>(dev, name, reps)?;
    w1_batch::<B, 4096>(dev, name, reps)?;
    let model = Mlp::<B>::init(dev, 1)?;
    let x = Tensor::<B, Rank2<1, 784>>::normal(0.0, 1.0, 6, dev)?;
    // Latency of one image: the logits downloaded, as an application would.
    let ms = time_ms::<B>(dev, reps * 20, || model.forward(&x)?.to_vec().map(|_| ()))?;
    println!("bench=W1 impl=kiln backend={name} variant=static task=infer batch=1 ms={ms:.4}");
    Ok(())
}

/// W1 with the training step (and the batch-1 forward pass) captured once as a CUDA
/// graph and replayed: the host's per-kernel work leaves the step.
#[cfg(feature = "cuda")]
fn w1_graph<const BS: usize>(dev: &kiln_cubecl::CudaDevice, reps: usize, tf32: bool) -> Result<()> {
    type B = kiln_cubecl::Cuda;
    let (mut model, mut opt, x, y) = w1_setup::<B, BS>(dev)?;
    let (_, grads) = model.loss_and_grad(&x, &y)?;
    opt.step(&mut model, &grads)?;
    drop(grads);
    let (graph, loss) = dev.capture(|| {
        let (loss, grads) = model.loss_and_grad(&x, &y)?;
        opt.step(&mut model, &grads)?;
        Ok(loss)
    })?;
    let ms = time_ms::<B>(dev, reps, || graph.replay())?;
    let last = loss.to_vec()?[0];
    let variant = if tf32 { "graph-tf32" } else { "graph" };
    let search = kiln_cubecl::cuda::algorithm_search();
    println!(
        "bench=W1 impl=kiln backend=cuda variant={variant} task=train batch={BS} ms={ms:.3} nodes={} loss={last:.4} search={search}",
        graph.nodes()
    );
    let steps = reps.max(1) * 5;
    let ms = time_ms::<B>(dev, 3, || {
        for _ in 0..steps {
            graph.replay()?;
        }
        Ok(())
    })? / steps as f64;
    println!(
        "bench=W1 impl=kiln backend=cuda variant={variant} task=train-pipelined batch={BS} ms={ms:.3} search={search}"
    );
    Ok(())
}

/// Batch-1 inference replayed as a CUDA graph, the logits downloaded each time.
#[cfg(feature = "cuda")]
fn w1_graph_infer(dev: &kiln_cubecl::CudaDevice, reps: usize) -> Result<()> {
    type B = kiln_cubecl::Cuda;
    let model = Mlp::<B>::init(dev, 1)?;
    let x = Tensor::<B, Rank2<1, 784>>::normal(0.0, 1.0, 6, dev)?;
    let eager = model.forward(&x)?.to_vec()?;
    let (graph, logits) = dev.capture(|| model.forward(&x))?;
    graph.replay()?;
    if logits.to_vec()? != eager {
        return Err(kiln_tensor::Error::Device(
            "the replayed forward pass differs from the eager one".into(),
        ));
    }
    let ms = time_ms::<B>(dev, reps * 20, || {
        graph.replay()?;
        logits.to_vec().map(|_| ())
    })?;
    println!(
        "bench=W1 impl=kiln backend=cuda variant=graph task=infer batch=1 ms={ms:.4} nodes={}",
        graph.nodes()
    );
    Ok(())
}

fn mnist<B: Backend>(dev: &B::Device, name: &str, epochs: usize, dir: &str) -> Result<()> {
    let data = if dir.is_empty() {
        ImageDataset::mnist()?
    } else {
        ImageDataset::load(std::path::Path::new(dir), MNIST_NORM)?
    };
    let run = mnist_mlp_run::<B>(dev, data, epochs as u64, 200)?;
    println!(
        "bench=MNIST impl=kiln backend={name} model=mlp epochs={epochs} batch=64 secs={:.1} last_loss={:.4} test_acc={:.2}",
        run.seconds,
        run.losses.last().copied().unwrap_or(f32::NAN),
        run.accuracy * 100.0
    );
    Ok(())
}

/// Times single ops at the shapes of the MLP's batch-64 training step.
fn ops<B: Backend>(dev: &B::Device, name: &str, reps: usize) -> Result<()> {
    let dist = RandDist::Normal {
        mean: 0.0,
        std: 1.0,
    };
    let r = |d: &[usize], seed| RawTensor::<B>::rand(d, dist, seed, DType::F32, dev);
    let (x, w1, w2, h) = (
        r(&[64, 784], 1)?,
        r(&[784, 1024], 2)?,
        r(&[1024, 1024], 3)?,
        r(&[64, 1024], 4)?,
    );
    let xt = r(&[784, 64], 5)?;
    type Case<'a, B> = (&'static str, Box<dyn Fn() -> Result<RawTensor<B>> + 'a>);
    let cases: Vec<Case<'_, B>> = vec![
        ("matmul_64x784x1024", Box::new(|| x.matmul(&w1))),
        ("matmul_64x1024x1024", Box::new(|| h.matmul(&w2))),
        ("matmul_tn_784x64x1024", Box::new(|| xt.matmul(&h))),
        (
            "matmul_nt_64x1024x1024",
            Box::new(|| h.matmul(&w2.transpose(0, 1)?)),
        ),
        ("relu_64x1024", Box::new(|| h.relu())),
        ("sum_rows_64x1024", Box::new(|| h.sum(&[0], false))),
        ("softmax_64x1024", Box::new(|| h.softmax(1))),
    ];
    for (label, f) in cases {
        let ms = time_ms::<B>(dev, reps, || f().map(|_| ()))?;
        println!("bench=op impl=kiln backend={name} op={label} ms={ms:.3}");
    }

    Ok(())
}

/// Each matrix product of W1's batch-256 training step and of its batch-1 inference
/// (`m×k×n`; `t` marks an operand read transposed), queued 20 times before one
/// synchronisation: the device time per product. On wgpu, once with the kernel Kiln
/// picks (split over K where the output has few tiles) and once pinned to the unsplit
/// tiled kernel; CUDA's products are cuBLASLt's either way.
fn products<B: Backend>(dev: &B::Device, name: &str, reps: usize) -> Result<()> {
    let dist = RandDist::Normal {
        mean: 0.0,
        std: 1.0,
    };
    let r = |d: &[usize], seed| RawTensor::<B>::rand(d, dist, seed, DType::F32, dev);
    // (label, a's stored dims, transposed, b's stored dims, transposed)
    type Case = (&'static str, [usize; 2], bool, [usize; 2], bool);
    let shapes: [Case; 11] = [
        ("256x784x1024", [256, 784], false, [784, 1024], false),
        ("256x1024x1024", [256, 1024], false, [1024, 1024], false),
        ("256x1024x10", [256, 1024], false, [1024, 10], false),
        ("256x10x1024_bt", [256, 10], false, [1024, 10], true),
        ("256x1024x1024_bt", [256, 1024], false, [1024, 1024], true),
        ("1024x256x10_at", [256, 1024], true, [256, 10], false),
        ("1024x256x1024_at", [256, 1024], true, [256, 1024], false),
        ("784x256x1024_at", [256, 784], true, [256, 1024], false),
        ("1x784x1024", [1, 784], false, [784, 1024], false),
        ("1x1024x1024", [1, 1024], false, [1024, 1024], false),
        ("1x1024x10", [1, 1024], false, [1024, 10], false),
    ];
    let queued = 20;
    let pins: &[(&str, kiln_cubecl::ProductKernel)] = if name == "wgpu" {
        &[
            ("auto", kiln_cubecl::ProductKernel::Auto),
            ("unsplit", kiln_cubecl::ProductKernel::Tiled { splits: 1 }),
        ]
    } else {
        &[("auto", kiln_cubecl::ProductKernel::Auto)]
    };
    for (i, (label, ad, at, bd, bt)) in shapes.into_iter().enumerate() {
        let view = |t: RawTensor<B>, transposed: bool| {
            if transposed {
                t.transpose(0, 1)
            } else {
                Ok(t)
            }
        };
        let a = view(r(&ad, 10 + i as u64)?, at)?;
        let b = view(r(&bd, 40 + i as u64)?, bt)?;
        let (m, k, n) = (a.dims()[0], a.dims()[1], b.dims()[1]);
        for &(kernel, pin) in pins {
            kiln_cubecl::set_product_kernel(pin);
            let ms = time_ms::<B>(dev, reps, || {
                for _ in 0..queued {
                    a.matmul(&b)?;
                }
                Ok(())
            });
            let checked = check_product(&a, &b);
            kiln_cubecl::set_product_kernel(kiln_cubecl::ProductKernel::Auto);
            checked.map_err(|e| {
                kiln_tensor::Error::Device(format!("product {label} ({kernel}): {e}"))
            })?;
            let ms = ms? / queued as f64;
            let tflops = 2.0 * (m * k * n) as f64 / (ms * 1e-3) / 1e12;
            println!(
                "bench=product impl=kiln backend={name} shape={label} kernel={kernel} ms={ms:.4} tflops={tflops:.2}"
            );
        }
    }
    Ok(())
}

/// `a · b` against an f64 product on the host at 64 spread-out elements, each within
/// the rounding of a K-term f32 sum: a benchmark of a wrong kernel fails.
fn check_product<B: Backend>(a: &RawTensor<B>, b: &RawTensor<B>) -> Result<()> {
    let (m, k, n) = (a.dims()[0], a.dims()[1], b.dims()[1]);
    let got = a.matmul(b)?.to_vec::<f32>()?;
    let (av, bv) = (
        a.contiguous()?.to_vec::<f32>()?,
        b.contiguous()?.to_vec::<f32>()?,
    );
    for s in 0..64 {
        let (i, j) = ((s * 7919) % m, (s * 104_729) % n);
        let (mut exact, mut magnitude) = (0f64, 0f64);
        for kk in 0..k {
            let p = av[i * k + kk] as f64 * bv[kk * n + j] as f64;
            exact += p;
            magnitude += p.abs();
        }
        let g = got[i * n + j] as f64;
        if (g - exact).abs() > (k as f64 + 2.0) * 1.2e-7 * magnitude {
            return Err(kiln_tensor::Error::Device(format!(
                "[{i}, {j}] is {g}, the f64 reference {exact}"
            )));
        }
    }
    Ok(())
}

/// The host's cost per launch: a small op (relu of 64×1024) and one whose device work
/// is nothing (relu of 16), each queued 200 times before one synchronisation, with the
/// calling thread's CPU time per launch; then the round trip of one tiny launch and a
/// synchronisation, and of one tiny launch and a read of its result.
fn launch<B: Backend>(dev: &B::Device, name: &str, reps: usize) -> Result<()> {
    let dist = RandDist::Normal {
        mean: 0.0,
        std: 1.0,
    };
    let r = |d: &[usize], seed| RawTensor::<B>::rand(d, dist, seed, DType::F32, dev);
    let queued = 200;
    for (label, x) in [
        ("relu_64x1024", r(&[64, 1024], 4)?),
        ("relu_16", r(&[16], 6)?),
    ] {
        let cpu_start = thread_cpu_ms();
        let ms = time_ms::<B>(dev, reps, || {
            for _ in 0..queued {
                x.relu()?;
            }
            Ok(())
        })? / queued as f64;
        // The calling thread's CPU time per launch, over every rep and the warm-ups
        // (synchronisations included: waits do not count).
        let host_us = 1e3 * (thread_cpu_ms() - cpu_start) / ((reps.max(1) + 2) * queued) as f64;
        println!(
            "bench=op impl=kiln backend={name} op={label} task=amortised ms={ms:.4} host_us={host_us:.2}"
        );
    }
    // One launch and a synchronisation: the round trip a read waits for at least.
    let tiny = r(&[16], 6)?;
    let ms = time_ms::<B>(dev, reps * 5, || tiny.relu().map(|_| ()))?;
    println!("bench=op impl=kiln backend={name} op=relu_16 task=synchronised ms={ms:.4}");
    // One launch and its result read back (batch-1 inference's pattern).
    let ms = time_ms::<B>(dev, reps * 5, || tiny.relu()?.to_vec::<f32>().map(|_| ()))?;
    println!("bench=op impl=kiln backend={name} op=relu_16 task=read ms={ms:.4}");
    Ok(())
}

/// The CPU time the calling thread has used, in milliseconds.
fn thread_cpu_ms() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to write and a clock every Linux has.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 * 1e3 + t.tv_nsec as f64 * 1e-6
}

/// Runs every family of the conformance suite (what `conformance_tests!` expands to),
/// catching each family's panic, one line per family.
fn conformance<B: Backend>(dev: &B::Device, name: &str, config: &Config) -> Result<()> {
    let families = kiln_tensor::conformance_families!(B);
    let (mut ok, mut failed) = (0, Vec::new());
    let start = Instant::now();
    for (family, f) in families {
        let t = Instant::now();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(dev, config)));
        let status = if r.is_ok() { "ok" } else { "FAILED" };
        println!(
            "conformance={family} backend={name} result={status} secs={:.1}",
            t.elapsed().as_secs_f64()
        );
        if r.is_ok() {
            ok += 1;
        } else {
            failed.push(family);
        }
    }
    println!(
        "conformance=all backend={name} passed={ok} failed={} secs={:.1} dtypes={:?} failures={failed:?}",
        failed.len(),
        start.elapsed().as_secs_f64(),
        config.dtypes
    );
    if failed.is_empty() {
        Ok(())
    } else {
        Err(kiln_tensor::Error::Device(format!(
            "{} conformance famil{} failed: {failed:?}",
            failed.len(),
            if failed.len() == 1 { "y" } else { "ies" }
        )))
    }
}

/// Attention over `[32, 8, T, 64]` (W3's batch and heads), T from 128 to 1024, causal
/// and not, in f32 and (on CUDA) bf16: the fused op's forward pass and its forward and
/// backward passes (the output, the row statistics and the three gradients), and the
/// same attention as primitives (the scores in memory) beside it, with the largest
/// difference of the fused output from the primitives'. TFLOP/s count
/// FlashAttention's way: `4·B·H·T²·E` for the forward pass (half when causal) and 2.5
/// times that for the backward pass.
fn attention<B: Backend>(dev: &B::Device, name: &str, reps: usize) -> Result<()> {
    let (batch, heads, e) = (32usize, 8usize, 64usize);
    let dtypes: &[DType] = if name == "cuda" {
        &[DType::F32, DType::BF16]
    } else {
        &[DType::F32]
    };
    let dist = RandDist::Normal {
        mean: 0.0,
        std: 1.0,
    };
    let b = &mut Eager::<B>::new(dev.clone());
    for &dtype in dtypes {
        for t in [128usize, 256, 512, 1024] {
            let dims = [batch, heads, t, e];
            let mut input = |seed| {
                let x = RawTensor::<B>::rand(&dims, dist, seed, DType::F32, dev)?;
                b.cast(&x, dtype)
            };
            let (q, k, v, g) = (input(1)?, input(2)?, input(3)?, input(4)?);
            for causal in [true, false] {
                let spec = AttentionSpec::new(1.0 / (e as f64).sqrt(), causal);
                let fused = b.attention(&q, &k, &v, spec)?;
                let unfused = attention_by_primitives(b, &q, &k, &v, &spec)?;
                let f = b.cast(&fused, DType::F32)?.to_vec::<f32>()?;
                let u = b.cast(&unfused, DType::F32)?.to_vec::<f32>()?;
                let diff = f
                    .iter()
                    .zip(&u)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max);
                // The two spellings round differently (the fused kernel rounds bf16
                // weights before their product with v); more than that is a wrong kernel.
                let tolerance = if dtype == DType::F32 { 1e-4 } else { 0.1 };
                if diff.is_nan() || diff > tolerance {
                    return Err(kiln_tensor::Error::Device(format!(
                        "attention {dtype} T={t} causal={causal}: fused differs from the primitives by {diff:e}"
                    )));
                }
                let fwd = time_ms::<B>(dev, reps, || b.attention(&q, &k, &v, spec).map(|_| ()))?;
                let both = time_ms::<B>(dev, reps, || {
                    let out = b.attention(&q, &k, &v, spec)?;
                    attention_vjp(b, &spec, &[&q, &k, &v], &out, &g).map(|_| ())
                })?;
                let prim = time_ms::<B>(dev, reps, || {
                    attention_by_primitives(b, &q, &k, &v, &spec).map(|_| ())
                })?;
                let flops =
                    4.0 * (batch * heads * t * t * e) as f64 * if causal { 0.5 } else { 1.0 };
                let tf = |ms: f64, f: f64| f / ms / 1e9;
                println!(
                    "bench=attention impl=kiln backend={name} dtype={dtype} T={t} causal={causal} fwd_ms={fwd:.4} fwd_tflops={:.1} fwdbwd_ms={both:.4} fwdbwd_tflops={:.1} primitives_fwd_ms={prim:.4} max_diff={diff:.2e}",
                    tf(fwd, flops),
                    tf(both, 3.5 * flops),
                );
            }
        }
    }
    Ok(())
}

/// Runs each workload, one line per figure or failure; `false` when any failed.
#[allow(dead_code)]
fn run<B: Backend>(
    dev: &B::Device,
    name: &str,
    workloads: &str,
    reps: usize,
    epochs: usize,
    data: &str,
    w2_n: usize,
) -> bool {
    let mut all_ok = true;
    for w in workloads.split(',') {
        let r = match w.trim() {
            "w1" => w1::<B>(dev, name, reps),
            "w2" => w2::<B>(dev, name, reps),
            "w4" => w4::<B>(dev, name, reps),
            "dynamic" => dynamic::<B>(dev, name, reps, w2_n),
            "dynamic-first" => dynamic_first::<B>(dev, name, reps),
            "mnist" => mnist::<B>(dev, name, epochs, data),
            "ops" => ops::<B>(dev, name, reps),
            "launch" => launch::<B>(dev, name, reps),
            "products" => products::<B>(dev, name, reps),
            "attention" => attention::<B>(dev, name, reps),
            #[cfg(feature = "cuda")]
            "w1graph" if name == "cuda" => kiln_cubecl::CudaDevice::first().and_then(|d| {
                for tf32 in [false, true] {
                    kiln_cubecl::cuda::set_allow_tf32(tf32);
                    w1_graph::<256>(&d, reps, tf32)?;
                    w1_graph::<4096>(&d, reps, tf32)?;
                }
                kiln_cubecl::cuda::set_allow_tf32(false);
                w1_graph_infer(&d, reps)?;
                for s in d.algorithm_searches() {
                    println!(
                        "bench=cublaslt-search problem=\"{}\" candidates={} heuristic_us={:.2} chosen_us={:.2}",
                        s.problem, s.candidates, s.heuristic_us, s.chosen_us
                    );
                }
                Ok(())
            }),
            #[cfg(feature = "cuda")]
            "dynprofile-w2" | "dynprofile-w1" if name == "cuda" => kiln_cubecl::CudaDevice::first()
                .and_then(|d| dynamic_profile(&d, &w.trim()["dynprofile-".len()..])),
            #[cfg(feature = "cuda")]
            "w1profile" if name == "cuda" => {
                kiln_cubecl::CudaDevice::first().and_then(|d| w1_profile(&d))
            }
            "conformance" => {
                let config = if name == "wgpu" {
                    Config::vulkan()
                } else {
                    Config::all()
                };
                conformance::<B>(dev, name, &config)
            }
            other => Err(kiln_tensor::Error::invalid(
                "gpu_bench",
                format!("unknown workload {other:?} (known: w1, w2, w4, attention, dynamic, dynamic-first, mnist, ops, launch, products, conformance; on cuda also w1graph, w1profile, dynprofile-w1, dynprofile-w2)"),
            )),
        };
        if let Err(e) = r {
            println!("bench={w} impl=kiln backend={name} error={e}");
            all_ok = false;
        }
    }
    all_ok
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let get = |flag: &str, default: &str| -> String {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1).cloned())
            .unwrap_or_else(|| default.to_string())
    };
    let backend = get("--backend", "cuda");
    let workloads = get("--workloads", "w1,w2,w4");
    let number = |flag: &str, default: &str| -> usize {
        let v = get(flag, default);
        v.parse().unwrap_or_else(|_| {
            eprintln!("error: {flag} takes a whole number, got {v:?}");
            std::process::exit(2)
        })
    };
    let reps = number("--reps", "20");
    let epochs = number("--epochs", "5");
    // Elements of the dynamic W2 chain (2^26 = 256 MiB is over lavapipe's binding cap).
    let w2_log2 = number("--w2-log2", "26");
    if !(4..=30).contains(&w2_log2) {
        eprintln!("error: --w2-log2 takes 4 to 30, got {w2_log2}");
        std::process::exit(2)
    }
    let w2_n = 1usize << w2_log2;
    // The MNIST folder (default: the one beside kiln-models' sources at build time).
    let data = get("--data", "");
    // `--search on`: products time cuBLASLt's candidates (off: its heuristic's choice).
    #[cfg(feature = "cuda")]
    match get("--search", "off").as_str() {
        "off" => {}
        "on" => kiln_cubecl::cuda::set_algorithm_search(true),
        other => {
            eprintln!("error: --search takes on or off, got {other:?}");
            std::process::exit(2)
        }
    }
    // `--wait-spin-us N`: how long wgpu's waits poll before blocking (A/B of the wait).
    #[cfg(feature = "wgpu")]
    if args.iter().any(|a| a == "--wait-spin-us") {
        let us = number("--wait-spin-us", "0");
        kiln_cubecl::wgpu::set_wait_spin_us(u32::try_from(us).unwrap_or_else(|_| {
            eprintln!("error: --wait-spin-us takes at most {}, got {us}", u32::MAX);
            std::process::exit(2)
        }));
    }
    // `--product-kernel`: wgpu's product kernel for every workload (auto: Kiln's choice).
    kiln_cubecl::set_product_kernel(match get("--product-kernel", "auto").as_str() {
        "auto" => kiln_cubecl::ProductKernel::Auto,
        "unsplit" => kiln_cubecl::ProductKernel::Tiled { splits: 1 },
        "direct" => kiln_cubecl::ProductKernel::Direct,
        other => {
            eprintln!("error: --product-kernel takes auto, unsplit or direct, got {other:?}");
            std::process::exit(2)
        }
    });
    // Every failure (a workload, a device that does not open, an unknown backend)
    // makes the exit status non-zero, so scripts and CI see it.
    let ok = match backend.as_str() {
        #[cfg(feature = "cuda")]
        "cuda" => match kiln_cubecl::CudaDevice::first() {
            Ok(d) => {
                println!("# device {}", d.name());
                run::<kiln_cubecl::Cuda>(&d, "cuda", &workloads, reps, epochs, &data, w2_n)
            }
            Err(e) => {
                println!("bench=open backend=cuda error={e}");
                false
            }
        },
        #[cfg(feature = "wgpu")]
        "wgpu" => match kiln_cubecl::WgpuDevice::first() {
            Ok(d) => {
                println!("# device {}", d.name());
                run::<kiln_cubecl::Wgpu>(&d, "wgpu", &workloads, reps, epochs, &data, w2_n)
            }
            Err(e) => {
                println!("bench=open backend=wgpu error={e}");
                false
            }
        },
        other => {
            eprintln!("error: backend {other:?} is not built in (features: cuda, wgpu)");
            false
        }
    };
    if !ok {
        std::process::exit(1);
    }
}
