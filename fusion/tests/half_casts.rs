//! The casts of mixed precision in fused groups: a widening cast reads its bf16 (or
//! f16) input at a group's edge, a narrowing cast is always its group's root (so a
//! value rounded to a half float is never computed with unrounded), groups with half
//! edges are never a product's epilogue, and the fused path gives the op-by-op path's
//! values bit for bit, rounding included.

use kiln_cpu::{Cpu, CpuDevice};
use kiln_fusion::{plan, KernelKind, Plan, Program, RunContext, SDim};
use kiln_tensor::ir::{Graph, NodeId};
use kiln_tensor::{BuilderExt, DType, RawTensor, Result, SymDim};

/// `h = relu(widen(narrow(a) · narrow(b)) * 3 + 1)` written back narrowed, then
/// widened again and halved, and `2h` rounded through `half` inside a chain and
/// quartered: outputs `[narrow(h), widen(narrow(h)) / 2, widen(narrow(2h)) / 4]`.
fn graph(half: DType) -> Result<(Graph<SDim>, Vec<NodeId>, Vec<NodeId>)> {
    let mut g = Graph::<SDim>::new();
    let b = SDim::param("B");
    let a = g.leaf(0, vec![b.clone(), SDim::lit(4)], DType::F32);
    let w = g.leaf(1, vec![SDim::lit(4), SDim::lit(3)], DType::F32);
    let (a16, w16) = (g.cast(&a, half)?, g.cast(&w, half)?);
    let p = g.matmul(&a16, &w16)?;
    let p = g.cast(&p, DType::F32)?;
    let h = g.mul_scalar(&p, 3.0)?;
    let h = g.add_scalar(&h, 1.0)?;
    let h = g.relu(&h)?;
    let narrowed = g.cast(&h, half)?;
    // Rounded, widened and computed with again: the rounding must survive fusion.
    let again = g.cast(&narrowed, DType::F32)?;
    let again = g.mul_scalar(&again, 0.5)?;
    // The same inside one chain whose rounded value is no output.
    let inner = g.mul_scalar(&h, 2.0)?;
    let inner = g.cast(&inner, half)?;
    let inner = g.cast(&inner, DType::F32)?;
    let inner = g.mul_scalar(&inner, 0.25)?;
    Ok((g, vec![a, w], vec![narrowed, again, inner]))
}

#[test]
fn half_casts_fuse_at_group_edges_and_round_as_op_by_op() -> Result<()> {
    for half in [DType::BF16, DType::F16] {
        let (g, inputs, outputs) = graph(half)?;
        let p = plan(&g, &inputs, &outputs);
        // No half value is interior to a group: each node of half dtype is the output
        // of its kernel.
        for k in &p.kernels {
            for &n in &k.nodes {
                if g.nodes[n].meta.dtype == half && k.kind == KernelKind::Elementwise {
                    assert!(k.outputs.contains(&n), "{half}: node {n} is inside {k:?}");
                }
            }
            if k.kind == KernelKind::MatMul {
                assert_eq!(
                    k.nodes.len(),
                    1,
                    "{half}: a half group became an epilogue: {k:?}"
                );
            }
        }
        let singles = p
            .kernels
            .iter()
            .filter(|k| k.kind == KernelKind::Single)
            .count();
        assert_eq!(singles, 0, "{half}: a cast ran on its own: {:?}", p.kernels);

        let mut program = Program::<Cpu>::new(Plan::parse(&p.to_text())?, &[]);
        let xs: Vec<f32> = (0..8).map(|i| 0.37 * i as f32 - 1.1).collect();
        let ws: Vec<f32> = (0..12).map(|i| 0.213 * i as f32 - 0.9).collect();
        let a = RawTensor::<Cpu>::from_vec(xs, &[2, 4], &CpuDevice)?;
        let w = RawTensor::<Cpu>::from_vec(ws, &[4, 3], &CpuDevice)?;
        let params = [("B", 2)];
        let fused: Vec<RawTensor<Cpu>> = program
            .run(&mut RunContext::new(&CpuDevice).sizes(&params), &[&a, &w])?
            .expect("the plan describes these inputs")
            .collect();
        let eager =
            program.run_op_by_op(&mut RunContext::new(&CpuDevice).sizes(&params), &[&a, &w])?;
        assert_eq!(fused[0].dtype(), half);
        for (f, e) in fused.iter().zip(&eager) {
            let (f, e) = (
                f.cast(DType::F32)?.to_vec::<f32>()?,
                e.cast(DType::F32)?.to_vec::<f32>()?,
            );
            assert_eq!(f, e, "{half}: fused and op by op differ");
        }
        // The second and third outputs really were rounded: each is a half-float
        // value halved, or quartered.
        let rounded_values = fused[1]
            .to_vec::<f32>()?
            .into_iter()
            .map(|v| 2.0 * v)
            .chain(fused[2].to_vec::<f32>()?.into_iter().map(|v| 4.0 * v));
        for twice in rounded_values {
            let rounded = RawTensor::<Cpu>::from_vec(vec![twice], &[1], &CpuDevice)?
                .cast(half)?
                .cast(DType::F32)?
                .to_vec::<f32>()?[0];
            assert_eq!(twice, rounded, "{half}: {twice} was not rounded to {half}");
        }
    }
    Ok(())
}
