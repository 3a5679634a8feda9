//! A whole model's fused plans on the GPU backends (wgpu in CI; CUDA where a GPU is)
//! agree with its op-by-op path and with the CPU: the MNIST MLP (values, gradients,
//! SGD steps), LeNet (whose convolutions' columns the plan never stores: these backends
//! write them to memory once per step, `kiln_fusion::windows`), its int8 instance (products whose bias and ReLU are epilogues), causal self-attention, mixed precision (bf16 on CUDA; f16 with loss
//! scaling on both, its loss curve against f32), and steady-state steps that take no
//! new device memory. The fused kernel itself is tested op by op in
//! kiln-cubecl (`tests/fused.rs`).

#![cfg(any(feature = "wgpu", feature = "cuda"))]

use kiln_cpu::{Cpu, CpuDevice};
use kiln_tensor::{Backend, DType, RawTensor, Result};

/// Causal self-attention of width 16 in two heads of 8 (kiln_models' definition).
#[kiln::model]
type TinyAttention = kiln_models::parts::CausalSelfAttention<16, 2>;

/// The checks below for one backend, as tests named after it.
macro_rules! fused_model_tests {
    ($module:ident, $B:ty, $device:expr) => {
        mod $module {
            use super::*;
            #[test]
            fn mlp_plans_match_the_op_by_op_path() -> Result<()> {
                super::mlp_plans_match_the_op_by_op_path::<$B>(&$device)
            }
            #[test]
            fn lenet_plans_match_the_op_by_op_path() -> Result<()> {
                super::lenet_plans_match_the_op_by_op_path::<$B>(&$device)
            }
            #[test]
            fn int8_plans_match_the_op_by_op_path() -> Result<()> {
                super::int8_plans_match_the_op_by_op_path::<$B>(&$device)
            }
            #[test]
            fn attention_plans_match_the_op_by_op_path() -> Result<()> {
                super::attention_plans_match_the_op_by_op_path::<$B>(&$device)
            }
            #[test]
            fn steady_state_steps_take_no_new_device_memory() -> Result<()> {
                super::steady_state_steps_take_no_new_device_memory(&$device)
            }
            #[test]
            fn f16_plans_match_the_op_by_op_path_and_the_cpu() -> Result<()> {
                let dev = $device;
                assert!(
                    dev.dtypes().contains(&DType::F16),
                    "this device holds no f16: {}",
                    dev.name()
                );
                super::f16_plans_match_the_op_by_op_path_and_the_cpu::<$B>(&dev)
            }
            #[test]
            fn f16_training_follows_the_f32_loss_curve() -> Result<()> {
                super::f16_training_follows_the_f32_loss_curve::<$B>(&$device)
            }
        }
    };
}

#[cfg(feature = "wgpu")]
fused_model_tests!(
    wgpu,
    kiln_cubecl::Wgpu,
    kiln_cubecl::WgpuDevice::first()
        .unwrap_or_else(|e| panic!("no wgpu device for the fused tests: {e}"))
);
#[cfg(feature = "cuda")]
fused_model_tests!(
    cuda,
    kiln_cubecl::Cuda,
    kiln_cubecl::CudaDevice::first()
        .unwrap_or_else(|e| panic!("no CUDA device for the fused tests: {e}"))
);

/// The MNIST MLP with bf16 products (wgpu has no bf16: CUDA only).
#[cfg(feature = "cuda")]
#[kiln::model(precision = bf16)]
type MlpBf16 = kiln_models::mlp::Mlp;

/// Mixed precision on CUDA: the fused groups that widen a bf16 product and narrow the
/// next layer's input (the `fused_mixed` kernel) give the op-by-op path's values, and
/// the CPU's within bf16's rounding; gradients stay f32.
#[cfg(feature = "cuda")]
#[test]
fn cuda_mixed_precision_plans_match_the_op_by_op_path_and_the_cpu() -> Result<()> {
    use kiln_tensor::{Const, Rank2, Tensor};
    let dev = kiln_cubecl::CudaDevice::first()
        .unwrap_or_else(|e| panic!("no CUDA device for the fused tests: {e}"));
    type G = kiln_cubecl::Cuda;
    let (fused, unfused) = (MlpBf16::<G>::init(&dev, 3)?, MlpBf16::<G>::init(&dev, 3)?);
    unfused.set_fused(false);
    let cpu = MlpBf16::<Cpu>::init(&CpuDevice, 3)?;
    let xs: Vec<f32> = (0..16 * 784)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
        .collect();
    let labels: Vec<i32> = (0..16).map(|i| i % 10).collect();
    let x = Tensor::<G, Rank2<16, 784>>::from_vec(xs.clone(), &[16, 784], &dev)?;
    let y = Tensor::<G, (Const<16>,), i32>::from_vec(labels.clone(), &[16], &dev)?;
    let xc = Tensor::<Cpu, Rank2<16, 784>>::from_vec(xs, &[16, 784], &CpuDevice)?;
    let yc = Tensor::<Cpu, (Const<16>,), i32>::from_vec(labels, &[16], &CpuDevice)?;
    let f = fused.forward(&x)?.raw().to_vec::<f32>()?;
    let u = unfused.forward(&x)?.raw().to_vec::<f32>()?;
    let c = cpu.forward(&xc)?.raw().to_vec::<f32>()?;
    let scale = c.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert!(
        max_diff(&f, &u) <= 1e-6 * (1.0 + scale),
        "fused and op by op differ by {}",
        max_diff(&f, &u)
    );
    assert!(
        max_diff(&f, &c) <= 2e-2 * (1.0 + scale),
        "CUDA and the CPU differ by {}",
        max_diff(&f, &c)
    );
    let (lf, gf) = fused.loss_and_grad(&x, &y)?;
    let (lu, gu) = unfused.loss_and_grad(&x, &y)?;
    let d = max_diff(&lf.raw().to_vec::<f32>()?, &lu.raw().to_vec::<f32>()?);
    assert!(d <= 1e-5, "losses differ by {d}");
    let lc = cpu.loss(&xc, &yc)?.raw().to_vec::<f32>()?;
    let d = max_diff(&lf.raw().to_vec::<f32>()?, &lc);
    assert!(
        d <= 2e-2 * (1.0 + lc[0].abs()),
        "the loss on CUDA and the CPU differ by {d}"
    );
    assert_eq!(gf.fc1.weight.raw().dtype(), DType::F32);
    let d = max_diff(
        &gf.fc1.weight.raw().to_vec::<f32>()?,
        &gu.fc1.weight.raw().to_vec::<f32>()?,
    );
    assert!(d <= 1e-5, "fc1's gradients differ by {d}");
    Ok(())
}

/// The tiny GPT with bf16 products (CUDA only).
#[cfg(feature = "cuda")]
#[kiln::model(precision = bf16)]
type TinyGptBf16 = kiln_models::gpt::Gpt<16, 2, 2, 32>;

/// The bf16 GPT's training step on CUDA: heads split and merged around bf16 attention
/// (the planner's casts moved across those views: bf16 head views, transposed bf16
/// weights, widened values recomputed in their readers, bf16 reshape copies), planned
/// against op by op on the device, and against the CPU within bf16's rounding.
#[cfg(feature = "cuda")]
#[test]
fn cuda_mixed_precision_gpt_plans_match_the_op_by_op_path_and_the_cpu() -> Result<()> {
    use kiln_models::gpt::Ids;
    let dev = kiln_cubecl::CudaDevice::first()
        .unwrap_or_else(|e| panic!("no CUDA device for the fused tests: {e}"));
    type G = kiln_cubecl::Cuda;
    let ids: Vec<i32> = (0..4 * 32).map(|i| (i * 31 + 7) % 256).collect();
    let next: Vec<i32> = (0..4 * 32).map(|i| (i * 17 + 3) % 256).collect();
    let step = |fused: bool| -> Result<Vec<f32>> {
        let model = TinyGptBf16::<G>::init(&dev, 2)?;
        model.set_fused(fused);
        model.step_seeds().set_steps(5);
        let x = Ids::<G, 4, 32>::from_vec(ids.clone(), &[4, 32], &dev)?;
        let y = Ids::<G, 4, 32>::from_vec(next.clone(), &[4, 32], &dev)?;
        let (loss, grads) = model.loss_and_grad(&x, &y)?;
        assert_eq!(grads.blocks[1].attn.q.weight.raw().dtype(), DType::F32);
        let mut all = loss.raw().to_vec::<f32>()?;
        all.extend(grads.blocks[1].attn.q.weight.raw().to_vec::<f32>()?);
        all.extend(grads.blocks[0].up.weight.raw().to_vec::<f32>()?);
        Ok(all)
    };
    let (fused, unfused) = (step(true)?, step(false)?);
    let scale = unfused.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = max_diff(&fused, &unfused);
    assert!(
        d <= 1e-5 * (1.0 + scale),
        "planned and op by op differ by {d}"
    );
    let cpu = TinyGptBf16::<Cpu>::init(&CpuDevice, 2)?;
    cpu.step_seeds().set_steps(5);
    let x = Ids::<Cpu, 4, 32>::from_vec(ids, &[4, 32], &CpuDevice)?;
    let y = Ids::<Cpu, 4, 32>::from_vec(next, &[4, 32], &CpuDevice)?;
    let lc = cpu.loss_and_grad(&x, &y)?.0.raw().to_vec::<f32>()?;
    let d = (fused[0] - lc[0]).abs();
    assert!(
        d <= 2e-2 * (1.0 + lc[0].abs()),
        "the loss on CUDA ({}) and the CPU ({}) differ by {d}",
        fused[0],
        lc[0]
    );
    Ok(())
}

/// Parameters and buffers of a model, by name, on the host.
fn state<G: Backend, M: kiln_tensor::nn::Module<G>>(m: &M) -> Vec<(String, Vec<f32>)> {
    let mut out = Vec::new();
    let mut take = |s: kiln_tensor::nn::Slot<'_, G>| {
        out.push((
            s.name.to_string(),
            s.value.to_vec::<f32>().expect("download"),
        ))
    };
    m.visit_params("", &mut take);
    m.visit_buffers("", &mut take);
    out
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Causal self-attention (iota, casts, the mask's select fused into the softmax's
/// kernels, batched products over batch and heads): planned on the device, op by op on
/// the device and op by op on the CPU agree, values and gradients.
fn attention_plans_match_the_op_by_op_path<G: Backend>(dev: &G::Device) -> Result<()> {
    use kiln_tensor::{Const, RandDist, Tensor};
    use TinyAttention as CausalSelfAttention;
    type Seq = (Const<3>, Const<6>, Const<16>);
    let normal = RandDist::Normal {
        mean: 0.0,
        std: 1.0,
    };
    fn outputs<B: Backend>(m: &CausalSelfAttention<B>, dev: &B::Device) -> Result<Vec<f32>> {
        let normal = RandDist::Normal {
            mean: 0.0,
            std: 1.0,
        };
        let x =
            Tensor::<B, Seq>::from_raw(RawTensor::rand(&[3, 6, 16], normal, 1, DType::F32, dev)?)?;
        let t =
            Tensor::<B, Seq>::from_raw(RawTensor::rand(&[3, 6, 16], normal, 2, DType::F32, dev)?)?;
        let mut all = m.forward(&x)?.raw().to_vec::<f32>()?;
        let (loss, grads) = m.loss_and_grad(&x, &t)?;
        all.extend(loss.raw().to_vec::<f32>()?);
        all.extend(grads.q.weight.raw().to_vec::<f32>()?);
        all.extend(grads.v.bias.raw().to_vec::<f32>()?);
        Ok(all)
    }
    let _ = normal;
    let planned = CausalSelfAttention::<G>::init(dev, 5)?;
    let op_by_op = CausalSelfAttention::<G>::init(dev, 5)?;
    op_by_op.set_fused(false);
    let cpu = CausalSelfAttention::<Cpu>::init(&CpuDevice, 5)?;
    cpu.set_fused(false);
    let (a, b, c) = (
        outputs(&planned, dev)?,
        outputs(&op_by_op, dev)?,
        outputs(&cpu, &CpuDevice)?,
    );
    let d = max_diff(&a, &b).max(max_diff(&a, &c));
    assert!(d <= 1e-4, "planned and op-by-op attention differ by {d}");
    Ok(())
}

fn mlp_plans_match_the_op_by_op_path<G: Backend>(dev: &G::Device) -> Result<()> {
    use kiln_models::mlp::Mlp;
    use kiln_tensor::{Const, RandDist, Rank2, Tensor};
    let (mut fused, mut unfused) = (Mlp::<G>::init(dev, 3)?, Mlp::<G>::init(dev, 3)?);
    unfused.set_fused(false);
    let normal = RandDist::Normal {
        mean: 0.0,
        std: 1.0,
    };
    let x = Tensor::<G, Rank2<16, 784>>::from_raw(RawTensor::rand(
        &[16, 784],
        normal,
        1,
        DType::F32,
        dev,
    )?)?;
    let y =
        Tensor::<G, (Const<16>,), i32>::from_vec((0..16).map(|i| i % 10).collect(), &[16], dev)?;
    let d = max_diff(
        &fused.forward(&x)?.raw().to_vec::<f32>()?,
        &unfused.forward(&x)?.raw().to_vec::<f32>()?,
    );
    assert!(d <= 1e-5, "forward differs by {d}");
    sgd_steps_agree(
        &mut fused,
        &mut unfused,
        |m| m.loss_and_grad(&x, &y).map(|(l, g)| (l.into_raw(), g)),
        1e-5,
    )
}

fn lenet_plans_match_the_op_by_op_path<G: Backend>(dev: &G::Device) -> Result<()> {
    use kiln_models::lenet::LeNet;
    use kiln_tensor::{Const, RandDist, Rank4, Tensor};
    let (mut fused, mut unfused) = (LeNet::<G>::init(dev, 5)?, LeNet::<G>::init(dev, 5)?);
    unfused.set_fused(false);
    let normal = RandDist::Normal {
        mean: 0.0,
        std: 1.0,
    };
    let raw = RawTensor::rand(&[6, 1, 28, 28], normal, 2, DType::F32, dev)?;
    let x = Tensor::<G, Rank4<6, 1, 28, 28>>::from_raw(raw)?;
    let y = Tensor::<G, (Const<6>,), i32>::from_vec(vec![3, 1, 4, 1, 5, 9], &[6], dev)?;
    let d = max_diff(
        &fused.forward(&x)?.raw().to_vec::<f32>()?,
        &unfused.forward(&x)?.raw().to_vec::<f32>()?,
    );
    assert!(d <= 1e-4, "forward differs by {d}");
    // Dropout draws the same masks on both paths: both models start at the same step.
    sgd_steps_agree(
        &mut fused,
        &mut unfused,
        |m| m.loss_and_grad(&x, &y).map(|(l, g)| (l.into_raw(), g)),
        1e-4,
    )
}

/// Two SGD steps (momentum, weight decay) of a fused model and an unfused copy, each
/// taking `step`'s loss and gradients: losses, parameters and buffers within `tol`.
fn sgd_steps_agree<G: Backend, M: kiln_tensor::nn::Module<G>>(
    fused: &mut M,
    unfused: &mut M,
    step: impl Fn(&M) -> Result<(RawTensor<G>, M::Grads)>,
    tol: f32,
) -> Result<()> {
    use kiln_train::optim::{Optimizer, Sgd, SgdConfig};
    let config = SgdConfig {
        lr: 0.05,
        momentum: 0.9,
        weight_decay: 1e-4,
        ..SgdConfig::default()
    };
    let (mut opt_f, mut opt_u) = (Sgd::<G>::new(config)?, Sgd::<G>::new(config)?);
    for it in 0..2 {
        let (lf, gf) = step(fused)?;
        let (lu, gu) = step(unfused)?;
        let d = max_diff(&lf.to_vec::<f32>()?, &lu.to_vec::<f32>()?);
        assert!(d <= tol, "step {it}: losses differ by {d}");
        opt_f.step(fused, &gf)?;
        opt_u.step(unfused, &gu)?;
        for ((name, a), (_, b)) in state::<G, _>(fused).iter().zip(&state::<G, _>(unfused)) {
            let d = max_diff(a, b);
            assert!(d <= tol, "step {it}: `{name}` differs by {d}");
        }
    }
    Ok(())
}

fn int8_plans_match_the_op_by_op_path<G: Backend>(dev: &G::Device) -> Result<()> {
    use kiln_models::mlp::MlpInt8;
    use kiln_tensor::{RandDist, Rank2, Tensor};
    let (fused, unfused) = (MlpInt8::<G>::init(dev, 3)?, MlpInt8::<G>::init(dev, 3)?);
    unfused.set_fused(false);
    let normal = RandDist::Normal {
        mean: 0.0,
        std: 1.0,
    };
    let x = |rows: usize| RawTensor::rand(&[rows, 784], normal, 1, DType::F32, dev);
    // Under 16 rows the device's matrix-vector kernel, from 16 a dequantised product.
    let few = Tensor::<G, Rank2<2, 784>>::from_raw(x(2)?)?;
    let many = Tensor::<G, Rank2<16, 784>>::from_raw(x(16)?)?;
    let pairs = [
        (
            fused.forward(&few)?.raw().to_vec::<f32>()?,
            unfused.forward(&few)?.raw().to_vec::<f32>()?,
        ),
        (
            fused.forward(&many)?.raw().to_vec::<f32>()?,
            unfused.forward(&many)?.raw().to_vec::<f32>()?,
        ),
    ];
    for (f, u) in pairs {
        assert!(
            f.iter().all(|v| v.is_finite()) && f.iter().any(|&v| v != 0.0),
            "{f:?}"
        );
        let d = max_diff(&f, &u);
        assert!(d <= 1e-5, "int8 forward differs by {d}");
    }
    Ok(())
}

/// The optimizers' grouped steps on CUDA (`KilnRuntime::GROUPS_FUSED_ELEMENTWISE`).
#[cfg(feature = "cuda")]
#[test]
fn cuda_optimizers_update_parameters_together_as_one_by_one() -> Result<()> {
    let dev = kiln_cubecl::CudaDevice::first()
        .unwrap_or_else(|e| panic!("no CUDA device for the fused tests: {e}"));
    optimizers_update_parameters_together_as_one_by_one::<kiln_cubecl::Cuda>(&dev)
}

/// The optimizers' grouped steps on wgpu.
#[cfg(feature = "wgpu")]
#[test]
fn wgpu_optimizers_update_parameters_together_as_one_by_one() -> Result<()> {
    let dev = kiln_cubecl::WgpuDevice::first()
        .unwrap_or_else(|e| panic!("no wgpu device for the fused tests: {e}"));
    optimizers_update_parameters_together_as_one_by_one::<kiln_cubecl::Wgpu>(&dev)
}

/// AdamW's and SGD's steps over the MLP's parameters, updated together in a few
/// launches (the multi-tensor update; the 10-element bias, not whole vectors, alone),
/// give the values and state (moments and step counts, momentum buffers) of the same
/// updates made one parameter at a time, bit for bit: with weight decay, clipping, and
/// a learning rate changed between steps.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn optimizers_update_parameters_together_as_one_by_one<G: Backend>(dev: &G::Device) -> Result<()> {
    use kiln_train::optim::{AdamW, AdamWConfig, GradClip, Optimizer, Sgd, SgdConfig};
    assert!(
        G::groups_fused_elementwise(dev),
        "the backend groups updates"
    );
    let adamw = || {
        let mut o = AdamW::<G>::new(AdamWConfig {
            lr: 1e-2,
            weight_decay: 0.1,
            ..AdamWConfig::default()
        })?;
        o.set_grad_clip(GradClip::Norm(0.5))?;
        Ok(o)
    };
    together_as_one_by_one(dev, "AdamW", adamw)?;
    let sgd = || {
        let mut o = Sgd::<G>::new(SgdConfig {
            lr: 0.05,
            momentum: 0.9,
            weight_decay: 1e-3,
            nesterov: true,
            ..SgdConfig::default()
        })?;
        o.set_grad_clip(GradClip::Value(0.8))?;
        Ok(o)
    };
    together_as_one_by_one(dev, "SGD", sgd)
}

/// Four steps of two optimizers from `make` on two copies of the MLP, one through
/// `Optimizer::step` (grouped), one a parameter at a time, compared after each.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn together_as_one_by_one<G: Backend, O: kiln_train::optim::Optimizer<G>>(
    dev: &G::Device,
    what: &str,
    make: impl Fn() -> Result<O>,
) -> Result<()> {
    use kiln_models::mlp::Mlp;
    use kiln_tensor::nn::Module;
    use kiln_tensor::RandDist;
    let (mut together, mut alone) = (Mlp::<G>::init(dev, 5)?, Mlp::<G>::init(dev, 5)?);
    let (mut opt_t, mut opt_a) = (make()?, make()?);
    let mut dims = Vec::new();
    together.visit_params("", &mut |s| dims.push(*s.value.dims()));
    let normal = RandDist::Normal {
        mean: 0.0,
        std: 1.0,
    };
    for step in 0..4u64 {
        let raw = dims
            .iter()
            .enumerate()
            .map(|(i, d)| {
                RawTensor::<G>::rand(d.as_slice(), normal, 10 * step + i as u64, DType::F32, dev)
            })
            .collect::<Result<Vec<_>>>()?;
        let grads = Mlp::<G>::grads_from_raw(&mut raw.into_iter())?;
        if step == 2 {
            let lr = opt_t.lr() * 0.3;
            opt_t.set_lr(lr)?;
            opt_a.set_lr(lr)?;
        }
        opt_t.step(&mut together, &grads)?;
        opt_a.prepare_clip(&mut alone, &grads)?;
        alone.update_params(&grads, "", &mut |name, p, g| {
            opt_a.update_param_in_place(name, p, g)
        })?;
        for ((name, a), (_, b)) in state::<G, _>(&together).iter().zip(&state::<G, _>(&alone)) {
            assert!(
                a == b,
                "{what}, step {step}: `{name}` differs by {}",
                max_diff(a, b)
            );
        }
        let (st, sa) = (opt_t.state(), opt_a.state());
        assert_eq!(st.counters, sa.counters, "{what}, step {step}: step counts");
        assert_eq!(st.tensors.len(), sa.tensors.len());
        for ((key, a), (_, b)) in st.tensors.iter().zip(&sa.tensors) {
            assert!(
                a.to_vec::<f32>()? == b.to_vec::<f32>()?,
                "{what}, step {step}: {key:?} differs"
            );
        }
    }
    Ok(())
}

fn steady_state_steps_take_no_new_device_memory<R: kiln_cubecl::KilnRuntime>(
    dev: &kiln_cubecl::CubeDevice<R>,
) -> Result<()> {
    use kiln_cubecl::CubeBackend;
    use kiln_models::mlp::Mlp;
    use kiln_tensor::{Const, Rank2, Tensor};
    use kiln_train::optim::{Optimizer, Sgd, SgdConfig};
    type G<R> = CubeBackend<R>;
    let mut model = Mlp::<G<R>>::init(dev, 3)?;
    let x = Tensor::<G<R>, Rank2<32, 784>>::normal(0.0, 1.0, 4, dev)?;
    let y =
        Tensor::<G<R>, (Const<32>,), i32>::from_vec((0..32).map(|i| i % 10).collect(), &[32], dev)?;
    let mut opt = Sgd::<G<R>>::new(SgdConfig {
        lr: 0.01,
        momentum: 0.9,
        ..SgdConfig::default()
    })?;
    let mut step = || -> Result<()> {
        let (_, grads) = model.loss_and_grad(&x, &y)?;
        opt.step(&mut model, &grads)?;
        G::<R>::synchronize(dev)
    };
    // The first steps compile kernels, plan buffers and make the momentum buffers.
    for _ in 0..3 {
        step()?;
    }
    let before = dev.memory_usage()?;
    for _ in 0..5 {
        step()?;
    }
    let after = dev.memory_usage()?;
    assert_eq!(
        before, after,
        "device memory (in use, reserved) changed over steady-state steps"
    );
    Ok(())
}

/// The MNIST MLP with f16 products and loss scaling.
#[kiln::model(precision = f16)]
type MlpF16 = kiln_models::mlp::Mlp;

/// f16 mixed precision on the device: planned against op by op there and against the
/// CPU's f16 instance, forward, loss and unscaled gradients.
fn f16_plans_match_the_op_by_op_path_and_the_cpu<G: Backend>(dev: &G::Device) -> Result<()> {
    use kiln_tensor::{Const, Rank2, Tensor};
    let (fused, unfused) = (MlpF16::<G>::init(dev, 3)?, MlpF16::<G>::init(dev, 3)?);
    unfused.set_fused(false);
    let cpu = MlpF16::<Cpu>::init(&CpuDevice, 3)?;
    let xs: Vec<f32> = (0..16 * 784)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
        .collect();
    let labels: Vec<i32> = (0..16).map(|i| i % 10).collect();
    let x = Tensor::<G, Rank2<16, 784>>::from_vec(xs.clone(), &[16, 784], dev)?;
    let y = Tensor::<G, (Const<16>,), i32>::from_vec(labels.clone(), &[16], dev)?;
    let xc = Tensor::<Cpu, Rank2<16, 784>>::from_vec(xs, &[16, 784], &CpuDevice)?;
    let yc = Tensor::<Cpu, (Const<16>,), i32>::from_vec(labels, &[16], &CpuDevice)?;
    let f = fused.forward(&x)?.raw().to_vec::<f32>()?;
    let u = unfused.forward(&x)?.raw().to_vec::<f32>()?;
    let c = cpu.forward(&xc)?.raw().to_vec::<f32>()?;
    let scale = c.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = max_diff(&f, &u);
    assert!(
        d <= 1e-6 * (1.0 + scale),
        "fused and op by op differ by {d}"
    );
    let d = max_diff(&f, &c);
    assert!(
        d <= 2e-3 * (1.0 + scale),
        "the device and the CPU differ by {d}"
    );
    let (lf, gf) = fused.loss_and_grad(&x, &y)?;
    let (lu, gu) = unfused.loss_and_grad(&x, &y)?;
    let (lc, gc) = cpu.loss_and_grad(&xc, &yc)?;
    let d = max_diff(&lf.raw().to_vec::<f32>()?, &lu.raw().to_vec::<f32>()?);
    assert!(d <= 1e-5, "losses differ by {d}");
    let d = max_diff(&lf.raw().to_vec::<f32>()?, &lc.raw().to_vec::<f32>()?);
    assert!(
        d <= 2e-3,
        "the loss on the device and the CPU differ by {d}"
    );
    assert_eq!(gf.fc1.weight.raw().dtype(), DType::F32);
    let (gf, gu, gc) = (
        gf.fc1.weight.raw().to_vec::<f32>()?,
        gu.fc1.weight.raw().to_vec::<f32>()?,
        gc.fc1.weight.raw().to_vec::<f32>()?,
    );
    let g_scale = gc.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = max_diff(&gf, &gu);
    assert!(d <= 1e-5 * (1.0 + g_scale), "fc1's gradients differ by {d}");
    let d = max_diff(&gf, &gc);
    assert!(
        d <= 1e-2 * g_scale,
        "fc1's gradients on the device and the CPU differ by {d} (largest {g_scale})"
    );
    Ok(())
}

/// The tiny GPT in f32 and with f16 products.
#[kiln::model]
type TinyGpt = kiln_models::gpt::Gpt<16, 2, 2, 32>;
#[kiln::model(precision = f16)]
type TinyGptF16 = kiln_models::gpt::Gpt<16, 2, 2, 32>;

/// f16 training on the device follows f32's loss curve (the tiny GPT on Shakespeare,
/// AdamW), and a step whose scaled gradients overflow f16 is skipped there as on the
/// CPU.
fn f16_training_follows_the_f32_loss_curve<G: Backend>(dev: &G::Device) -> Result<()> {
    use kiln_models::gpt::Ids;
    use kiln_train::optim::{AdamW, AdamWConfig, Optimizer};
    let corpus = kiln_models::text::Corpus::shakespeare()?;
    let batch = |step: u64| -> Result<(Ids<G, 8, 32>, Ids<G, 8, 32>)> {
        let (ids, next) = kiln_models::text::windows(&corpus.train, 8, 32, step)?;
        Ok((
            Ids::from_vec(ids, &[8, 32], dev)?,
            Ids::from_vec(next, &[8, 32], dev)?,
        ))
    };
    let cfg = AdamWConfig {
        lr: 1e-2,
        ..AdamWConfig::default()
    };
    const STEPS: u64 = 40;
    let mut exact = Vec::new();
    let mut opt = AdamW::<G>::new(cfg)?;
    let mut model = TinyGpt::<G>::init(dev, 1)?;
    for step in 0..STEPS {
        let (x, y) = batch(step)?;
        let (loss, grads) = model.loss_and_grad(&x, &y)?;
        exact.push(loss.raw().to_vec::<f32>()?[0]);
        opt.step(&mut model, &grads)?;
    }
    let mut mixed = Vec::new();
    let mut opt = AdamW::<G>::new(cfg)?;
    let mut model = TinyGptF16::<G>::init(dev, 1)?;
    // Start too high: the first steps overflow, are skipped, and halve the scale.
    model.loss_scale().set_scale(2f32.powi(26))?;
    for step in 0..STEPS {
        let (x, y) = batch(step)?;
        let (loss, grads) = model.loss_and_grad(&x, &y)?;
        mixed.push(loss.raw().to_vec::<f32>()?[0]);
        opt.step(&mut model, &grads)?;
    }
    let state = model.loss_scale().state();
    println!("loss scale at the end: {state:?}");
    assert!(state.skipped >= 4 && state.skipped < STEPS / 2, "{state:?}");
    // The skipped steps trained nothing: compare the curves from where f16's began.
    let taken = (STEPS - state.skipped) as usize;
    let mean = |v: &[f32]| v.iter().sum::<f32>() / v.len() as f32;
    let (a, b) = (
        mean(&exact[taken - 8..taken]),
        mean(&mixed[mixed.len() - 8..]),
    );
    println!("f32 after {taken} steps {a:.4}, f16 after {taken} taken {b:.4}");
    assert!(
        (a - b).abs() <= 0.05 * a,
        "f16 {b} strays from f32 {a} by more than 5%"
    );
    assert!(b < mean(&mixed[..4]) - 0.5, "f16 did not learn: {mixed:?}");
    Ok(())
}
