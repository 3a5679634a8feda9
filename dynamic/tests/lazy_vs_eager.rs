//! The lazy path against the eager executor on random graphs (kiln-fusion's
//! generator): the values a lazily recorded graph computes when read — planned, fused
//! and run by a cached program — are the eager ops' values, at two sizes of the same
//! graph (the second a cache hit on the first's program when the sizes allow), and in
//! eager mode; and shape mistakes refused where they are made.

use kiln_cpu::{Cpu, CpuDevice};
use kiln_dynamic::LazyTensor;
use kiln_tensor::{DType, Eager, RandDist, RawTensor};
use proptest::prelude::*;

#[path = "../../fusion/tests/support/random_graph.rs"]
mod random_graph;
use random_graph::{build, step, Step};

fn inputs(rows: usize, cols: usize) -> Vec<RawTensor<Cpu>> {
    [vec![rows, cols], vec![1, cols], vec![rows, 1]]
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let dist = RandDist::Uniform {
                low: -2.0,
                high: 2.0,
            };
            RawTensor::rand(d, dist, i as u64 + 1, DType::F32, &CpuDevice).unwrap()
        })
        .collect()
}

fn check(rows: usize, cols: usize, steps: &[Step], extra: usize) -> Result<(), TestCaseError> {
    let tensors = inputs(rows, cols);
    let want = build(&mut Eager::<Cpu>::new(CpuDevice), tensors.clone(), steps)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let scale = want
        .iter()
        .flat_map(|t| t.to_vec::<f32>().unwrap())
        .filter(|v| v.is_finite())
        .fold(0f32, |m, v| m.max(v.abs()));
    let lazy: Vec<LazyTensor<Cpu>> = tensors.iter().cloned().map(LazyTensor::from_raw).collect();
    let mut b = kiln_dynamic::Lazy::<Cpu>::new(CpuDevice);
    let vals = build(&mut b, lazy, steps).map_err(|e| TestCaseError::fail(e.to_string()))?;
    // Two values read: the last, and one more that later values may also use.
    let (last, other) = (vals.len() - 1, extra % vals.len());
    let picked = [vals[last].clone(), vals[other].clone()];
    drop(vals);
    kiln_dynamic::eval(&[&picked[0], &picked[1]])
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    for (g, w) in picked.iter().zip([&want[last], &want[other]]) {
        let (g, w) = (g.to_vec::<f32>().unwrap(), w.to_vec::<f32>().unwrap());
        prop_assert_eq!(g.len(), w.len());
        for (i, (a, b)) in g.iter().zip(&w).enumerate() {
            // Sums may add in another order than the eager kernels.
            let tol = 1e-5 * (1.0 + b.abs().max(scale));
            let same = a == b || (a.is_nan() && b.is_nan()) || (a - b).abs() <= tol;
            prop_assert!(same, "element {} is {} lazily, {} eagerly", i, a, b);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn lazy_graphs_compute_the_eager_values(
        rows in 1usize..6,
        cols in 1usize..7,
        steps in prop::collection::vec(step(), 1..12),
        extra in any::<usize>(),
    ) {
        check(rows, cols, &steps, extra)?;
        // The same graph at other sizes: a hit when the sizes abstract alike.
        check(rows + 2, cols + 3, &steps, extra)?;
    }
}

#[test]
fn shape_mistakes_are_refused_where_they_are_made() {
    let dev = CpuDevice;
    let a = LazyTensor::<Cpu>::from_raw(RawTensor::full(&[2, 3], 1.0, DType::F32, &dev).unwrap());
    let b = LazyTensor::<Cpu>::from_raw(RawTensor::full(&[4, 3], 1.0, DType::F32, &dev).unwrap());
    let err = a.matmul(&b).unwrap_err().to_string();
    assert!(err.contains("[2, 3]") && err.contains("[4, 3]"), "{err}");
    let err = a.add(&b).unwrap_err().to_string();
    assert!(err.contains("[2, 3]") && err.contains("[4, 3]"), "{err}");
    assert!(
        a.backward().is_err(),
        "a tensor of 6 elements is not a loss"
    );
    assert!(
        a.sum_all().unwrap().backward().is_err(),
        "nothing requires gradients"
    );
}

#[test]
fn eager_mode_gives_the_lazy_values() {
    let dev = CpuDevice;
    let x = RawTensor::<Cpu>::rand(
        &[3, 4],
        RandDist::Normal {
            mean: 0.0,
            std: 1.0,
        },
        5,
        DType::F32,
        &dev,
    )
    .unwrap();
    let f = || {
        let w = kiln_dynamic::Param::new(x.clone());
        let l = w
            .get()
            .tanh()
            .unwrap()
            .softmax(1)
            .unwrap()
            .mul_scalar(3.0)
            .unwrap()
            .exp()
            .unwrap()
            .sum_all()
            .unwrap();
        let g = l.backward().unwrap();
        (
            l.scalar_value().unwrap(),
            w.grad(&g).unwrap().to_vec::<f32>().unwrap(),
        )
    };
    let lazy = f();
    kiln_dynamic::set_eager(true);
    let eager = f();
    kiln_dynamic::set_eager(false);
    assert!((lazy.0 - eager.0).abs() < 1e-6);
    for (a, b) in lazy.1.iter().zip(&eager.1) {
        assert!((a - b).abs() < 1e-6, "{a} vs {b}");
    }
}

/// Attention weights written by hand, with `dropout` (`(p, seed)`) on them or not,
/// times the values.
fn hand_written_attention<G: kiln_tensor::BuilderExt>(
    b: &mut G,
    q: &G::Value,
    k: &G::Value,
    v: &G::Value,
    dropout: Option<(f64, u64)>,
) -> kiln_tensor::Result<G::Value> {
    let kt = b.t(k)?;
    let scores = b.matmul(q, &kt)?;
    let scores = b.mul_scalar(&scores, 0.5)?;
    let masked = b.causal_mask(&scores)?;
    let mut weights = b.softmax(&masked, 3)?;
    if let Some((p, seed)) = dropout {
        weights = b.dropout(&weights, p, seed)?;
    }
    b.matmul(&weights, v)
}

#[test]
fn hand_written_attention_is_recorded_as_the_fused_op() {
    for dropout in [None, Some((0.3, 5))] {
        recorded_as_the_fused_op(dropout);
    }
}

/// Hand-written attention (with `dropout` on its weights or not) recorded on the dynamic
/// path: the fused op, equal in value and gradient to the primitives recorded as they
/// are and to the eager executor's run of the hand-written ops.
fn recorded_as_the_fused_op(dropout: Option<(f64, u64)>) {
    use kiln_tensor::{AttentionDropout, AttentionSpec, Builder, BuilderExt, Op};
    let dev = CpuDevice;
    let normal = RandDist::Normal {
        mean: 0.0,
        std: 1.0,
    };
    let raw = [[2, 3, 5, 4], [2, 3, 5, 4], [2, 3, 5, 6]]
        .iter()
        .enumerate()
        .map(|(i, d)| RawTensor::<Cpu>::rand(d, normal, 10 + i as u64, DType::F32, &dev).unwrap())
        .collect::<Vec<_>>();
    let cot = RawTensor::<Cpu>::rand(&[2, 3, 5, 6], normal, 20, DType::F32, &dev).unwrap();
    // The comparison in f32 tests `p` as f32 holds it.
    let spec = AttentionSpec {
        dropout: dropout.map(|(p, seed)| AttentionDropout {
            p: p as f32 as f64,
            seed,
        }),
        ..AttentionSpec::new(0.5, true)
    };
    // Values and gradients of Σ out·cot, by hand (recognised) or by the primitives.
    let run = |by_hand: bool| {
        let leaves: Vec<LazyTensor<Cpu>> = raw
            .iter()
            .map(|t| LazyTensor::leaf(t.clone(), true))
            .collect();
        let mut b = kiln_dynamic::Lazy::<Cpu>::new(dev);
        let (q, k, v) = (&leaves[0], &leaves[1], &leaves[2]);
        let out = if by_hand {
            hand_written_attention(&mut b, q, k, v, dropout).unwrap()
        } else {
            kiln_tensor::attention::attention_by_primitives(&mut b, q, k, v, &spec).unwrap()
        };
        let (op, _) = b.producer(&out).expect("recorded");
        let c = LazyTensor::from_raw(cot.clone());
        let loss = b.mul(&out, &c).unwrap();
        let loss = b.sum_all(&loss).unwrap();
        let grads = loss.backward().unwrap();
        let mut all = vec![out.to_vec::<f32>().unwrap()];
        for leaf in &leaves {
            all.push(
                grads
                    .get(leaf)
                    .expect("a gradient")
                    .to_vec::<f32>()
                    .unwrap(),
            );
        }
        (op, all)
    };
    let (fused_op, fused) = run(true);
    let (plain_op, plain) = run(false);
    assert_eq!(fused_op, Op::Attention(spec));
    assert_eq!(plain_op, Op::MatMul);
    // The eager executor runs the primitives as written.
    let eager = hand_written_attention(
        &mut kiln_tensor::Eager::<Cpu>::new(dev),
        &raw[0],
        &raw[1],
        &raw[2],
        dropout,
    )
    .unwrap();
    assert_eq!(eager.dims().as_slice(), &[2, 3, 5, 6]);
    let eager = eager.to_vec::<f32>().unwrap();
    for (what, (a, b)) in ["output", "dq", "dk", "dv"]
        .iter()
        .zip(fused.iter().zip(&plain))
    {
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!(
                (x - y).abs() <= 1e-5 * (1.0 + y.abs()),
                "{what}[{i}]: fused {x}, primitives {y} ({dropout:?})"
            );
        }
    }
    for (i, (x, y)) in fused[0].iter().zip(&eager).enumerate() {
        assert!(
            (x - y).abs() <= 1e-5 * (1.0 + y.abs()),
            "output[{i}]: fused {x}, eager {y} ({dropout:?})"
        );
    }
    if dropout.is_some() {
        assert_ne!(eager, run_without_dropout(&raw), "dropout changed nothing");
    }
}

/// The hand-written attention's output without dropout, run eagerly.
fn run_without_dropout(raw: &[RawTensor<Cpu>]) -> Vec<f32> {
    let mut b = kiln_tensor::Eager::<Cpu>::new(CpuDevice);
    hand_written_attention(&mut b, &raw[0], &raw[1], &raw[2], None)
        .unwrap()
        .to_vec::<f32>()
        .unwrap()
}
