//! A product read only through its transpose is planned as the transposed product
//! (`(a·b)ᵀ = bᵀ·aᵀ`), also when a cast or another element-wise unary op sits between
//! them, as in a mixed-precision weight gradient (`permute(cast_f32(x16ᵀ · dy16))`):
//! the result is written contiguously in the layout it is read in, instead of a
//! transposed view that every reader walks with strides. A product whose chain is read
//! elsewhere too, or is an output, keeps its layout.

use kiln_cpu::{Cpu, CpuDevice};
use kiln_fusion::{plan, Plan, Program, RunContext, SDim};
use kiln_tensor::ir::{Graph, NodeId, NodeKind};
use kiln_tensor::{Builder, BuilderExt, DType, Op, RawTensor, Result, SymDim, UnaryOp};

/// The graph of a mixed-precision weight gradient: `x` is `[B, 5]`, `dy` is `[B, 3]`,
/// the gradient `[3, 5]` is `permute(cast_f32(x16ᵀ · dy16))`, negated before the
/// permute where `negate`: the graph, its inputs, the last op before the permute, and
/// the permute.
fn weight_grad(negate: bool) -> Result<(Graph<SDim>, [NodeId; 2], NodeId, NodeId)> {
    let mut g = Graph::<SDim>::new();
    let b = SDim::param("B");
    let x = g.leaf(0, vec![b.clone(), SDim::lit(5)], DType::F32);
    let dy = g.leaf(1, vec![b, SDim::lit(3)], DType::F32);
    let x16 = g.cast(&x, DType::BF16)?;
    let dy16 = g.cast(&dy, DType::BF16)?;
    let xt = g.apply(Op::Permute { perm: vec![1, 0] }, &[&x16])?;
    let p = g.matmul(&xt, &dy16)?;
    let mut c = g.cast(&p, DType::F32)?;
    if negate {
        c = g.apply(Op::Unary(UnaryOp::Neg), &[&c])?;
    }
    let t = g.apply(Op::Permute { perm: vec![1, 0] }, &[&c])?;
    Ok((g, [x, dy], c, t))
}

/// The plan's nodes computing `name`.
fn ops<'a>(
    p: &'a Plan<SDim>,
    name: &'a str,
) -> impl Iterator<Item = &'a kiln_tensor::ir::Node<SDim>> {
    p.graph
        .nodes
        .iter()
        .filter(move |n| matches!(&n.kind, NodeKind::Op(op) if op.name() == name))
}

/// Runs `p` fused and op by op on `B = 4` with small integers (exact in bf16, so
/// every order of summation gives the same bits), checks its first output against the
/// gradient computed eagerly (negated where `negate`); both results of every output.
fn run(p: &Plan<SDim>, negate: bool) -> Result<Vec<(Vec<f32>, Vec<f32>)>> {
    let mut program = Program::<Cpu>::new(Plan::parse(&p.to_text())?, &[]);
    let xs: Vec<f32> = (0..20).map(|i| ((i * 7) % 9) as f32 - 4.0).collect();
    let dys: Vec<f32> = (0..12).map(|i| ((i * 5) % 7) as f32 - 3.0).collect();
    let x = RawTensor::<Cpu>::from_vec(xs, &[4, 5], &CpuDevice)?;
    let dy = RawTensor::<Cpu>::from_vec(dys, &[4, 3], &CpuDevice)?;
    let sizes = [("B", 4)];
    let fused: Vec<RawTensor<Cpu>> = program
        .run(&mut RunContext::new(&CpuDevice).sizes(&sizes), &[&x, &dy])?
        .expect("the plan describes these inputs")
        .collect();
    let eager = program.run_op_by_op(&mut RunContext::new(&CpuDevice).sizes(&sizes), &[&x, &dy])?;
    let want = x
        .cast(DType::BF16)?
        .permute(&[1, 0])?
        .matmul(&dy.cast(DType::BF16)?)?
        .cast(DType::F32)?
        .permute(&[1, 0])?
        .to_vec::<f32>()?
        .into_iter()
        .map(|v| if negate { -v } else { v })
        .collect::<Vec<f32>>();
    let mut out = Vec::new();
    for (f, e) in fused.iter().zip(&eager) {
        out.push((f.to_vec::<f32>()?, e.to_vec::<f32>()?));
    }
    assert_eq!(out[0].0, want, "the fused plan's gradient");
    assert_eq!(out[0].1, want, "the op-by-op gradient");
    Ok(out)
}

#[test]
fn a_cast_between_product_and_transpose_is_planned_transposed() -> Result<()> {
    let (g, inputs, _, t) = weight_grad(false)?;
    let p = plan(&g, &inputs, &[t]);
    let products: Vec<_> = ops(&p, "matmul").collect();
    assert_eq!(products.len(), 1);
    assert_eq!(
        products[0].meta.dims,
        vec![SDim::lit(3), SDim::lit(5)],
        "the product writes the gradient's layout: {}",
        p.to_text()
    );
    let out = &p.graph.nodes[p.outputs[0]];
    assert!(
        matches!(&out.kind, NodeKind::Op(Op::Cast { dtype: DType::F32 })),
        "the output is the cast itself, not a view of it: {}",
        p.to_text()
    );
    run(&p, false)?;
    Ok(())
}

#[test]
fn a_unary_op_after_the_cast_is_carried_along() -> Result<()> {
    let (g, inputs, _, t) = weight_grad(true)?;
    let p = plan(&g, &inputs, &[t]);
    assert!(
        matches!(
            &p.graph.nodes[p.outputs[0]].kind,
            NodeKind::Op(Op::Unary(UnaryOp::Neg))
        ),
        "{}",
        p.to_text()
    );
    assert_eq!(
        ops(&p, "matmul").next().expect("a product").meta.dims[0],
        SDim::lit(3)
    );
    run(&p, true)?;
    Ok(())
}

#[test]
fn a_chain_read_elsewhere_keeps_the_product_as_it_is() -> Result<()> {
    // The cast is an output too: its layout is the graph's, so nothing is transposed.
    let (g, inputs, c, t) = weight_grad(false)?;
    let p = plan(&g, &inputs, &[t, c]);
    assert_eq!(
        ops(&p, "matmul").next().expect("a product").meta.dims,
        vec![SDim::lit(5), SDim::lit(3)],
        "{}",
        p.to_text()
    );
    let out = run(&p, false)?;
    let (f, e) = &out[1];
    assert_eq!(f, e);
    Ok(())
}
