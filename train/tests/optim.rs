//! Optimizers against independent f64 implementations of PyTorch's update formulas,
//! over several steps, plus hyper-parameter validation and a toy regression whose loss
//! must fall.

use kiln_autodiff::Tape;
use kiln_cpu::{Cpu, CpuDevice};
use kiln_tensor::nn::{Linear, LinearGrads, Module};
use kiln_tensor::{f16, BuilderExt, DType, Error, RawTensor, Result};
use kiln_train::optim::{
    global_norm, Adam, AdamConfig, AdamW, AdamWConfig, GradClip, Optimizer, Sgd, SgdConfig,
};

const DEV: CpuDevice = CpuDevice;

/// Deterministic values in [-1, 1) (SplitMix64), so each step gets new gradients.
fn values(seed: u64, n: usize) -> Vec<f64> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            (z >> 11) as f64 / (1u64 << 52) as f64 - 1.0
        })
        .collect()
}

/// The reference: one optimizer's update of a flat f64 parameter.
trait Reference {
    fn step(&mut self, p: &mut [f64], g: &[f64]);
}

/// `torch.optim.SGD`'s rule, written out on scalars.
struct RefSgd {
    c: SgdConfig,
    buf: Option<Vec<f64>>,
}

impl Reference for RefSgd {
    fn step(&mut self, p: &mut [f64], g: &[f64]) {
        let c = self.c;
        let d: Vec<f64> = p
            .iter()
            .zip(g)
            .map(|(p, g)| g + c.weight_decay * p)
            .collect();
        let d = if c.momentum != 0.0 {
            let buf = match self.buf.take() {
                None => d.clone(),
                Some(b) => b
                    .iter()
                    .zip(&d)
                    .map(|(b, d)| c.momentum * b + (1.0 - c.dampening) * d)
                    .collect(),
            };
            let out = if c.nesterov {
                d.iter()
                    .zip(&buf)
                    .map(|(d, b)| d + c.momentum * b)
                    .collect()
            } else {
                buf.clone()
            };
            self.buf = Some(buf);
            out
        } else {
            d
        };
        for (p, d) in p.iter_mut().zip(d) {
            *p -= c.lr * d;
        }
    }
}

/// Adam (coupled L2) or AdamW (decoupled) from the papers' formulas with PyTorch's
/// placement of eps: `m̂ / (√v̂ + eps)` with `√v̂ = √v / √(1 − β₂ᵗ)`.
struct RefAdam {
    lr: f64,
    b1: f64,
    b2: f64,
    eps: f64,
    wd: f64,
    decoupled: bool,
    t: i32,
    m: Vec<f64>,
    v: Vec<f64>,
}

impl RefAdam {
    fn new(lr: f64, (b1, b2): (f64, f64), eps: f64, wd: f64, decoupled: bool, n: usize) -> Self {
        RefAdam {
            lr,
            b1,
            b2,
            eps,
            wd,
            decoupled,
            t: 0,
            m: vec![0.0; n],
            v: vec![0.0; n],
        }
    }
}

impl Reference for RefAdam {
    fn step(&mut self, p: &mut [f64], g: &[f64]) {
        self.t += 1;
        for i in 0..p.len() {
            let mut g = g[i];
            if self.decoupled {
                p[i] *= 1.0 - self.lr * self.wd;
            } else {
                g += self.wd * p[i];
            }
            self.m[i] = self.b1 * self.m[i] + (1.0 - self.b1) * g;
            self.v[i] = self.b2 * self.v[i] + (1.0 - self.b2) * g * g;
            let m_hat = self.m[i] / (1.0 - self.b1.powi(self.t));
            let v_hat_sqrt = self.v[i].sqrt() / (1.0 - self.b2.powi(self.t)).sqrt();
            p[i] -= self.lr * m_hat / (v_hat_sqrt + self.eps);
        }
    }
}

fn assert_close(got: &[f64], want: &[f64], rel: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let tol = rel * w.abs().max(1.0);
        assert!(
            (g - w).abs() <= tol,
            "{what}: element {i} is {g}, the reference has {w} (tolerance {tol})"
        );
    }
}

/// Runs `opt` and `reference` side by side for `steps` steps on two f64 parameters
/// (distinct names and shapes, so per-name state is exercised) and compares them
/// after every step.
fn check_f64(
    opt: &mut dyn Optimizer<Cpu>,
    mut refs: [Box<dyn Reference>; 2],
    steps: u64,
    what: &str,
) -> Result<()> {
    let shapes: [&[usize]; 2] = [&[3, 4], &[5]];
    let names = ["fc.weight", "fc.bias"];
    let mut want: Vec<Vec<f64>> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| values(100 + i as u64, s.iter().product()))
        .collect();
    let mut params: Vec<RawTensor<Cpu>> = shapes
        .iter()
        .zip(&want)
        .map(|(s, v)| RawTensor::from_vec(v.clone(), s, &DEV))
        .collect::<Result<_>>()?;
    for step in 0..steps {
        for i in 0..2 {
            let g = values(1000 * step + i as u64, want[i].len());
            let grad = RawTensor::from_vec(g.clone(), shapes[i], &DEV)?;
            params[i] = opt.update_param(names[i], &params[i], &grad)?;
            refs[i].step(&mut want[i], &g);
            assert_close(
                &params[i].to_vec::<f64>()?,
                &want[i],
                1e-12,
                &format!("{what}, {} after step {step}", names[i]),
            );
        }
    }
    Ok(())
}

fn sgd_refs(c: SgdConfig) -> [Box<dyn Reference>; 2] {
    [
        Box::new(RefSgd { c, buf: None }),
        Box::new(RefSgd { c, buf: None }),
    ]
}

#[test]
fn sgd_matches_reference() -> Result<()> {
    let cases = [
        SgdConfig {
            lr: 0.1,
            ..Default::default()
        },
        SgdConfig {
            lr: 0.05,
            weight_decay: 0.01,
            ..Default::default()
        },
        SgdConfig {
            lr: 0.05,
            momentum: 0.9,
            ..Default::default()
        },
        SgdConfig {
            lr: 0.05,
            momentum: 0.9,
            dampening: 0.3,
            weight_decay: 0.02,
            nesterov: false,
        },
        SgdConfig {
            lr: 0.05,
            momentum: 0.8,
            dampening: 0.0,
            weight_decay: 0.02,
            nesterov: true,
        },
    ];
    for c in cases {
        let mut opt = Sgd::<Cpu>::new(c)?;
        check_f64(&mut opt, sgd_refs(c), 6, &format!("{c:?}"))?;
    }
    Ok(())
}

#[test]
fn sgd_first_momentum_buffer_is_the_gradient() -> Result<()> {
    // Dampening would scale the buffer after step 1 if it were applied to the first one.
    let mut opt = Sgd::<Cpu>::new(SgdConfig {
        lr: 0.1,
        momentum: 0.9,
        dampening: 0.5,
        ..Default::default()
    })?;
    let p = RawTensor::<Cpu>::from_vec(vec![1.0f64, 2.0], &[2], &DEV)?;
    let g = RawTensor::<Cpu>::from_vec(vec![0.5f64, -4.0], &[2], &DEV)?;
    let p1 = opt.update_param("w", &p, &g)?;
    assert_eq!(
        opt.momentum_buffer("w").unwrap().to_vec::<f64>()?,
        vec![0.5, -4.0]
    );
    assert_eq!(p1.to_vec::<f64>()?, vec![1.0 - 0.1 * 0.5, 2.0 + 0.1 * 4.0]);
    Ok(())
}

#[test]
fn adam_matches_reference() -> Result<()> {
    let cases = [
        (1e-2, (0.9, 0.999), 1e-8, 0.0),
        (3e-2, (0.8, 0.99), 1e-6, 0.1),
        (1e-3, (0.0, 0.5), 1e-3, 0.5),
    ];
    for (lr, betas, eps, weight_decay) in cases {
        let mut opt = Adam::<Cpu>::new(AdamConfig {
            lr,
            betas,
            eps,
            weight_decay,
        })?;
        let refs: [Box<dyn Reference>; 2] = [
            Box::new(RefAdam::new(lr, betas, eps, weight_decay, false, 12)),
            Box::new(RefAdam::new(lr, betas, eps, weight_decay, false, 5)),
        ];
        let what = format!("Adam {:?}", opt.config());
        check_f64(&mut opt, refs, 7, &what)?;
        assert_eq!(opt.step_count("fc.weight"), Some(7));
    }
    Ok(())
}

#[test]
fn adamw_matches_reference() -> Result<()> {
    let cases = [
        (1e-2, (0.9, 0.999), 1e-8, 1e-2),
        (3e-2, (0.8, 0.99), 1e-6, 0.3),
    ];
    for (lr, betas, eps, weight_decay) in cases {
        let mut opt = AdamW::<Cpu>::new(AdamWConfig {
            lr,
            betas,
            eps,
            weight_decay,
        })?;
        let refs: [Box<dyn Reference>; 2] = [
            Box::new(RefAdam::new(lr, betas, eps, weight_decay, true, 12)),
            Box::new(RefAdam::new(lr, betas, eps, weight_decay, true, 5)),
        ];
        let what = format!("AdamW {:?}", opt.config());
        check_f64(&mut opt, refs, 7, &what)?;
    }
    Ok(())
}

#[test]
fn adam_and_adamw_differ_only_by_weight_decay_placement() -> Result<()> {
    // Same settings, zero decay: identical; with decay: different.
    let p = RawTensor::<Cpu>::from_vec(values(7, 6), &[6], &DEV)?;
    let g = RawTensor::<Cpu>::from_vec(values(8, 6), &[6], &DEV)?;
    let run = |wd: f64| -> Result<(Vec<f64>, Vec<f64>)> {
        let mut a = Adam::<Cpu>::new(AdamConfig {
            lr: 0.1,
            weight_decay: wd,
            ..Default::default()
        })?;
        let mut w = AdamW::<Cpu>::new(AdamWConfig {
            lr: 0.1,
            weight_decay: wd,
            ..Default::default()
        })?;
        Ok((
            a.update_param("p", &p, &g)?.to_vec()?,
            w.update_param("p", &p, &g)?.to_vec()?,
        ))
    };
    let (a, w) = run(0.0)?;
    assert_eq!(a, w);
    let (a, w) = run(0.5)?;
    assert_ne!(a, w);
    Ok(())
}

/// A Linear layer's gradients from raw values.
fn linear_grads(w: Vec<f32>, b: Vec<f32>) -> Result<LinearGrads<Cpu, 3, 2>> {
    LinearGrads::from_raw(vec![
        RawTensor::from_vec(w, &[2, 3], &DEV)?,
        RawTensor::from_vec(b, &[2], &DEV)?,
    ])
}

fn to_f64(v: Vec<f32>) -> Vec<f64> {
    v.into_iter().map(f64::from).collect()
}

#[test]
fn step_updates_every_parameter_of_a_module_by_name() -> Result<()> {
    // Through `Optimizer::step` on an f32 Linear: weight and bias keep separate state.
    let mut model = Linear::<Cpu, 3, 2>::init(&DEV, 5)?;
    let mut want_w = to_f64(model.weight.to_vec()?);
    let mut want_b = to_f64(model.bias.to_vec()?);
    let mut opt = AdamW::<Cpu>::new(AdamWConfig {
        lr: 0.05,
        weight_decay: 0.1,
        ..Default::default()
    })?;
    let (mut ref_w, mut ref_b) = (
        RefAdam::new(0.05, (0.9, 0.999), 1e-8, 0.1, true, 6),
        RefAdam::new(0.05, (0.9, 0.999), 1e-8, 0.1, true, 2),
    );
    for step in 0..5u64 {
        let gw: Vec<f32> = values(step * 10, 6).into_iter().map(|v| v as f32).collect();
        let gb: Vec<f32> = values(step * 10 + 1, 2)
            .into_iter()
            .map(|v| v as f32)
            .collect();
        opt.step(&mut model, &linear_grads(gw.clone(), gb.clone())?)?;
        ref_w.step(&mut want_w, &to_f64(gw));
        ref_b.step(&mut want_b, &to_f64(gb));
        assert_close(&to_f64(model.weight.to_vec()?), &want_w, 1e-5, "weight");
        assert_close(&to_f64(model.bias.to_vec()?), &want_b, 1e-5, "bias");
    }
    assert_eq!(opt.step_count("weight"), Some(5));
    assert_eq!(opt.step_count("bias"), Some(5));
    Ok(())
}

/// `step` (in place, one fused kernel per parameter from the second step on, reading
/// the per-step values from device memory: what a captured step replays) against
/// `update_param` (eager ops, the rate as a constant) over learning-rate changes: bit
/// for bit the same. Both come from one rule in `optim/rules.rs`.
fn in_place_equals_by_value<O: Optimizer<Cpu>>(mut fused: O, mut plain: O) -> Result<()> {
    let mut fused_model = Linear::<Cpu, 3, 2>::init(&DEV, 9)?;
    let mut plain_model = Linear::<Cpu, 3, 2>::init(&DEV, 9)?;
    for (step, lr) in [0.05, 0.05, 0.02, 0.2, 0.0, 0.1].into_iter().enumerate() {
        fused.set_lr(lr)?;
        plain.set_lr(lr)?;
        let gw: Vec<f32> = values(step as u64 * 3, 6)
            .into_iter()
            .map(|v| v as f32)
            .collect();
        let gb: Vec<f32> = values(step as u64 * 3 + 1, 2)
            .into_iter()
            .map(|v| v as f32)
            .collect();
        fused.step(&mut fused_model, &linear_grads(gw.clone(), gb.clone())?)?;
        let grads = linear_grads(gw, gb)?;
        plain.prepare_clip(&mut plain_model, &grads)?;
        plain_model.update_params(&grads, "", &mut |name, p, g| {
            *p = plain.update_param(name, p, g)?;
            Ok(())
        })?;
        let bits = |m: &Linear<Cpu, 3, 2>| -> Result<Vec<u32>> {
            let mut v = m.weight.to_vec()?;
            v.extend(m.bias.to_vec()?);
            Ok(v.into_iter().map(f32::to_bits).collect())
        };
        assert_eq!(
            bits(&fused_model)?,
            bits(&plain_model)?,
            "step {step} (lr {lr})"
        );
    }
    Ok(())
}

#[test]
fn sgd_in_place_equals_sgd_by_value_across_learning_rate_changes() -> Result<()> {
    for config in [
        SgdConfig {
            lr: 0.05,
            momentum: 0.9,
            weight_decay: 0.01,
            ..Default::default()
        },
        SgdConfig {
            lr: 0.05,
            momentum: 0.8,
            dampening: 0.25,
            ..Default::default()
        },
        SgdConfig {
            lr: 0.05,
            momentum: 0.9,
            nesterov: true,
            weight_decay: 0.1,
            ..Default::default()
        },
    ] {
        in_place_equals_by_value(Sgd::new(config)?, Sgd::new(config)?)?;
    }
    Ok(())
}

#[test]
fn adam_and_adamw_in_place_equal_by_value_across_learning_rate_changes() -> Result<()> {
    for weight_decay in [0.0, 0.1] {
        let config = AdamConfig {
            lr: 0.05,
            betas: (0.8, 0.95),
            eps: 1e-6,
            weight_decay,
        };
        in_place_equals_by_value(Adam::new(config)?, Adam::new(config)?)?;
        let config = AdamWConfig {
            lr: 0.05,
            betas: (0.8, 0.95),
            eps: 1e-6,
            weight_decay,
        };
        in_place_equals_by_value(AdamW::new(config)?, AdamW::new(config)?)?;
    }
    Ok(())
}

#[test]
fn half_precision_parameters_keep_eps() -> Result<()> {
    // In f16, eps = 1e-8 rounds to 0 and a zero gradient would give 0/0 = NaN.
    let p = RawTensor::<Cpu>::from_vec(vec![f16::from_f64(1.5), f16::from_f64(-2.0)], &[2], &DEV)?;
    let g = RawTensor::<Cpu>::zeros(&[2], DType::F16, &DEV)?;
    let mut opt = Adam::<Cpu>::new(AdamConfig {
        lr: 0.1,
        ..Default::default()
    })?;
    let p1 = opt.update_param("p", &p, &g)?;
    assert_eq!(p1.dtype(), DType::F16);
    assert_eq!(p1.to_f64_vec()?, vec![1.5, -2.0]);
    // A real gradient: the first Adam step moves each element by about lr · sign(g).
    let g = RawTensor::<Cpu>::from_vec(vec![f16::from_f64(0.25), f16::from_f64(-0.5)], &[2], &DEV)?;
    let mut opt = Adam::<Cpu>::new(AdamConfig {
        lr: 0.125,
        ..Default::default()
    })?;
    assert_close(
        &opt.update_param("p", &p, &g)?.to_f64_vec()?,
        &[1.375, -1.875],
        1e-3,
        "f16 Adam",
    );
    Ok(())
}

fn invalid(r: Result<impl Sized>, needle: &str) {
    match r {
        Err(e @ Error::Invalid { .. }) => assert!(
            e.to_string().contains(needle),
            "`{e}` should mention `{needle}`"
        ),
        Err(e) => panic!("expected an invalid-argument error mentioning `{needle}`, got {e}"),
        Ok(_) => panic!("expected an error mentioning `{needle}`"),
    }
}

#[test]
fn invalid_hyper_parameters_are_errors() {
    let sgd = |c: SgdConfig| Sgd::<Cpu>::new(c);
    invalid(
        sgd(SgdConfig {
            lr: -0.1,
            ..Default::default()
        }),
        "learning rate",
    );
    invalid(
        sgd(SgdConfig {
            lr: f64::NAN,
            ..Default::default()
        }),
        "learning rate",
    );
    invalid(
        sgd(SgdConfig {
            momentum: -0.5,
            ..Default::default()
        }),
        "momentum",
    );
    invalid(
        sgd(SgdConfig {
            weight_decay: -1.0,
            ..Default::default()
        }),
        "weight_decay",
    );
    invalid(
        sgd(SgdConfig {
            nesterov: true,
            ..Default::default()
        }),
        "nesterov",
    );
    invalid(
        sgd(SgdConfig {
            nesterov: true,
            momentum: 0.9,
            dampening: 0.1,
            ..Default::default()
        }),
        "nesterov",
    );

    let adam = |c: AdamConfig| Adam::<Cpu>::new(c);
    invalid(
        adam(AdamConfig {
            lr: -1e-3,
            ..Default::default()
        }),
        "learning rate",
    );
    invalid(
        adam(AdamConfig {
            betas: (1.0, 0.999),
            ..Default::default()
        }),
        "beta1",
    );
    invalid(
        adam(AdamConfig {
            betas: (0.9, -0.1),
            ..Default::default()
        }),
        "beta2",
    );
    invalid(
        adam(AdamConfig {
            eps: -1e-8,
            ..Default::default()
        }),
        "eps",
    );
    invalid(
        adam(AdamConfig {
            weight_decay: -0.1,
            ..Default::default()
        }),
        "weight_decay",
    );

    let adamw = |c: AdamWConfig| AdamW::<Cpu>::new(c);
    invalid(
        adamw(AdamWConfig {
            betas: (0.9, 1.5),
            ..Default::default()
        }),
        "beta2",
    );
    invalid(
        adamw(AdamWConfig {
            lr: f64::INFINITY,
            ..Default::default()
        }),
        "learning rate",
    );

    let mut opt = Adam::<Cpu>::new(AdamConfig::default()).unwrap();
    invalid(opt.set_lr(-1.0), "learning rate");
    assert_eq!(opt.lr(), 1e-3, "a refused rate must not be stored");
    opt.set_lr(0.5).unwrap();
    assert_eq!(opt.lr(), 0.5);
}

#[test]
fn mismatched_gradients_and_state_are_errors() -> Result<()> {
    let mut opt = Sgd::<Cpu>::new(SgdConfig {
        lr: 0.1,
        momentum: 0.9,
        ..Default::default()
    })?;
    let p = RawTensor::<Cpu>::zeros(&[2, 3], DType::F32, &DEV)?;
    // [3] would broadcast against [2, 3]: it must be refused, naming the parameter.
    let g = RawTensor::<Cpu>::zeros(&[3], DType::F32, &DEV)?;
    let e = opt
        .update_param("fc1.weight", &p, &g)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("fc1.weight") && e.contains("[2, 3]") && e.contains("[3]"),
        "{e}"
    );
    let g = RawTensor::<Cpu>::zeros(&[2, 3], DType::F64, &DEV)?;
    assert!(opt.update_param("fc1.weight", &p, &g).is_err());
    let labels = RawTensor::<Cpu>::zeros(&[4], DType::I32, &DEV)?;
    assert!(opt.update_param("labels", &labels, &labels).is_err());

    // State from a [2, 3] parameter applied to a [4] one of the same name.
    opt.update_param("w", &p, &RawTensor::zeros(&[2, 3], DType::F32, &DEV)?)?;
    let q = RawTensor::<Cpu>::zeros(&[4], DType::F32, &DEV)?;
    let e = opt.update_param("w", &q, &q).unwrap_err().to_string();
    assert!(e.contains("reset"), "{e}");
    opt.reset();
    opt.update_param("w", &q, &q)?;
    Ok(())
}

/// Mean squared error of a Linear<3, 2> on a fixed batch, and its gradients.
fn loss_and_grads(
    model: &Linear<Cpu, 3, 2>,
    x: &RawTensor<Cpu>,
    y: &RawTensor<Cpu>,
) -> Result<(f64, LinearGrads<Cpu, 3, 2>)> {
    let mut tape = Tape::<Cpu>::new(DEV);
    let w = tape.leaf(model.weight.raw().clone());
    let b = tape.leaf(model.bias.raw().clone());
    let x = tape.constant(x.clone());
    let y = tape.constant(y.clone());
    let pred = tape.linear(&x, &w, Some(&b))?;
    let loss = tape.mse(&pred, &y)?;
    let grads = tape.gradients(&loss)?;
    Ok((
        loss.value().scalar_value()?,
        LinearGrads::from_raw(vec![grads.get_or_zeros(&w)?, grads.get_or_zeros(&b)?])?,
    ))
}

/// Trains on `y = x Aᵀ + c` and returns the first and last losses.
fn train(opt: &mut impl Optimizer<Cpu>, steps: usize) -> Result<(f64, f64)> {
    let n = 32;
    let xs: Vec<f32> = values(42, n * 3).into_iter().map(|v| v as f32).collect();
    let (a, c) = ([[1.5f32, -2.0, 0.5], [0.25, 1.0, -1.0]], [0.3f32, -0.7]);
    let ys: Vec<f32> = (0..n)
        .flat_map(|i| {
            let row = &xs[i * 3..i * 3 + 3];
            (0..2).map(move |o| (0..3).map(|k| a[o][k] * row[k]).sum::<f32>() + c[o])
        })
        .collect();
    let x = RawTensor::from_vec(xs, &[n, 3], &DEV)?;
    let y = RawTensor::from_vec(ys, &[n, 2], &DEV)?;
    let mut model = Linear::<Cpu, 3, 2>::init(&DEV, 1)?;
    let (first, _) = loss_and_grads(&model, &x, &y)?;
    for _ in 0..steps {
        let (_, grads) = loss_and_grads(&model, &x, &y)?;
        opt.step(&mut model, &grads)?;
    }
    let (last, _) = loss_and_grads(&model, &x, &y)?;
    Ok((first, last))
}

#[test]
fn training_a_linear_model_reduces_the_loss() -> Result<()> {
    let nesterov = SgdConfig {
        lr: 0.05,
        momentum: 0.9,
        nesterov: true,
        ..Default::default()
    };
    let runs = [
        (
            "sgd",
            train(
                &mut Sgd::new(SgdConfig {
                    lr: 0.1,
                    ..Default::default()
                })?,
                200,
            )?,
        ),
        ("sgd+nesterov", train(&mut Sgd::new(nesterov)?, 200)?),
        (
            "adam",
            train(
                &mut Adam::new(AdamConfig {
                    lr: 0.05,
                    ..Default::default()
                })?,
                200,
            )?,
        ),
        (
            "adamw",
            train(
                &mut AdamW::new(AdamWConfig {
                    lr: 0.05,
                    ..Default::default()
                })?,
                200,
            )?,
        ),
    ];
    for (name, (first, last)) in runs {
        assert!(
            first > 0.5,
            "{name}: the untrained loss {first} is suspiciously small"
        );
        assert!(
            last < first * 0.01,
            "{name}: loss went from {first} to {last}, not below 1% of the start"
        );
    }
    Ok(())
}

/// The gradients clipped as PyTorch's `clip_grad_value_` / `clip_grad_norm_` would,
/// on the host in f64, over all of a step's gradients.
fn clipped_reference(clip: GradClip, grads: &[Vec<f64>]) -> Vec<Vec<f64>> {
    match clip {
        GradClip::None => grads.to_vec(),
        GradClip::Value(c) => grads
            .iter()
            .map(|g| g.iter().map(|v| v.clamp(-c, c)).collect())
            .collect(),
        GradClip::Norm(max) => {
            let norm = grads.iter().flatten().map(|v| v * v).sum::<f64>().sqrt();
            let scale = (max / (norm + 1e-6)).min(1.0);
            grads
                .iter()
                .map(|g| g.iter().map(|v| v * scale).collect())
                .collect()
        }
    }
}

const CLIPS: [GradClip; 4] = [
    GradClip::Value(0.3),
    GradClip::Norm(0.5),
    GradClip::Norm(100.0),
    GradClip::None,
];

#[test]
fn clipping_matches_pytorch_clip_then_step() -> Result<()> {
    for clip in CLIPS {
        let config = SgdConfig {
            lr: 0.1,
            momentum: 0.9,
            ..Default::default()
        };
        let mut opt = Sgd::<Cpu>::new(config)?;
        opt.set_grad_clip(clip)?;
        assert_eq!(opt.grad_clip(), clip);
        let mut adamw = AdamW::<Cpu>::new(AdamWConfig {
            lr: 0.05,
            ..Default::default()
        })?;
        adamw.set_grad_clip(clip)?;
        let mut model = Linear::<Cpu, 3, 2>::init(&DEV, 5)?;
        let mut model_adamw = Linear::<Cpu, 3, 2>::init(&DEV, 5)?;
        let mut want = [to_f64(model.weight.to_vec()?), to_f64(model.bias.to_vec()?)];
        let mut want_adamw = want.clone();
        let mut refs = sgd_refs(config);
        let mut refs_adamw = [
            RefAdam::new(0.05, (0.9, 0.999), 1e-8, 0.01, true, 6),
            RefAdam::new(0.05, (0.9, 0.999), 1e-8, 0.01, true, 2),
        ];
        for step in 0..4u64 {
            let gw: Vec<f32> = values(step * 10, 6).into_iter().map(|v| v as f32).collect();
            let gb: Vec<f32> = values(step * 10 + 1, 2)
                .into_iter()
                .map(|v| v as f32)
                .collect();
            opt.step(&mut model, &linear_grads(gw.clone(), gb.clone())?)?;
            adamw.step(&mut model_adamw, &linear_grads(gw.clone(), gb.clone())?)?;
            let g = clipped_reference(clip, &[to_f64(gw), to_f64(gb)]);
            for k in 0..2 {
                refs[k].step(&mut want[k], &g[k]);
                refs_adamw[k].step(&mut want_adamw[k], &g[k]);
            }
            let what = format!("{clip:?} step {step}");
            assert_close(&to_f64(model.weight.to_vec()?), &want[0], 1e-5, &what);
            assert_close(&to_f64(model.bias.to_vec()?), &want[1], 1e-5, &what);
            assert_close(
                &to_f64(model_adamw.weight.to_vec()?),
                &want_adamw[0],
                1e-5,
                &what,
            );
            assert_close(
                &to_f64(model_adamw.bias.to_vec()?),
                &want_adamw[1],
                1e-5,
                &what,
            );
        }
    }
    Ok(())
}

#[test]
fn clipped_updates_in_place_equal_by_value() -> Result<()> {
    for clip in CLIPS {
        let sgd = || -> Result<Sgd<Cpu>> {
            let mut o = Sgd::new(SgdConfig {
                lr: 0.05,
                momentum: 0.9,
                weight_decay: 0.01,
                ..Default::default()
            })?;
            o.set_grad_clip(clip)?;
            Ok(o)
        };
        in_place_equals_by_value(sgd()?, sgd()?)?;
        for weight_decay in [0.0, 0.1] {
            let config = AdamConfig {
                lr: 0.05,
                weight_decay,
                ..Default::default()
            };
            let adam = || -> Result<Adam<Cpu>> {
                let mut o = Adam::new(config)?;
                o.set_grad_clip(clip)?;
                Ok(o)
            };
            in_place_equals_by_value(adam()?, adam()?)?;
            let adamw = || -> Result<AdamW<Cpu>> {
                let mut o = AdamW::new(AdamWConfig {
                    lr: 0.05,
                    weight_decay,
                    ..Default::default()
                })?;
                o.set_grad_clip(clip)?;
                Ok(o)
            };
            in_place_equals_by_value(adamw()?, adamw()?)?;
        }
    }
    Ok(())
}

#[test]
fn clipping_settings_and_misuse_are_errors() -> Result<()> {
    let mut opt = Sgd::<Cpu>::new(SgdConfig::default())?;
    for bad in [
        GradClip::Value(0.0),
        GradClip::Value(-1.0),
        GradClip::Norm(f64::NAN),
        GradClip::Norm(f64::INFINITY),
    ] {
        invalid(opt.set_grad_clip(bad), "must be finite and > 0");
    }
    assert_eq!(opt.grad_clip(), GradClip::None);
    // The global norm needs every gradient of the step: one parameter's update alone
    // cannot clip by it.
    let mut adam = Adam::<Cpu>::new(AdamConfig::default())?;
    adam.set_grad_clip(GradClip::Norm(1.0))?;
    let p = RawTensor::<Cpu>::from_vec(vec![1.0f32, 2.0], &[2], &DEV)?;
    invalid(
        adam.update_param("w", &p, &p),
        "needs all of the step's gradients",
    );
    // ... and the failed update left no state behind.
    assert_eq!(adam.step_count("w"), None);
    // The norm itself, over both parameters.
    let mut model = Linear::<Cpu, 3, 2>::init(&DEV, 1)?;
    let (gw, gb) = (vec![3.0f32, 0.0, 0.0, 0.0, 0.0, 0.0], vec![0.0f32, 4.0]);
    let norm = global_norm(&mut model, &linear_grads(gw, gb)?)?;
    assert_eq!(norm.to_vec::<f32>()?, vec![5.0]);
    Ok(())
}
