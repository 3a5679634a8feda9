//! The planner and executor against op-by-op execution on random graphs of
//! elementwise ops (with broadcasting, comparisons and `where`) and reductions (whose
//! neighbours become prologues and epilogues): a plan run by a `Program` on the CPU
//! must give what the eager ops give, for every output, twice in a row (the second run
//! reuses the buffers of the first).

use kiln_cpu::{Cpu, CpuDevice};
use kiln_fusion::{plan, Program, RunContext, SDim};
use kiln_tensor::ir::Graph;
use kiln_tensor::{BinaryOp, DType, Eager, RandDist, RawTensor, ReduceOp, Result, SymDim, UnaryOp};
use proptest::prelude::*;

#[path = "support/random_graph.rs"]
mod random_graph;
use random_graph::{build, step, Step};

fn check(
    rows: usize,
    cols: usize,
    steps: &[Step],
    extra: usize,
) -> std::result::Result<(), TestCaseError> {
    let dev = CpuDevice;
    let shapes = [vec![rows, cols], vec![1, cols], vec![rows, 1]];
    let tensors: Vec<RawTensor<Cpu>> = shapes
        .iter()
        .enumerate()
        .map(|(i, d)| {
            RawTensor::rand(
                d,
                RandDist::Uniform {
                    low: -2.0,
                    high: 2.0,
                },
                i as u64 + 1,
                DType::F32,
                &dev,
            )
        })
        .collect::<Result<_>>()
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let mut eager = Eager::<Cpu>::new(dev);
    let want = build(&mut eager, tensors.clone(), steps)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;

    let scale = want
        .iter()
        .flat_map(|t| t.to_vec::<f32>().unwrap())
        .filter(|v| v.is_finite())
        .fold(0f32, |m, v| m.max(v.abs()));
    let mut g = Graph::<SDim>::new();
    let leaves: Vec<usize> = shapes
        .iter()
        .enumerate()
        .map(|(i, d)| g.leaf(i, d.iter().map(|&x| SDim::lit(x)).collect(), DType::F32))
        .collect();
    let vals =
        build(&mut g, leaves.clone(), steps).map_err(|e| TestCaseError::fail(e.to_string()))?;
    // The last value and one more from anywhere: outputs that other kernels also read.
    let (last, other) = (vals.len() - 1, extra % vals.len());
    let p = plan(&g, &leaves, &[vals[last], vals[other]]);
    let mut program = Program::<Cpu>::new(p, &[]);
    let ins: Vec<&RawTensor<Cpu>> = tensors.iter().collect();
    for run in 0..2 {
        let got: Vec<RawTensor<Cpu>> = program
            .run(&mut RunContext::new(&dev), &ins)
            .map_err(|e| TestCaseError::fail(e.to_string()))?
            .expect("a plan of literal dims describes its inputs")
            .collect();
        for (g, w) in got.iter().zip([&want[last], &want[other]]) {
            let (g, w) = (g.to_vec::<f32>().unwrap(), w.to_vec::<f32>().unwrap());
            prop_assert_eq!(g.len(), w.len());
            for (i, (a, b)) in g.iter().zip(&w).enumerate() {
                // Sums may add in another order than the eager kernels: their rounding
                // scales with the largest value in the graph, not with the result.
                let tol = 1e-5 * (1.0 + b.abs().max(scale));
                let same = a == b || (a.is_nan() && b.is_nan()) || (a - b).abs() <= tol;
                prop_assert!(
                    same,
                    "run {}: element {} is {} fused, {} unfused ({:?})",
                    run,
                    i,
                    a,
                    b,
                    steps
                );
            }
        }
    }
    Ok(())
}

proptest! {
    // A fixed seed keeps CI deterministic; change it (or the case count) to explore.
    #![proptest_config(ProptestConfig {
        cases: 96,
        failure_persistence: None,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x6b69_6c6e),
        ..ProptestConfig::default()
    })]

    #[test]
    fn plans_run_like_eager_ops(
        rows in 1..40usize,
        cols in 1..70usize,
        steps in prop::collection::vec(step(), 1..14),
        extra in any::<usize>(),
    ) {
        check(rows, cols, &steps, extra)?;
    }
}

#[test]
fn large_graphs_run_in_parallel_chunks() {
    // Big enough for the CPU kernels' parallel, chunked paths.
    let steps = [
        Step::Binary(BinaryOp::Mul, 0, 1),
        Step::Unary(UnaryOp::Sigmoid, 3),
        Step::Reduce(ReduceOp::Sum, 4, 1),
        Step::Binary(BinaryOp::Sub, 4, 5),
        Step::Reduce(ReduceOp::Max, 6, 0),
        Step::Binary(BinaryOp::Add, 6, 7),
    ];
    check(300, 700, &steps, 5).unwrap();
}
