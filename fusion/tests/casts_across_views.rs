//! Mixed precision's casts are moved across the permutes and reshapes around them
//! before planning: a narrowing cast read through a head split becomes the root of the
//! group computing its input, a widening cast read through views joins the group of
//! its readers, and a narrowing of a widened half value is the half value itself. The
//! rewrite is exact: every case is checked against the original graph run eagerly, op
//! after op, fused and op by op, bit for bit, on values that are not exact in bf16 (so
//! a rounding moved or lost would show).

use kiln_cpu::{Cpu, CpuDevice};
use kiln_fusion::{plan, KernelKind, Plan, Program, RunContext, SDim};
use kiln_tensor::ir::{Graph, NodeId, NodeKind};
use kiln_tensor::{Builder, BuilderExt, DType, Eager, Op, RawTensor, Result, SymDim};

/// The computations under test, written once for any builder: planned on a graph and
/// run eagerly for the reference.
#[derive(Clone, Copy, Debug)]
enum Case {
    /// `cast_bf16(permute(reshape(a + b)))`: a projection's bias add, its heads split,
    /// narrowed for attention.
    NarrowedHeads,
    /// The same, with the permuted f32 heads an output too.
    NarrowedHeadsAlsoRead,
    /// `cast_f32(x16)` merged from heads (`reshape(permute(..))`), narrowed again and
    /// multiplied by a narrowed weight: attention's output into the projection.
    RoundTrip,
    /// `permute(reshape(cast_f32(x16))) * 3`: a widened value read through views.
    WidenedHeads,
    /// A narrowing cast that is an output, of a view that is an output too.
    OutputsKept,
    /// A widened product read by two groups, one of them after a second product:
    /// `w = cast_f32(cast_half(a·w))`, outputs `2w` and `b·w + w`.
    WidenedTwice,
}

const CASES: [Case; 6] = [
    Case::NarrowedHeads,
    Case::NarrowedHeadsAlsoRead,
    Case::RoundTrip,
    Case::WidenedHeads,
    Case::OutputsKept,
    Case::WidenedTwice,
];

/// Builds `case` in half dtype `half` from inputs `a`, `b` (`[4, 6]`) and `w`
/// (`[6, 5]`); its outputs.
fn build<Bd: Builder>(
    g: &mut Bd,
    case: Case,
    half: DType,
    [a, b, w]: [&Bd::Value; 3],
) -> Result<Vec<Bd::Value>> {
    let d = |n: usize| <Bd::Dim as SymDim>::lit(n);
    let heads = |g: &mut Bd, x: &Bd::Value| -> Result<Bd::Value> {
        let x = g.reshape(x, vec![d(4), d(2), d(3)])?;
        g.permute(&x, &[1, 0, 2])
    };
    let merged = |g: &mut Bd, x: &Bd::Value| -> Result<Bd::Value> {
        let x = g.permute(x, &[1, 0, 2])?;
        g.reshape(&x, vec![d(4), d(6)])
    };
    Ok(match case {
        Case::NarrowedHeads | Case::NarrowedHeadsAlsoRead => {
            let y = g.add(a, b)?;
            let h = heads(g, &y)?;
            let h16 = g.cast(&h, half)?;
            let h16 = g.cast(&h16, DType::F32)?;
            let out = g.mul_scalar(&h16, 0.5)?;
            match case {
                Case::NarrowedHeads => vec![out],
                _ => vec![out, h],
            }
        }
        Case::RoundTrip => {
            let x16 = g.cast(a, half)?;
            let x16 = heads(g, &x16)?;
            let x = g.cast(&x16, DType::F32)?;
            let x = merged(g, &x)?;
            let x16 = g.cast(&x, half)?;
            let w16 = g.cast(w, half)?;
            let p = g.matmul(&x16, &w16)?;
            vec![g.cast(&p, DType::F32)?]
        }
        Case::WidenedHeads => {
            let x16 = g.cast(a, half)?;
            let x = g.cast(&x16, DType::F32)?;
            let x = heads(g, &x)?;
            vec![g.mul_scalar(&x, 3.0)?]
        }
        Case::OutputsKept => {
            let y = g.add(a, b)?;
            let h = heads(g, &y)?;
            let h16 = g.cast(&h, half)?;
            let wide = g.cast(&h16, DType::F32)?;
            let again = merged(g, &wide)?;
            let again16 = g.cast(&again, half)?;
            vec![h16, h, again16]
        }
        Case::WidenedTwice => {
            let p = g.matmul(a, w)?;
            let p16 = g.cast(&p, half)?;
            let wide = g.cast(&p16, DType::F32)?;
            let twice = g.mul_scalar(&wide, 2.0)?;
            let q = g.matmul(b, w)?;
            let sum = g.add(&q, &wide)?;
            vec![twice, sum]
        }
    })
}

/// The inputs: values spread over a few binades, none exact in bf16.
fn inputs() -> Result<[RawTensor<Cpu>; 3]> {
    let values = |n: usize, k: f32| -> Vec<f32> {
        (0..n)
            .map(|i| ((i as f32 * k).sin() * 3.7) + 0.013 * i as f32)
            .collect()
    };
    Ok([
        RawTensor::from_vec(values(24, 1.3), &[4, 6], &CpuDevice)?,
        RawTensor::from_vec(values(24, 0.7), &[4, 6], &CpuDevice)?,
        RawTensor::from_vec(values(30, 2.1), &[6, 5], &CpuDevice)?,
    ])
}

/// `case` planned in half dtype `half`.
fn planned_in(case: Case, half: DType) -> Result<Plan<SDim>> {
    let mut g = Graph::<SDim>::new();
    let lit = SDim::lit;
    let a = g.leaf(0, vec![lit(4), lit(6)], DType::F32);
    let b = g.leaf(1, vec![lit(4), lit(6)], DType::F32);
    let w = g.leaf(2, vec![lit(6), lit(5)], DType::F32);
    let outputs = build(&mut g, case, half, [&a, &b, &w])?;
    Ok(plan(&g, &[a, b, w], &outputs))
}

/// `case` planned in bf16.
fn planned(case: Case) -> Result<Plan<SDim>> {
    planned_in(case, DType::BF16)
}

/// The plan's live nodes that are casts from `from` to `to`.
fn casts(p: &Plan<SDim>, from: DType, to: DType) -> Vec<NodeId> {
    let kernel_nodes: Vec<NodeId> = p.kernels.iter().flat_map(|k| k.nodes.clone()).collect();
    (0..p.graph.nodes.len())
        .filter(|n| kernel_nodes.contains(n))
        .filter(|&n| {
            let node = &p.graph.nodes[n];
            matches!(&node.kind, NodeKind::Op(Op::Cast { dtype }) if *dtype == to)
                && p.graph.nodes[node.inputs[0]].meta.dtype == from
        })
        .collect()
}

/// Whether `n` is read through a view: its input is a permute or reshape.
fn reads_a_view(p: &Plan<SDim>, n: NodeId) -> bool {
    let x = p.graph.nodes[n].inputs[0];
    matches!(&p.graph.nodes[x].kind, NodeKind::Op(op) if op.is_view())
}

/// Runs the plan of `case` in `half` fused and op by op against the original graph
/// run eagerly.
fn check_values(case: Case, half: DType, p: &Plan<SDim>) -> Result<()> {
    let xs = inputs()?;
    let mut eager = Eager::<Cpu>::new(CpuDevice);
    let want = build(&mut eager, case, half, [&xs[0], &xs[1], &xs[2]])?;
    let mut program = Program::<Cpu>::new(Plan::parse(&p.to_text())?, &[]);
    let refs = [&xs[0], &xs[1], &xs[2]];
    let fused: Vec<RawTensor<Cpu>> = program
        .run(&mut RunContext::new(&CpuDevice), &refs)?
        .expect("the plan describes these inputs")
        .collect();
    let op_by_op = program.run_op_by_op(&mut RunContext::new(&CpuDevice), &refs)?;
    assert_eq!(want.len(), fused.len());
    for (k, w) in want.iter().enumerate() {
        for (path, got) in [("fused", &fused[k]), ("op by op", &op_by_op[k])] {
            assert_eq!(
                got.dtype(),
                w.dtype(),
                "{case:?} in {half}, output {k} ({path})"
            );
            assert_eq!(
                got.dims(),
                w.dims(),
                "{case:?} in {half}, output {k} ({path})"
            );
            let (got, w) = (
                got.cast(DType::F32)?.to_vec::<f32>()?,
                w.cast(DType::F32)?.to_vec::<f32>()?,
            );
            assert_eq!(
                got, w,
                "{case:?} in {half}, output {k} ({path}) against eager"
            );
        }
    }
    Ok(())
}

#[test]
fn every_case_computes_what_the_original_graph_computes() -> Result<()> {
    for half in [DType::BF16, DType::F16] {
        for case in CASES {
            check_values(case, half, &planned_in(case, half)?)?;
        }
    }
    Ok(())
}

#[test]
fn a_narrowing_cast_read_through_heads_is_the_root_of_the_bias_add() -> Result<()> {
    let p = planned(Case::NarrowedHeads)?;
    let narrowing = casts(&p, DType::F32, DType::BF16);
    assert_eq!(narrowing.len(), 1, "{}", p.to_text());
    assert!(!reads_a_view(&p, narrowing[0]), "{}", p.to_text());
    let kernel = p
        .kernels
        .iter()
        .find(|k| k.nodes.contains(&narrowing[0]))
        .expect("the cast runs in a kernel");
    assert_eq!(kernel.kind, KernelKind::Elementwise);
    assert!(
        kernel.nodes.iter().any(|&n| matches!(
            &p.graph.nodes[n].kind,
            NodeKind::Op(op) if op.name() == "add"
        )),
        "the add and its narrowing share a kernel: {}",
        p.to_text()
    );
    // Read elsewhere in f32 too, the add is stored in f32 and the narrowing still
    // reads it in its own layout.
    let p = planned(Case::NarrowedHeadsAlsoRead)?;
    for n in casts(&p, DType::F32, DType::BF16) {
        assert!(!reads_a_view(&p, n), "{}", p.to_text());
    }
    Ok(())
}

#[test]
fn a_narrowing_of_a_widened_value_is_the_value_itself() -> Result<()> {
    let p = planned(Case::RoundTrip)?;
    // Left: the two inputs' narrowing casts and the product's widening.
    assert_eq!(
        casts(&p, DType::F32, DType::BF16).len(),
        2,
        "{}",
        p.to_text()
    );
    assert_eq!(
        casts(&p, DType::BF16, DType::F32).len(),
        1,
        "{}",
        p.to_text()
    );
    // The head merge copies bf16 values.
    let copies: Vec<_> = p
        .kernels
        .iter()
        .filter(|k| k.kind == KernelKind::View)
        .map(|k| &p.graph.nodes[k.outputs[0]])
        .filter(|n| matches!(&n.kind, NodeKind::Op(Op::Reshape { .. })))
        .collect();
    assert!(
        copies.iter().all(|n| n.meta.dtype == DType::BF16),
        "{}",
        p.to_text()
    );
    Ok(())
}

#[test]
fn a_widening_cast_read_through_views_joins_its_reader() -> Result<()> {
    let p = planned(Case::WidenedHeads)?;
    let widening = casts(&p, DType::BF16, DType::F32);
    assert_eq!(widening.len(), 1, "{}", p.to_text());
    assert!(reads_a_view(&p, widening[0]), "{}", p.to_text());
    let kernel = p
        .kernels
        .iter()
        .find(|k| k.nodes.contains(&widening[0]))
        .expect("the cast runs in a kernel");
    assert!(
        kernel.nodes.len() > 1,
        "the cast runs alone: {}",
        p.to_text()
    );
    Ok(())
}

#[test]
fn outputs_keep_their_nodes() -> Result<()> {
    let p = planned(Case::OutputsKept)?;
    let ops: Vec<&str> = p
        .outputs
        .iter()
        .map(|&o| match &p.graph.nodes[o].kind {
            NodeKind::Op(op) => op.name(),
            _ => "not an op",
        })
        .collect();
    assert_eq!(ops, ["cast", "permute", "cast"], "{}", p.to_text());
    check_values(Case::OutputsKept, DType::BF16, &p)
}

#[test]
fn a_widening_cast_read_twice_is_a_load_in_each_reader_and_no_epilogue() -> Result<()> {
    let p = planned(Case::WidenedTwice)?;
    let widening = casts(&p, DType::BF16, DType::F32);
    assert!(!widening.is_empty(), "{}", p.to_text());
    for k in &p.kernels {
        let casts_only = k.nodes.iter().all(|n| widening.contains(n));
        assert!(
            !casts_only,
            "a widening cast stored on its own: {}",
            p.to_text()
        );
        if k.kind == KernelKind::MatMul {
            let reads_half = k.nodes.iter().any(|&n| {
                p.graph.nodes[n]
                    .inputs
                    .iter()
                    .any(|&i| p.graph.nodes[i].meta.dtype == DType::BF16)
            });
            assert!(
                !reads_half,
                "a product's epilogue reads bf16: {}",
                p.to_text()
            );
        }
    }
    Ok(())
}
