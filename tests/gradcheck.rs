//! Every vector-Jacobian rule of the op table, and the composites, checked against
//! central finite differences in f64 over random shapes and values.

use kiln::autodiff::{gradcheck, Tape, Tolerance, Var};
use kiln::cpu::{Cpu, CpuDevice};
use kiln::tensor::attention::attention_by_primitives;
use kiln::tensor::builder::Conv2dOptions;
use kiln::tensor::unary::TestDomain;
use kiln::tensor::{
    AttentionDropout, AttentionSpec, BinaryOp, Builder, BuilderExt, CmpOp, DType, Op, RawTensor,
    ReduceOp, Result, UnaryOp, Window2d,
};
use proptest::prelude::*;

type F = dyn Fn(&mut Tape<Cpu>, &[Var<Cpu>]) -> Result<Var<Cpu>>;

fn check(inputs: Vec<(Vec<f64>, Vec<usize>)>, f: &F) -> std::result::Result<(), TestCaseError> {
    gradcheck::<Cpu>(&CpuDevice, &inputs, f, Tolerance::default())
        .map_err(|e| TestCaseError::fail(e.to_string()))
}

/// Dims of rank 1..=3 with sizes 1..=4.
fn dims() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(1usize..=4, 1..=3)
}

/// Values for `dims`, with |x| in [0.1, 2] so kinks (0 for relu/abs) stay far from ε.
fn values(d: &[usize]) -> impl Strategy<Value = Vec<f64>> {
    let n: usize = d.iter().product();
    prop::collection::vec(
        (0.1f64..2.0, any::<bool>()).prop_map(|(v, s)| if s { v } else { -v }),
        n,
    )
}

fn tensor() -> impl Strategy<Value = (Vec<f64>, Vec<usize>)> {
    dims().prop_flat_map(|d| (values(&d), Just(d)))
}

/// Values and dims of one input.
type Case = (Vec<f64>, Vec<usize>);

fn positive(t: Case) -> Case {
    (t.0.into_iter().map(|v| v.abs() + 0.2).collect(), t.1)
}

/// Two tensors whose dims broadcast against each other.
fn broadcast_pair() -> impl Strategy<Value = (Case, Case)> {
    (dims(), prop::collection::vec(any::<bool>(), 3), 0usize..=2).prop_flat_map(
        |(d, ones, drop)| {
            let mut e: Vec<usize> = d
                .iter()
                .zip(&ones)
                .map(|(&x, &o)| if o { 1 } else { x })
                .collect();
            e.drain(..drop.min(e.len() - 1));
            (values(&d), Just(d), values(&e), Just(e)).prop_map(|(a, da, b, db)| ((a, da), (b, db)))
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    #[test]
    fn unary_rules(t in tensor(), which in 0usize..UnaryOp::ALL.len()) {
        // Every unary op the op table declares, on the domain it declares.
        let op = UnaryOp::ALL[which];
        prop_assume!(op.accepts(DType::F64), "ops on bools have no gradient");
        let t = if op.test_domain() == TestDomain::Positive { positive(t) } else { t };
        check(vec![t], &move |g, x| g.unary(op, &x[0]))?;
    }

    #[test]
    fn binary_rules((a, b) in broadcast_pair(), which in 0usize..BinaryOp::ALL.len()) {
        let op = BinaryOp::ALL[which];
        // Both operands positive where either operand's declared domain is restricted
        // (pow, div): the swapped call below makes either one the base or the divisor.
        let free = |d| matches!(d, TestDomain::Any | TestDomain::WithNan);
        let (da, db) = op.test_domains();
        let (a, b) = if free(da) && free(db) { (a, b) } else { (positive(a), positive(b)) };
        check(vec![a.clone(), b.clone()], &move |g, x| g.binary(op, &x[0], &x[1]))?;
        // Operands swapped, so broadcasting is undone on the other side too.
        check(vec![b, a], &move |g, x| g.binary(op, &x[0], &x[1]))?;
    }

    #[test]
    fn where_rule((a, b) in broadcast_pair()) {
        check(vec![a, b], &|g, x| {
            let zero = g.scalar_like(&x[0], 0.0)?;
            let c = g.compare(CmpOp::Gt, &x[0], &zero)?;
            g.select(&c, &x[0], &x[1])
        })?;
    }

    #[test]
    fn reduce_rules(t in tensor(), mask in 1u8..8, keep in any::<bool>(), which in 0usize..3) {
        let r = t.1.len();
        let mut axes: Vec<usize> = (0..r).filter(|a| mask & (1 << a) != 0).collect();
        if axes.is_empty() { axes.push(0); }
        let op = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min][which];
        check(vec![t], &move |g, x| g.reduce(op, &x[0], &axes, keep))?;
    }

    #[test]
    fn movement_rules(t in tensor(), seed in any::<u64>()) {
        let d = t.1.clone();
        let r = d.len();
        let mut perm: Vec<usize> = (0..r).collect();
        perm.rotate_left((seed as usize) % r);
        let ax = (seed as usize / 7) % r;
        let n = d[ax];
        let (start, step) = ((seed as usize / 3) % n, 1 + (seed as usize / 5) % 3);
        check(vec![t.clone()], &move |g, x| g.permute(&x[0], &perm))?;
        check(vec![t.clone()], &move |g, x| g.apply(Op::Slice { axis: ax, start, end: n, step }, &[&x[0]]))?;
        check(vec![t.clone()], &move |g, x| g.pad(&x[0], ax, 1, 2, 0.5))?;
        let flat: usize = d.iter().product();
        check(vec![t.clone()], &move |g, x| g.reshape(&x[0], vec![flat]))?;
        let mut big = vec![2];
        big.extend(&d);
        check(vec![t.clone()], &move |g, x| g.expand(&x[0], big.clone()))?;
        check(vec![t.clone(), t], &move |g, x| g.concat(&[&x[0], &x[1]], ax))?;
    }

    #[test]
    fn matmul_rule(m in 1usize..4, k in 1usize..4, n in 1usize..4, batch in 0usize..3, seed in any::<u64>()) {
        let vals = |len: usize, s: u64| (0..len).map(|i| kiln::tensor::rng::uniform(s, i as u32, -1.0, 1.0)).collect::<Vec<f64>>();
        let a_dims = if batch == 2 { vec![2, m, k] } else { vec![m, k] };
        let b_dims = if batch >= 1 { vec![2, k, n] } else { vec![k, n] };
        let a = (vals(a_dims.iter().product(), seed), a_dims);
        let b = (vals(b_dims.iter().product(), seed ^ 1), b_dims);
        check(vec![a, b], &|g, x| g.matmul(&x[0], &x[1]))?;
    }

    #[test]
    fn window_rules(h in 3usize..6, w in 3usize..6, k in 1usize..3, s in 1usize..3, p in 0usize..2, dil in 1usize..3, seed in any::<u64>()) {
        prop_assume!(dil * (k - 1) < h + 2 * p && dil * (k - 1) < w + 2 * p);
        let win = Window2d { kernel: [k, k], stride: [s, s], padding: [p, p], dilation: [dil, dil] };
        let x: Vec<f64> = (0..2 * h * w).map(|i| kiln::tensor::rng::uniform(seed, i as u32, -1.0, 1.0)).collect();
        check(vec![(x, vec![1, 2, h, w])], &move |g, x| g.apply(Op::Unfold2d(win), &[&x[0]]))?;
        let oh = win.out_size(0, h).unwrap();
        let ow = win.out_size(1, w).unwrap();
        let cols: Vec<f64> = (0..2 * k * k * oh * ow).map(|i| kiln::tensor::rng::uniform(seed ^ 9, i as u32, -1.0, 1.0)).collect();
        check(vec![(cols, vec![2 * k * k, 1, oh * ow])], &move |g, x| g.apply(Op::Fold2d { window: win, height: h, width: w }, &[&x[0]]))?;
    }
}

/// Random attention inputs: batch dims (0 to 2 of sizes 1..=2), queries, keys, widths,
/// causal or not (causal takes as many queries as keys), a scale of either sign, and
/// half the time dropout on the weights (a fixed mask for a fixed seed, so the
/// differences see the same one).
fn attention_case() -> impl Strategy<Value = (Vec<Case>, AttentionSpec)> {
    let dropout = prop_oneof![
        Just(None),
        (prop::sample::select(vec![0.2, 0.5]), any::<u64>())
            .prop_map(|(p, seed)| Some(AttentionDropout { p, seed })),
    ];
    (
        prop::collection::vec(1usize..=2, 0..=2),
        1usize..=4,
        1usize..=4,
        1usize..=3,
        1usize..=3,
        any::<bool>(),
        (0.2f64..1.5, any::<bool>()),
        any::<u64>(),
        dropout,
    )
        .prop_map(
            |(batch, tq, tk, e, ev, causal, (scale, neg), seed, dropout)| {
                let tk = if causal { tq } else { tk };
                let dims = |rows: usize, width: usize| [batch.clone(), vec![rows, width]].concat();
                let vals = |d: &[usize], s: u64| -> Vec<f64> {
                    (0..d.iter().product::<usize>())
                        .map(|i| kiln::tensor::rng::uniform(s, i as u32, -1.5, 1.5))
                        .collect()
                };
                let inputs = [dims(tq, e), dims(tk, e), dims(tk, ev)]
                    .into_iter()
                    .enumerate()
                    .map(|(i, d)| (vals(&d, seed ^ i as u64), d))
                    .collect();
                let scale = if neg { -scale } else { scale };
                let spec = AttentionSpec {
                    dropout,
                    ..AttentionSpec::new(scale, causal)
                };
                (inputs, spec)
            },
        )
}

/// Attention built on a tape from its leaves (q, k, v).
type BuildAttention<'a> = &'a dyn Fn(&mut Tape<Cpu>, &[Var<Cpu>]) -> Result<Var<Cpu>>;

/// The output and the gradients of q, k and v (of `Σ out·c` for a fixed cotangent `c`)
/// of attention built by `build` on a tape, in f64.
fn attention_values(inputs: &[Case], build: BuildAttention<'_>) -> Vec<Vec<f64>> {
    let mut tape = Tape::<Cpu>::new(CpuDevice);
    let leaves: Vec<Var<Cpu>> = inputs
        .iter()
        .map(|(v, d)| tape.leaf(RawTensor::<Cpu>::from_vec(v.clone(), d, &CpuDevice).unwrap()))
        .collect();
    let out = build(&mut tape, &leaves).unwrap();
    let n = out.value().numel();
    let c: Vec<f64> = (0..n).map(|i| ((i * 7 % 5) as f64 - 2.0) / 3.0).collect();
    let c = tape.constant(RawTensor::<Cpu>::from_vec(c, out.value().dims(), &CpuDevice).unwrap());
    let weighted = tape.mul(&out, &c).unwrap();
    let loss = tape.sum_all(&weighted).unwrap();
    let grads = tape.gradients(&loss).unwrap();
    let mut all = vec![out.value().to_f64_vec().unwrap()];
    for leaf in &leaves {
        all.push(grads.get_or_zeros(leaf).unwrap().to_f64_vec().unwrap());
    }
    all
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn attention_rule((inputs, spec) in attention_case()) {
        check(inputs, &move |g, x| g.attention(&x[0], &x[1], &x[2], spec))?;
    }

    /// The fused op and the primitives it stands for agree in value and gradient.
    #[test]
    fn attention_fused_as_unfused((inputs, spec) in attention_case()) {
        let fused = attention_values(&inputs, &|g, x| g.attention(&x[0], &x[1], &x[2], spec));
        let unfused = attention_values(&inputs, &|g, x| {
            attention_by_primitives(g, &x[0], &x[1], &x[2], &spec)
        });
        for (what, (a, b)) in ["output", "dq", "dk", "dv"].iter().zip(fused.iter().zip(&unfused)) {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                prop_assert!((x - y).abs() <= 1e-12 + 1e-10 * y.abs(), "{what}[{i}]: fused {x}, unfused {y} ({spec:?})");
            }
        }
    }

    /// The backward ops' primitive spellings (what a backend without fused kernels
    /// runs) agree with the CPU's kernels.
    #[test]
    fn attention_backward_by_primitives((inputs, spec) in attention_case()) {
        use kiln::tensor::attention::{grad_by_primitives, lse_by_primitives};
        use kiln::tensor::{AttentionInput, Eager};
        let mut b = Eager::<Cpu>::new(CpuDevice);
        let x: Vec<RawTensor<Cpu>> = inputs
            .iter()
            .map(|(v, d)| RawTensor::<Cpu>::from_vec(v.clone(), d, &CpuDevice).unwrap())
            .collect();
        let out = b.attention(&x[0], &x[1], &x[2], spec).unwrap();
        let g: Vec<f64> = out.to_f64_vec().unwrap().iter().map(|v| (v * 3.0).sin()).collect();
        let g = RawTensor::<Cpu>::from_vec(g, out.dims(), &CpuDevice).unwrap();
        let lse = b.apply(Op::AttentionLse(spec), &[&x[0], &x[1]]).unwrap();
        let lse_p = lse_by_primitives(&mut b, &x[0], &x[1], &spec).unwrap();
        let prod = b.mul(&g, &out).unwrap();
        let last = out.dims().len() - 1;
        let delta = b.sum(&prod, &[last], true).unwrap();
        let mut pairs = vec![("lse", lse.clone(), lse_p)];
        for wrt in AttentionInput::ALL {
            let six = [&x[0], &x[1], &x[2], &g, &lse, &delta];
            let kernel = b.apply(Op::AttentionGrad { spec, wrt }, &six).unwrap();
            let by_primitives = grad_by_primitives(&mut b, &spec, wrt, &six).unwrap();
            pairs.push((wrt.name(), kernel, by_primitives));
        }
        for (what, kernel, by_primitives) in pairs {
            prop_assert_eq!(kernel.dims(), by_primitives.dims());
            let (a, b) = (kernel.to_f64_vec().unwrap(), by_primitives.to_f64_vec().unwrap());
            for (i, (x, y)) in a.iter().zip(&b).enumerate() {
                prop_assert!((x - y).abs() <= 1e-12 + 1e-10 * y.abs(), "{what}[{i}]: kernel {x}, primitives {y} ({spec:?})");
            }
        }
    }
}

#[test]
fn gather_and_scatter_rules() {
    let data = (vec![0.5, -1.0, 2.0, 0.3, 1.5, -0.7], vec![2, 3]);
    check(vec![data], &|g, x| {
        let idx = RawTensor::<Cpu>::from_vec(vec![2i32, 0, 0, 1, 1, 1], &[2, 3], &CpuDevice)?;
        let idx = g.constant(idx);
        g.gather(&x[0], 1, &idx)
    })
    .unwrap();
    let src = (vec![0.5, -1.0, 2.0, 0.3], vec![2, 2]);
    check(vec![src], &|g, x| {
        let idx = g.constant(RawTensor::<Cpu>::from_vec(
            vec![1i32, 1, 0, 2],
            &[2, 2],
            &CpuDevice,
        )?);
        g.scatter_add(vec![2, 3], 1, &idx, &x[0])
    })
    .unwrap();
}

#[test]
fn composite_gradients() {
    let x = (vec![0.3, -1.2, 0.8, 1.9, -0.4, 0.1, 0.7, -0.9], vec![2, 4]);
    let w = (vec![1.1, 0.9, 1.2, 0.8], vec![4]);
    let b = (vec![0.1, -0.2, 0.3, 0.0], vec![4]);
    check(vec![x.clone()], &|g, x| g.softmax(&x[0], 1)).unwrap();
    check(vec![x.clone()], &|g, x| g.log_softmax(&x[0], 0)).unwrap();
    // Causal attention weights over 3 queries × 3 keys, two heads.
    let scores = (
        vec![
            0.3, -1.2, 0.8, 1.9, -0.4, 0.1, 0.7, -0.9, 0.2, -0.5, 1.1, 0.6, 0.4, -0.3, 0.9, -1.0,
            0.5, 0.8,
        ],
        vec![2, 3, 3],
    );
    check(vec![scores], &|g, x| {
        let masked = g.causal_mask(&x[0])?;
        g.softmax(&masked, 2)
    })
    .unwrap();
    check(vec![x.clone()], &|g, x| g.gelu_erf(&x[0])).unwrap();
    check(vec![x.clone()], &|g, x| g.gelu_tanh(&x[0])).unwrap();
    check(vec![x.clone()], &|g, x| g.silu(&x[0])).unwrap();
    check(vec![x.clone(), w, b], &|g, x| {
        g.layer_norm(&x[0], 1, Some(&x[1]), Some(&x[2]), 1e-5)
    })
    .unwrap();
    check(vec![x.clone()], &|g, x| {
        let labels = g.constant(RawTensor::<Cpu>::from_vec(vec![3i32, 0], &[2], &CpuDevice)?);
        g.cross_entropy(&x[0], &labels, 0.1)
    })
    .unwrap();
    let y = (vec![0.0, 1.0, 0.5, -0.5, 0.2, 0.2, 0.1, 0.0], vec![2, 4]);
    check(vec![x.clone(), y], &|g, x| g.mse(&x[0], &x[1])).unwrap();
    let table = (vec![0.1, 0.2, 0.3, 0.4, 0.5, 0.6], vec![3, 2]);
    check(vec![table], &|g, x| {
        let ids = g.constant(RawTensor::<Cpu>::from_vec(
            vec![2i32, 0, 2],
            &[3],
            &CpuDevice,
        )?);
        g.embedding(&ids, &x[0])
    })
    .unwrap();
    let img: Vec<f64> = (0..2 * 4 * 5 * 5)
        .map(|i| ((i * 37 % 17) as f64 - 8.0) / 7.0)
        .collect();
    let wt: Vec<f64> = (0..6 * 2 * 3 * 3)
        .map(|i| ((i * 13 % 11) as f64 - 5.0) / 9.0)
        .collect();
    check(
        vec![
            (img.clone(), vec![2, 4, 5, 5]),
            (wt, vec![6, 2, 3, 3]),
            (vec![0.1, 0.2, -0.1, 0.0, 0.3, 0.05], vec![6]),
        ],
        &|g, x| {
            g.conv2d(
                &x[0],
                &x[1],
                Some(&x[2]),
                Conv2dOptions {
                    stride: [2, 1],
                    padding: [1, 1],
                    dilation: [1, 1],
                    groups: 2,
                },
            )
        },
    )
    .unwrap();
    check(vec![(img.clone(), vec![2, 4, 5, 5])], &|g, x| {
        g.max_pool2d(&x[0], [2, 2], [2, 2], [0, 0])
    })
    .unwrap();
    check(vec![(img, vec![2, 4, 5, 5])], &|g, x| {
        g.avg_pool2d(&x[0], [3, 3], [1, 2], [1, 1])
    })
    .unwrap();
}

#[test]
fn reused_values_accumulate() {
    let x = RawTensor::<Cpu>::from_vec(vec![1.0f64, 2.0], &[2], &CpuDevice).unwrap();
    let mut tape = Tape::<Cpu>::new(CpuDevice);
    let v = tape.leaf(x);
    let y = tape.mul(&v, &v).unwrap();
    let z = tape.add(&y, &v).unwrap();
    let l = tape.sum_all(&z).unwrap();
    let g = tape.gradients(&l).unwrap();
    assert_eq!(g.get(&v).unwrap().to_vec::<f64>().unwrap(), vec![3.0, 5.0]);
    assert_eq!(g.get(&v).unwrap().dtype(), DType::F64);
}

#[test]
fn gradcheck_rejects_a_wrong_gradient() {
    // Rounding through f32 has an analytic gradient of 1 but flat finite differences
    // at ε = 1e-9: the checker must notice.
    let x = (vec![0.3, -1.2, 0.8], vec![3]);
    let tol = Tolerance {
        eps: 1e-9,
        ..Tolerance::default()
    };
    let r = gradcheck::<Cpu>(
        &CpuDevice,
        &[x],
        |g, x| {
            let lo = g.cast(&x[0], DType::F32)?;
            g.cast(&lo, DType::F64)
        },
        tol,
    );
    assert!(r.is_err());
}
