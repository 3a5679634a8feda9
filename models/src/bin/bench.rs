//! `kiln-bench`: the shared workloads of DESIGN.md, one parseable line per figure:
//! `bench=W4 impl=kiln backend={name} ... ms=… gflops=…`, on the device `--device` names
//! (each timed run ends with a device synchronisation). `scripts/bench_cpu.py` runs it
//! beside PyTorch in the same run and prints the ratios.

use clap::Parser;

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;
use kiln::device::{run_on, OnDevice};
use kiln::dynamic::LazyTensor;
use kiln::prelude::*;
use kiln::tensor::HostData;
use kiln::tensor::{DType, RandDist};
use kiln::train::learner::Supervised;
use kiln::train::optim::{AdamW, AdamWConfig, Optimizer, Sgd, SgdConfig};
use kiln::train::replay::{StepInput, StepReplay};
use kiln_models::chain::Chain;
use kiln_models::dynamic::DynamicMlp;
use kiln_models::gpt::{GptModel, Ids};

#[path = "../gpt_instances.rs"]
mod gpt_instances;
use gpt_instances::SmallGpt;
use kiln_models::lenet::LeNet;
use kiln_models::mlp::Mlp;
use kiln_models::text::{windows, Corpus};
use std::time::Instant;

/// Run Kiln's benchmark workloads on a device.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Workloads to run (comma-separated): w1, w2, w3, w4, cnn (LeNet's and a small ResNet's training steps at batch 64 and 128, their inference at batch 1 and 256), dynamic (the dynamic path's own costs).
    #[arg(long, default_value = "w1,w2,w4")]
    workloads: String,
    /// W3's configurations (comma-separated): small, small-bf16, small-f16, w3, w3-bf16, w3-f16, w3-tf32 (f32 with TF32 products, CUDA only; the bf16 lines on the CPU name the kernel their products ran on).
    #[arg(long, default_value = "small")]
    w3_configs: String,
    /// W1 variants to run (comma-separated): static, static-unfused, dynamic, infer, infer-int8 (batch-1 inference of the MLP's int8 checkpoint, `kiln-quantize`'s, through its int8 instance; on the CPU the line names the int8 kernel).
    #[arg(long, default_value = "static,static-unfused,dynamic,infer")]
    variants: String,
    /// Timed repetitions per figure (the median is printed).
    #[arg(long, default_value_t = 10)]
    reps: usize,
    #[command(flatten)]
    device: kiln_models::cli::DeviceArg,
    #[command(flatten)]
    data: kiln_models::cli::DataArg,
}

/// Median wall time in milliseconds of `reps` runs of `f` on `dev`, each ended by a
/// synchronisation (work queued on a GPU is counted), after two warm-up runs: a
/// training step's second run is the first with optimizer state, whose update kernels
/// a GPU compiles then (one warm-up left W3's first f32 figure on the H200 at 268 ms
/// against 60.6 once warm).
fn time_ms<Be: Backend>(
    dev: &Be::Device,
    reps: usize,
    mut f: impl FnMut() -> Result<()>,
) -> Result<f64> {
    for _ in 0..2 {
        f()?;
    }
    Be::synchronize(dev)?;
    let mut t: Vec<f64> = (0..reps.max(1))
        .map(|_| {
            let s = Instant::now();
            f()?;
            Be::synchronize(dev)?;
            Ok(s.elapsed().as_secs_f64() * 1e3)
        })
        .collect::<Result<_>>()?;
    t.sort_by(f64::total_cmp);
    Ok(t[t.len() / 2])
}

fn w4<Be: Backend>(dev: &Be::Device, name: &str, reps: usize) -> Result<()> {
    let n = 1024;
    let dist = RandDist::Normal {
        mean: 0.0,
        std: 1.0,
    };
    let a = RawTensor::<Be>::rand(&[n, n], dist, 1, DType::F32, dev)?;
    let b = RawTensor::<Be>::rand(&[n, n], dist, 2, DType::F32, dev)?;
    let ms = time_ms::<Be>(dev, reps, || a.matmul(&b).map(|_| ()))?;
    let gflops = 2.0 * (n * n * n) as f64 / (ms * 1e-3) / 1e9;
    println!(
        "bench=W4 impl=kiln backend={name} dtype=f32 shape={n}x{n}x{n} ms={ms:.3} gflops={gflops:.1}"
    );
    Ok(())
}

fn w2<Be: Backend>(dev: &Be::Device, name: &str, reps: usize) -> Result<()> {
    let n = 1usize << 26;
    let x = RawTensor::<Be>::rand(
        &[n],
        RandDist::Normal {
            mean: 0.0,
            std: 1.0,
        },
        3,
        DType::F32,
        dev,
    )?;
    let chain = || -> Result<RawTensor<Be>> {
        let h = x.mul_scalar(1.5)?.add_scalar(0.5)?.relu()?;
        h.mul(&x.sigmoid()?)
    };
    let ms = time_ms::<Be>(dev, reps, || chain().map(|_| ()))?;
    // Counted as one read and one write of f32 per element, whatever the kernels do.
    let gbps = (n * 8) as f64 / (ms * 1e-3) / 1e9;
    // What the kernels move: each op reads its inputs and writes its output.
    let unfused_bytes = n * 4 * (2 + 2 + 2 + 2 + 3);
    println!("bench=W2 impl=kiln backend={name} variant=unfused n={n} ms={ms:.3} gbps={gbps:.2} bytes_moved={unfused_bytes}");
    let chain = Chain::<Be>::init(dev, 0)?;
    let typed = Tensor::<Be, (Const<{ 1usize << 26 }>,)>::from_raw(x.clone())?;
    let ms = time_ms::<Be>(dev, reps, || chain.forward(&typed).map(|_| ()))?;
    let gbps = (n * 8) as f64 / (ms * 1e-3) / 1e9;
    let plan = kiln::fusion::Plan::parse(Chain::<Be>::fusion_plans()[0].1)?;
    let (r, w) = plan.total_bytes();
    let fused_bytes = r.eval(&|_| Some(n), &|_| None)? + w.eval(&|_| Some(n), &|_| None)?;
    println!("bench=W2 impl=kiln backend={name} variant=fused n={n} ms={ms:.3} gbps={gbps:.2} bytes_moved={fused_bytes}");
    // The same chain on the dynamic path: recorded, planned (cached) and run at a read.
    let lazy_x = LazyTensor::from_raw(x.clone());
    // The result bound before the read: a pending value something still holds at a
    // read is computed too, and a chain's temporaries live to the end of its statement.
    let ms = time_ms::<Be>(dev, reps, || {
        let y = lazy_x
            .mul_scalar(1.5)?
            .add_scalar(0.5)?
            .relu()?
            .mul(&lazy_x.sigmoid()?)?;
        y.value().map(|_| ())
    })?;
    let gbps = (n * 8) as f64 / (ms * 1e-3) / 1e9;
    println!("bench=W2 impl=kiln backend={name} variant=dynamic n={n} ms={ms:.3} gbps={gbps:.2} bytes_moved={fused_bytes}");
    Ok(())
}

/// The dynamic path's own costs: the host time of a cache hit on a tiny graph (record
/// four ops, build the key, find the program, run it on 4 elements), and the first
/// plan of W1's training step (planning, then the first run) against a warm step.
fn dynamic_costs<Be: Backend>(dev: &Be::Device, name: &str, reps: usize) -> Result<()> {
    let x = LazyTensor::from_raw(RawTensor::<Be>::from_vec(
        vec![1.0f32, -2.0, 3.0, -4.0],
        &[4],
        dev,
    )?);
    let us = 1e3
        * time_ms::<Be>(dev, reps * 100, || {
            let y = x.mul_scalar(1.5)?.add_scalar(0.5)?.relu()?.mul(&x)?;
            y.value().map(|_| ())
        })?;
    println!("bench=dynamic-hit impl=kiln backend={name} graph=4ops n=4 us={us:.2}");
    let model = DynamicMlp::<Be>::new(784, 1024, 10, dev, 1)?;
    let xs = LazyTensor::from_raw(RawTensor::<Be>::rand(
        &[256, 784],
        RandDist::Normal {
            mean: 0.0,
            std: 1.0,
        },
        5,
        DType::F32,
        dev,
    )?);
    let labels: Vec<i32> = (0..256).map(|i| i % 10).collect();
    let ys = LazyTensor::from_raw(RawTensor::<Be>::from_vec(labels, &[256], dev)?);
    kiln::dynamic::clear_cache::<Be>();
    let start = Instant::now();
    model.loss(&xs, &ys)?.backward()?;
    let first = start.elapsed().as_secs_f64() * 1e3;
    let s = kiln::dynamic::cache_stats::<Be>();
    let warm = time_ms::<Be>(dev, reps, || model.loss(&xs, &ys)?.backward().map(|_| ()))?;
    println!(
        "bench=dynamic-first-plan impl=kiln backend={name} graph=W1-step batch=256 first_ms={first:.3} planning_ms={:.3} first_run_ms={:.3} warm_ms={warm:.3}",
        s.planning.as_secs_f64() * 1e3,
        s.first_runs.as_secs_f64() * 1e3
    );
    Ok(())
}

/// W1 at one batch size: a training step (gradients + SGD) of the `#[model]` MLP, of
/// the same MLP on the dynamic path (runtime tape), and batch-1 inference latency.
fn w1_batch<Be: Backend, const B: usize>(
    dev: &Be::Device,
    name: &str,
    reps: usize,
    variants: &[&str],
) -> Result<()> {
    let mut model = Mlp::<Be>::init(dev, 1)?;
    let mut opt = Sgd::<Be>::new(SgdConfig {
        lr: 0.01,
        momentum: 0.9,
        ..SgdConfig::default()
    })?;
    let x = Tensor::<Be, Rank2<B, 784>>::normal(0.0, 1.0, 5, dev)?;
    let labels: Vec<i32> = (0..B as i32).map(|i| i % 10).collect();
    let y = Tensor::<Be, (Const<B>,), i32>::from_vec(labels, &[B], dev)?;
    for fused in [true, false] {
        let variant = if fused { "static" } else { "static-unfused" };
        if !variants.contains(&variant) {
            continue;
        }
        model.set_fused(fused);
        let ms = time_ms::<Be>(dev, reps, || {
            let (_, grads) = model.loss_and_grad(&x, &y)?;
            if fused {
                opt.step(&mut model, &grads)
            } else {
                // Op by op throughout: the optimizer's eager update too.
                model.update_params(&grads, "", &mut |name, p, g| {
                    *p = opt.update_param(name, p, g)?;
                    Ok(())
                })
            }
        })?;
        println!(
            "bench=W1 impl=kiln backend={name} variant={variant} task=train batch={B} ms={ms:.3}"
        );
    }
    if !variants.contains(&"dynamic") {
        return Ok(());
    }
    let mut dynamic = DynamicMlp::<Be>::new(784, 1024, 10, dev, 1)?;
    let mut opt = Sgd::<Be>::new(SgdConfig {
        lr: 0.01,
        momentum: 0.9,
        ..SgdConfig::default()
    })?;
    let (xl, yl) = (
        LazyTensor::from_raw(x.raw().clone()),
        LazyTensor::from_raw(y.raw().clone()),
    );
    let ms = time_ms::<Be>(dev, reps, || {
        let grads = dynamic.loss(&xl, &yl)?.backward()?;
        opt.step(&mut dynamic, &grads)
    })?;
    println!("bench=W1 impl=kiln backend={name} variant=dynamic task=train batch={B} ms={ms:.3}");
    Ok(())
}

/// Batch-1 inference of the MLP (seed 1, as the f32 figure's) from its int8 checkpoint
/// (`kiln-quantize`'s), through its int8 instance, the logits in host memory; on the
/// CPU the line names the int8 kernel.
fn w1_int8<Be: Backend>(dev: &Be::Device, name: &str, reps: usize) -> Result<()> {
    use kiln::train::checkpoint::{int8::quantize_int8, load_new, save};
    let dir = std::env::temp_dir().join(format!("kiln-bench-int8-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let (f32_file, int8_file) = (
        dir.join("mlp.safetensors"),
        dir.join("mlp-int8.safetensors"),
    );
    save(&Mlp::<Cpu>::init(&CpuDevice, 1)?, &f32_file)?;
    let model = quantize_int8(&f32_file, &int8_file)
        .and_then(|_| load_new::<Be, kiln_models::mlp::MlpInt8<Be>>(&int8_file, dev, false));
    std::fs::remove_dir_all(&dir).ok();
    let model = model?;
    let x = Tensor::<Be, Rank2<1, 784>>::normal(0.0, 1.0, 6, dev)?;
    let ms = time_ms::<Be>(dev, reps * 20, || model.forward(&x)?.to_vec().map(|_| ()))?;
    let kernel = match name {
        "cpu" => format!(" kernel={}", kiln::cpu::quant::Int8Kernel::detect().name()),
        _ => String::new(),
    };
    println!(
        "bench=W1 impl=kiln backend={name} variant=int8 task=infer-int8 batch=1{kernel} ms={ms:.4}"
    );
    Ok(())
}

fn w1<Be: Backend>(dev: &Be::Device, name: &str, reps: usize, variants: &[&str]) -> Result<()> {
    w1_batch::<Be, 256>(dev, name, reps, variants)?;
    if variants.contains(&"infer-int8") {
        w1_int8::<Be>(dev, name, reps)?;
    }
    if !variants.contains(&"infer") {
        return Ok(());
    }
    let model = Mlp::<Be>::init(dev, 1)?;
    let x = Tensor::<Be, Rank2<1, 784>>::normal(0.0, 1.0, 6, dev)?;
    // The logits read back to the host, as a caller of an inference binary needs them.
    let ms = time_ms::<Be>(dev, reps * 20, || model.forward(&x)?.to_vec().map(|_| ()))?;
    println!("bench=W1 impl=kiln backend={name} variant=static task=infer batch=1 ms={ms:.4}");
    Ok(())
}

#[path = "../w3_instances.rs"]
mod w3_instances;
use w3_instances::{SmallGptBf16, SmallGptF16, W3Gpt, W3GptBf16, W3GptF16};

/// W3 in one configuration: a GPT training step (loss and gradients over `B` windows
/// of the model's context, then AdamW) on seeded windows of the Shakespeare text.
fn w3_config<Be: Backend, M: GptModel<Be> + Supervised<Be>, const B: usize, const T: usize>(
    dev: &Be::Device,
    name: &str,
    config: &str,
    reps: usize,
    corpus: &Corpus,
) -> Result<()> {
    let mut model = M::init_named(dev, 1, "")?;
    let mut opt = AdamW::<Be>::new(AdamWConfig {
        lr: 1e-3,
        weight_decay: 0.0,
        ..AdamWConfig::default()
    })?;
    let (ids, next) = windows(&corpus.train, B, T, 7)?;
    let x = Ids::<Be, B, T>::from_vec(ids.clone(), &[B, T], dev)?;
    let y = Ids::<Be, B, T>::from_vec(next.clone(), &[B, T], dev)?;
    let ms = time_ms::<Be>(dev, reps, || {
        let (_, grads) = model.loss_and_grad(&x, &y)?;
        opt.step(&mut model, &grads)
    })?;
    let kernel = if name == "cpu" && config.ends_with("-bf16") {
        format!(" gemm_bf16={}", kiln::cpu::gemm::bf16_kernel())
    } else {
        String::new()
    };
    let params = model.num_params();
    let report = |variant: &str, ms: f64| {
        let tokens_per_s = (B * T) as f64 / (ms * 1e-3);
        println!(
            "bench=W3 impl=kiln backend={name} task={config} step={variant} batch={B} ms={ms:.2} tokens_per_s={tokens_per_s:.0} params={params}{kernel}"
        );
    };
    report("planned", ms);
    // A loss-scaled step decides on the host whether to take each step: not replayed.
    if Be::captures(dev) && model.loss_scale().is_none() {
        // The step as `kiln-train` runs it on a capturing device: captured on its
        // second run, then replayed with the windows written into the graph's inputs
        // (each replay reads its loss back, as training does).
        let mut steps = StepReplay::new(dev, true, &opt, <M as Supervised<Be>>::draws_at_random());
        let dims = [B, T];
        let mut replayed = || {
            let inputs = [&ids, &next]
                .map(|v| StepInput {
                    data: HostData::I32(v.clone()),
                    dims: &dims,
                })
                .into();
            steps
                .step(&mut model, &mut opt, inputs, &mut |m, xy| {
                    m.loss_and_grads(&xy[0], &xy[1])
                })
                .map(drop)
        };
        let ms = time_ms::<Be>(dev, reps * 3, &mut replayed)?;
        let replaying = steps.replaying();
        steps.finish(&model);
        if !replaying {
            return Err(Error::invalid(
                "kiln-bench",
                "the device captures, but the W3 step was not replayed",
            ));
        }
        report("replayed", ms);
    }
    if std::env::var_os("KILN_PROFILE_STEP").is_some() {
        profiled_step(name, || {
            let (_, grads) = model.loss_and_grad(&x, &y)?;
            opt.step(&mut model, &grads)?;
            Be::synchronize(dev)
        })?;
    }
    Ok(())
}

/// Runs `run` with CUDA's f32 products allowed onto TF32 tensor cores (PyTorch's
/// `allow_tf32`), then turns them back off; TF32 is a CUDA setting, refused elsewhere.
fn with_tf32(name: &str, run: impl FnOnce() -> Result<()>) -> Result<()> {
    match name {
        #[cfg(feature = "cuda")]
        "cuda" => {
            kiln::cubecl::cuda::set_allow_tf32(true);
            let result = run();
            kiln::cubecl::cuda::set_allow_tf32(false);
            result
        }
        _ => {
            drop(run);
            Err(Error::invalid(
                "kiln-bench",
                format!("w3-tf32 runs W3's f32 products on CUDA's TF32 tensor cores, which the device {name} does not have"),
            ))
        }
    }
}

/// With `KILN_PROFILE_STEP` set, one more planned step of each W3 configuration runs
/// inside a CUDA profiler range, for `ncu --profile-from-start off`: exactly one
/// step's kernels (the planned step launches what a replay does).
fn profiled_step(name: &str, step: impl FnOnce() -> Result<()>) -> Result<()> {
    match name {
        #[cfg(feature = "cuda")]
        "cuda" => kiln::cubecl::cuda::profiler_range(step),
        _ => {
            drop(step);
            Err(Error::invalid(
                "KILN_PROFILE_STEP",
                format!("profiles a CUDA step, not one on {name}"),
            ))
        }
    }
}

/// W3: the GPT training step in the small configuration and, when asked for, in W3's
/// own (width 512, 6 blocks, context 256: about 30 times the work), on windows of the
/// Shakespeare text in the data folder `data` (`--data`).
fn w3<Be: Backend>(
    dev: &Be::Device,
    name: &str,
    reps: usize,
    configs: &[&str],
    data: &std::path::Path,
) -> Result<()> {
    let corpus = Corpus::shakespeare_in(data)?;
    for c in configs {
        match *c {
            "small" => w3_config::<Be, SmallGpt<Be>, 32, 128>(dev, name, "small", reps, &corpus)?,
            "small-bf16" => {
                w3_config::<Be, SmallGptBf16<Be>, 32, 128>(dev, name, "small-bf16", reps, &corpus)?
            }
            "w3" => {
                w3_config::<Be, W3Gpt<Be>, 32, 256>(dev, name, "w3", reps.div_ceil(5), &corpus)?
            }
            "w3-bf16" => w3_config::<Be, W3GptBf16<Be>, 32, 256>(
                dev,
                name,
                "w3-bf16",
                reps.div_ceil(5),
                &corpus,
            )?,
            "small-f16" => {
                w3_config::<Be, SmallGptF16<Be>, 32, 128>(dev, name, "small-f16", reps, &corpus)?
            }
            "w3-f16" => w3_config::<Be, W3GptF16<Be>, 32, 256>(
                dev,
                name,
                "w3-f16",
                reps.div_ceil(5),
                &corpus,
            )?,
            "w3-tf32" => with_tf32(name, || {
                w3_config::<Be, W3Gpt<Be>, 32, 256>(dev, name, "w3-tf32", reps.div_ceil(5), &corpus)
            })?,
            other => {
                return Err(Error::invalid(
                    "kiln-bench",
                    format!(
                        "unknown W3 configuration {other:?} (known: small, small-bf16, small-f16, w3, w3-bf16, w3-f16, w3-tf32)"
                    ),
                ))
            }
        }
    }
    Ok(())
}

/// The CNN workload: the zoo's LeNet (two convolution + batch-norm + ReLU + max-pool
/// stages, two linear layers with dropout) and [`SmallResNet`] on random 28×28 images.
/// For each, a training step (loss, gradients, SGD with momentum) at batch 64 and 128,
/// and inference (batch norm on its running statistics, the logits read back to the
/// host) at batch 1 and 256.
fn cnn<Be: Backend>(dev: &Be::Device, name: &str, reps: usize) -> Result<()> {
    // On the CPU the lines name the f32 product kernel that ran.
    let kernel = match name {
        "cpu" => format!(" gemm={}", kiln::cpu::gemm::f32_kernel()),
        _ => String::new(),
    };
    /// The four figures of one model.
    macro_rules! cnn_figures {
        ($model:ident, $label:literal) => {{
            fn train<Be: Backend, const B: usize>(
                dev: &Be::Device,
                name: &str,
                kernel: &str,
                reps: usize,
            ) -> Result<()> {
                let mut model = $model::<Be>::init(dev, 1)?;
                let mut opt = Sgd::<Be>::new(SgdConfig {
                    lr: 0.01,
                    momentum: 0.9,
                    ..SgdConfig::default()
                })?;
                let x = Tensor::<Be, (Const<B>, Const<1>, Const<28>, Const<28>)>::normal(
                    0.0, 1.0, 5, dev,
                )?;
                let labels: Vec<i32> = (0..B as i32).map(|i| i % 10).collect();
                let y = Tensor::<Be, (Const<B>,), i32>::from_vec(labels, &[B], dev)?;
                let ms = time_ms::<Be>(dev, reps, || {
                    let (_, grads) = model.loss_and_grad(&x, &y)?;
                    opt.step(&mut model, &grads)
                })?;
                println!(
                    concat!(
                        "bench=",
                        $label,
                        " impl=kiln backend={} task=train batch={} ms={:.3}{}"
                    ),
                    name, B, ms, kernel
                );
                Ok(())
            }
            fn infer<Be: Backend, const B: usize>(
                dev: &Be::Device,
                name: &str,
                kernel: &str,
                reps: usize,
            ) -> Result<()> {
                let model = $model::<Be>::init(dev, 1)?;
                let x = Tensor::<Be, (Const<B>, Const<1>, Const<28>, Const<28>)>::normal(
                    0.0, 1.0, 6, dev,
                )?;
                let ms = time_ms::<Be>(dev, reps, || model.forward(&x)?.to_vec().map(|_| ()))?;
                println!(
                    concat!(
                        "bench=",
                        $label,
                        " impl=kiln backend={} task=infer batch={} ms={:.3}{}"
                    ),
                    name, B, ms, kernel
                );
                Ok(())
            }
            train::<Be, 64>(dev, name, &kernel, reps)?;
            train::<Be, 128>(dev, name, &kernel, reps)?;
            infer::<Be, 1>(dev, name, &kernel, reps * 20)?;
            infer::<Be, 256>(dev, name, &kernel, reps)?;
        }};
    }
    cnn_figures!(LeNet, "LeNet");
    cnn_figures!(SmallResNet, "ResNet");
    Ok(())
}

/// The CNN workload's small ResNet for 28×28 grey images: a 3×3 stem of 16 channels,
/// three basic blocks (two 3×3 convolutions with batch norm, the input added back)
/// of 16, 32 and 64 channels, the last two halving the image with a strided 1×1
/// convolution on their shortcut, global average pooling and a linear head.
#[model]
pub struct SmallResNet {
    stem: Conv2d<1, 16, 3, 1, 1>,
    stem_bn: BatchNorm2d<16>,
    a1: Conv2d<16, 16, 3, 1, 1>,
    a1_bn: BatchNorm2d<16>,
    a2: Conv2d<16, 16, 3, 1, 1>,
    a2_bn: BatchNorm2d<16>,
    b1: Conv2d<16, 32, 3, 2, 1>,
    b1_bn: BatchNorm2d<32>,
    b2: Conv2d<32, 32, 3, 1, 1>,
    b2_bn: BatchNorm2d<32>,
    b_short: Conv2d<16, 32, 1, 2, 0>,
    b_short_bn: BatchNorm2d<32>,
    c1: Conv2d<32, 64, 3, 2, 1>,
    c1_bn: BatchNorm2d<64>,
    c2: Conv2d<64, 64, 3, 1, 1>,
    c2_bn: BatchNorm2d<64>,
    c_short: Conv2d<32, 64, 1, 2, 0>,
    c_short_bn: BatchNorm2d<64>,
    pool: AvgPool2d<7>,
    head: Linear<64, 10>,
}

#[model]
impl SmallResNet {
    /// Class logits of a batch of images.
    pub fn forward<const B: usize>(&self, x: Tensor<B, 1, 28, 28>) -> Tensor<B, 10> {
        let h = self.stem_bn(self.stem(x)).relu();
        let a = self.a1_bn(self.a1(h)).relu();
        let h = (self.a2_bn(self.a2(a)) + h).relu();
        let b = self.b1_bn(self.b1(h)).relu();
        let h = (self.b2_bn(self.b2(b)) + self.b_short_bn(self.b_short(h))).relu();
        let c = self.c1_bn(self.c1(h)).relu();
        let h = (self.c2_bn(self.c2(c)) + self.c_short_bn(self.c_short(h))).relu();
        self.head(self.pool(h).flatten())
    }

    /// Mean cross-entropy of the logits against integer labels.
    pub fn loss<const B: usize>(&self, x: Tensor<B, 1, 28, 28>, y: Tensor<B, i32>) -> Tensor {
        self.forward(x).cross_entropy(y)
    }
}

/// The items of a comma-separated list.
fn list(s: &str) -> Vec<&str> {
    s.split(',').map(str::trim).collect()
}

/// The workloads `--workloads` names, on whichever backend `--device` opens.
struct Bench<'a>(&'a Args);

impl OnDevice for Bench<'_> {
    type Output = ();

    fn run<Be: Backend>(self, dev: &Be::Device, device: &str) -> Result<()> {
        let args = self.0;
        println!("# device {device}");
        let name = Be::NAME;
        const VARIANTS: [&str; 5] = ["static", "static-unfused", "dynamic", "infer", "infer-int8"];
        if let Some(v) = list(&args.variants).iter().find(|v| !VARIANTS.contains(v)) {
            return Err(Error::invalid(
                "kiln-bench",
                format!("unknown W1 variant {v:?} (known: {})", VARIANTS.join(", ")),
            ));
        }
        for w in args.workloads.split(',') {
            match w.trim() {
                "w1" => w1::<Be>(dev, name, args.reps, &list(&args.variants))?,
                "w2" => w2::<Be>(dev, name, args.reps)?,
                "dynamic" => dynamic_costs::<Be>(dev, name, args.reps)?,
                "w4" => w4::<Be>(dev, name, args.reps)?,
                "cnn" => cnn::<Be>(dev, name, args.reps)?,
                "w3" => w3::<Be>(
                    dev,
                    name,
                    args.reps,
                    &list(&args.w3_configs),
                    &args.data.dir()?,
                )?,
                other => {
                    return Err(Error::invalid(
                        "kiln-bench",
                        format!("unknown workload {other:?} (known: w1, w2, w3, w4, cnn, dynamic)"),
                    ))
                }
            }
        }
        Ok(())
    }
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run_on(args.device.device, Bench(&args)) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
