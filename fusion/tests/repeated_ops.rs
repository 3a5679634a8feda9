//! An op that repeats an earlier one (the same op of the same inputs) is planned once:
//! a layer norm's output cast to bf16 for each of three projections becomes one cast.
//! Draws stay apart (two draws of one seed are the step's two draws), outputs keep their
//! own buffers, and the plan computes what the graph does, bit for bit.

use kiln_cpu::{Cpu, CpuDevice};
use kiln_fusion::{plan, Plan, Program, RunContext, SDim};
use kiln_tensor::ir::{Graph, NodeKind};
use kiln_tensor::{Builder, BuilderExt, DType, Op, RandDist, RawTensor, Result, SymDim};

/// How many nodes of `p` compute `name`.
fn count(p: &Plan<SDim>, name: &str) -> usize {
    p.graph
        .nodes
        .iter()
        .filter(|n| matches!(&n.kind, NodeKind::Op(op) if op.name() == name))
        .count()
}

#[test]
fn repeated_ops_are_planned_once_and_compute_the_graph() -> Result<()> {
    let mut g = Graph::<SDim>::new();
    let b = SDim::param("B");
    let x = g.leaf(0, vec![b.clone(), SDim::lit(4)], DType::F32);
    let w = g.leaf(1, vec![SDim::lit(4), SDim::lit(3)], DType::F32);
    let norm = g.mul_scalar(&x, 0.5)?;
    // Three readers, each casting the shared value itself.
    let products = (0..3)
        .map(|_| -> Result<_> {
            let n16 = g.cast(&norm, DType::BF16)?;
            let w16 = g.cast(&w, DType::BF16)?;
            let p = g.matmul(&n16, &w16)?;
            g.cast(&p, DType::F32)
        })
        .collect::<Result<Vec<_>>>()?;
    let s = g.add(&products[0], &products[1])?;
    let s = g.add(&s, &products[2])?;
    // Two draws of one seed are two draws.
    let dims = vec![b.clone(), SDim::lit(3)];
    let draw = Op::Rand {
        dims: dims.clone(),
        dist: RandDist::Uniform {
            low: 0.0,
            high: 1.0,
        },
        seed: 7,
        dtype: DType::F32,
    };
    let r1 = g.apply(draw.clone(), &[])?;
    let r2 = g.apply(draw, &[])?;
    let noisy = g.add(&s, &r1)?;
    let noisy = g.add(&noisy, &r2)?;
    // An output repeating another keeps its own node.
    let twice_a = g.mul_scalar(&x, 0.5)?;
    let outputs = [s, noisy, norm, twice_a];
    let p = plan(&g, &[x, w], &outputs);
    assert_eq!(
        count(&p, "cast"),
        3,
        "one cast of each operand, one of the product"
    );
    assert_eq!(count(&p, "matmul"), 1, "{}", p.to_text());
    assert_eq!(count(&p, "rand"), 2, "draws are never merged");
    assert_ne!(p.outputs[2], p.outputs[3], "outputs keep their own nodes");

    let mut program = Program::<Cpu>::new(Plan::parse(&p.to_text())?, &[]);
    let xs: Vec<f32> = (0..8).map(|i| 0.37 * i as f32 - 1.1).collect();
    let ws: Vec<f32> = (0..12).map(|i| 0.213 * i as f32 - 0.9).collect();
    let x = RawTensor::<Cpu>::from_vec(xs, &[2, 4], &CpuDevice)?;
    let w = RawTensor::<Cpu>::from_vec(ws, &[4, 3], &CpuDevice)?;
    let params = [("B", 2)];
    let fused: Vec<RawTensor<Cpu>> = program
        .run(&mut RunContext::new(&CpuDevice).sizes(&params), &[&x, &w])?
        .expect("the plan describes these inputs")
        .collect();
    let eager = program.run_op_by_op(&mut RunContext::new(&CpuDevice).sizes(&params), &[&x, &w])?;
    for (f, e) in fused.iter().zip(&eager) {
        assert_eq!(
            f.to_vec::<f32>()?,
            e.to_vec::<f32>()?,
            "fused and op by op differ"
        );
    }
    // The three products are one product three times.
    let single = fused[0].to_vec::<f32>()?;
    let one = x
        .mul_scalar(0.5)?
        .cast(DType::BF16)?
        .matmul(&w.cast(DType::BF16)?)?
        .cast(DType::F32)?
        .to_vec::<f32>()?;
    let thrice: Vec<f32> = one.iter().map(|v| v + v + v).collect();
    assert_eq!(single, thrice);
    Ok(())
}
