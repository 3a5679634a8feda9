//! Build-time fusion against op-by-op execution, for every model in `kiln_models`:
//! the fused plans (with their native loops) and the unfused code must agree on
//! outputs, losses, every gradient and buffer updates; several steps of SGD with
//! momentum run through the fused in-place update must match the eager update; and
//! the plans themselves are pinned by a snapshot, so that a planner change shows in
//! review (`KILN_BLESS=1` rewrites the snapshot).

use kiln::cpu::{Cpu, CpuDevice};
use kiln::prelude::*;
use kiln::tensor::nn::Slot;
use kiln::tensor::{DType, RandDist};
use kiln::train::optim::{Adam, AdamConfig, AdamW, AdamWConfig, Optimizer, Sgd, SgdConfig};
use kiln_models::lenet::LeNet;
use kiln_models::mlp::Mlp;

fn max_diff(a: &RawTensor<Cpu>, b: &RawTensor<Cpu>) -> Result<f32> {
    let (a, b) = (a.to_vec::<f32>()?, b.to_vec::<f32>()?);
    assert_eq!(a.len(), b.len());
    Ok(a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max))
}

fn params<M: Module<Cpu>>(m: &M) -> Vec<(String, RawTensor<Cpu>)> {
    let mut out = Vec::new();
    m.visit_params("", &mut |s: Slot<'_, Cpu>| {
        out.push((s.name.to_string(), s.value.clone()))
    });
    m.visit_buffers("", &mut |s: Slot<'_, Cpu>| {
        out.push((s.name.to_string(), s.value.clone()))
    });
    out
}

fn normal(dims: &[usize], seed: u64) -> Result<RawTensor<Cpu>> {
    RawTensor::rand(
        dims,
        RandDist::Normal {
            mean: 0.0,
            std: 1.0,
        },
        seed,
        DType::F32,
        &CpuDevice,
    )
}

/// Runs `step` (one training step returning the loss and the gradients flattened)
/// on two identical models, one fused and one not, for three steps.
fn compare<M: Module<Cpu>>(
    fused: &mut M,
    unfused: &mut M,
    set: impl Fn(&M, bool),
    step: impl Fn(&M) -> Result<(RawTensor<Cpu>, M::Grads)>,
    tol: f32,
) -> Result<()> {
    set(fused, true);
    set(unfused, false);
    let config = SgdConfig {
        lr: 0.05,
        momentum: 0.9,
        weight_decay: 1e-4,
        ..SgdConfig::default()
    };
    let (mut opt_f, mut opt_u) = (Sgd::<Cpu>::new(config)?, Sgd::<Cpu>::new(config)?);
    for it in 0..3 {
        let (lf, gf) = step(fused)?;
        let (lu, gu) = step(unfused)?;
        let d = max_diff(&lf, &lu)?;
        assert!(d <= tol, "step {it}: losses differ by {d}");
        opt_f.step(fused, &gf)?;
        opt_u.step(unfused, &gu)?;
        for ((name, a), (_, b)) in params(fused).iter().zip(params(unfused).iter()) {
            let d = max_diff(a, b)?;
            assert!(
                d <= tol,
                "step {it}: `{name}` differs by {d} after the update"
            );
        }
    }
    Ok(())
}

#[test]
fn mlp_fused_equals_unfused() -> Result<()> {
    let dev = CpuDevice;
    let (mut a, mut b) = (Mlp::<Cpu>::init(&dev, 3)?, Mlp::<Cpu>::init(&dev, 3)?);
    let x = Tensor::<Cpu, Rank2<16, 784>>::from_raw(normal(&[16, 784], 1)?)?;
    let y =
        Tensor::<Cpu, (Const<16>,), i32>::from_vec((0..16).map(|i| i % 10).collect(), &[16], &dev)?;
    let fa = a.forward(&x)?;
    b.set_fused(false);
    let fb = b.forward(&x)?;
    assert!(max_diff(fa.raw(), fb.raw())? <= 1e-5);
    compare(
        &mut a,
        &mut b,
        |m, on| m.set_fused(on),
        |m| m.loss_and_grad(&x, &y).map(|(l, g)| (l.into_raw(), g)),
        1e-5,
    )
}

/// A 28×28 image classifier (`$model`) fused against its unfused copy at batch `$b`:
/// outputs, then three SGD steps (dropout draws the same masks on both paths: both
/// models start at the same step).
macro_rules! classifier_fused_equals_unfused {
    ($model:ident, $b:literal) => {{
        const B: usize = $b;
        let dev = CpuDevice;
        let (mut a, mut b) = ($model::<Cpu>::init(&dev, 5)?, $model::<Cpu>::init(&dev, 5)?);
        let x = Tensor::<Cpu, Rank4<B, 1, 28, 28>>::from_raw(normal(&[B, 1, 28, 28], 2)?)?;
        let labels = (0..B as i32).map(|i| (i * 7 + 3) % 10).collect();
        let y = Tensor::<Cpu, (Const<B>,), i32>::from_vec(labels, &[B], &dev)?;
        let fa = a.forward(&x)?;
        b.set_fused(false);
        let fb = b.forward(&x)?;
        assert!(max_diff(fa.raw(), fb.raw())? <= 1e-5);
        compare(
            &mut a,
            &mut b,
            |m, on| m.set_fused(on),
            |m| m.loss_and_grad(&x, &y).map(|(l, g)| (l.into_raw(), g)),
            1e-4,
        )
    }};
}

#[test]
fn lenet_fused_equals_unfused() -> Result<()> {
    classifier_fused_equals_unfused!(LeNet, 4)
}

/// Convolutions of 16 filters, one strided, with batch norm and a residual: the CPU runs
/// their products over blocks of images whose columns are never stored
/// (`kiln_cpu::conv`).
#[model]
pub struct NarrowCnn {
    stem: Conv2d<1, 16, 3, 1, 1>,
    stem_bn: BatchNorm2d<16>,
    a1: Conv2d<16, 16, 3, 1, 1>,
    a1_bn: BatchNorm2d<16>,
    down: Conv2d<16, 16, 3, 2, 1>,
    pool: AvgPool2d<14>,
    head: Linear<16, 10>,
}

#[model]
impl NarrowCnn {
    /// Class logits of a batch of images.
    pub fn forward<const B: usize>(&self, x: Tensor<B, 1, 28, 28>) -> Tensor<B, 10> {
        let h = self.stem_bn(self.stem(x)).relu();
        let h = (self.a1_bn(self.a1(h)) + h).relu();
        let h = self.down(h).relu();
        self.head(self.pool(h).flatten())
    }

    /// Mean cross-entropy of the logits against integer labels.
    pub fn loss<const B: usize>(&self, x: Tensor<B, 1, 28, 28>, y: Tensor<B, i32>) -> Tensor {
        self.forward(x).cross_entropy(y)
    }
}

/// At batch 64 in a pool of two threads the CPU runs every convolution's products over
/// blocks of images; at batch 4 there are too few blocks and the program writes the
/// columns to memory first (as for LeNet at batch 4 above).
#[test]
fn narrow_cnn_fused_over_image_blocks_equals_unfused() -> Result<()> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .expect("a pool");
    pool.install(|| -> Result<()> { classifier_fused_equals_unfused!(NarrowCnn, 64) })?;
    classifier_fused_equals_unfused!(NarrowCnn, 4)
}

#[test]
fn fused_sgd_update_is_bit_identical_to_the_eager_one() -> Result<()> {
    for nesterov in [false, true] {
        let config = SgdConfig {
            lr: 0.1,
            momentum: 0.9,
            weight_decay: if nesterov { 0.0 } else { 0.01 },
            nesterov,
            ..SgdConfig::default()
        };
        let (mut fused, mut eager) = (Sgd::<Cpu>::new(config)?, Sgd::<Cpu>::new(config)?);
        let mut p = normal(&[37, 5], 7)?;
        let mut q = p.contiguous()?;
        for s in 0..4 {
            let g = normal(&[37, 5], 100 + s)?;
            fused.update_param_in_place("w", &mut p, &g)?;
            q = eager.update_param("w", &q, &g)?;
            assert_eq!(
                p.to_vec::<f32>()?,
                q.to_vec::<f32>()?,
                "step {s}, nesterov {nesterov}"
            );
        }
    }
    Ok(())
}

#[test]
fn fused_adam_updates_are_bit_identical_to_the_eager_ones() -> Result<()> {
    type Run = (
        Box<dyn Optimizer<Cpu>>,
        Box<dyn Optimizer<Cpu>>,
        &'static str,
    );
    let runs: Vec<Run> = vec![
        (
            Box::new(AdamW::<Cpu>::new(AdamWConfig {
                lr: 0.01,
                weight_decay: 0.1,
                ..AdamWConfig::default()
            })?),
            Box::new(AdamW::<Cpu>::new(AdamWConfig {
                lr: 0.01,
                weight_decay: 0.1,
                ..AdamWConfig::default()
            })?),
            "AdamW",
        ),
        (
            Box::new(Adam::<Cpu>::new(AdamConfig {
                lr: 0.01,
                weight_decay: 0.01,
                ..AdamConfig::default()
            })?),
            Box::new(Adam::<Cpu>::new(AdamConfig {
                lr: 0.01,
                weight_decay: 0.01,
                ..AdamConfig::default()
            })?),
            "Adam",
        ),
    ];
    for (mut fused, mut eager, what) in runs {
        let mut p = normal(&[37, 5], 7)?;
        let mut q = p.contiguous()?;
        for s in 0..5 {
            let g = normal(&[37, 5], 100 + s)?;
            fused.update_param_in_place("w", &mut p, &g)?;
            q = eager.update_param("w", &q, &g)?;
            assert_eq!(p.to_vec::<f32>()?, q.to_vec::<f32>()?, "{what}, step {s}");
        }
    }
    Ok(())
}

#[test]
fn plans_match_the_snapshot() -> Result<()> {
    let mut text = String::new();
    for (title, plan) in Mlp::<Cpu>::fusion_plans()
        .iter()
        .chain(LeNet::<Cpu>::fusion_plans())
    {
        text += &format!("# {title}\n{plan}\n");
    }
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots/plans.txt");
    if std::env::var_os("KILN_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().expect("has a parent")).expect("create snapshots/");
        std::fs::write(&path, &text).expect("write the snapshot");
    }
    let want = std::fs::read_to_string(&path)
        .expect("tests/snapshots/plans.txt (run with KILN_BLESS=1 to create it)");
    assert!(
        want == text,
        "the plans changed; review them and run with KILN_BLESS=1 to accept"
    );
    // Every plan prints and exports.
    let report = Mlp::<Cpu>::fusion_report()?;
    assert!(
        report.contains("Mlp::loss_and_grad") && report.contains("matmul"),
        "{report}"
    );
    assert!(LeNet::<Cpu>::fusion_dot()?.starts_with("digraph kiln {"));
    Ok(())
}

#[test]
fn a_wrong_runtime_shape_is_a_clear_error() -> Result<()> {
    // A typed tensor over a buffer of other dims cannot be built, so feed the plan
    // directly: the program checks what it is given.
    let plan = kiln::fusion::Plan::parse(Mlp::<Cpu>::fusion_plans()[0].1)?;
    let mut program = kiln::fusion::Program::<Cpu>::new(plan, &[]);
    let model = Mlp::<Cpu>::init(&CpuDevice, 1)?;
    let ps = params(&model);
    let x = normal(&[3, 783], 1)?;
    let mut ins: Vec<&RawTensor<Cpu>> = vec![&x];
    ins.extend(ps.iter().map(|(_, t)| t));
    let err = program
        .run(
            &mut kiln::fusion::RunContext::new(&CpuDevice).sizes(&[("B", 3)]),
            &ins,
        )
        .expect_err("a shape error")
        .to_string();
    assert!(
        err.contains("[3, 783]") && err.contains("[3, 784]"),
        "{err}"
    );
    Ok(())
}
