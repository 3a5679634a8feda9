//! Row passes: a layer norm's kernels (its statistics and its normalisation) and its
//! gradient's (two row sums and the input gradient) are marked as passes, and a pass
//! run as one pass over blocks of rows gives the bits of its kernels run apart, on
//! rows that do not fill a block, on many rows (blocks in parallel), on an input
//! broadcast across the batch (blocks that stop where its rows stop being evenly
//! apart) and on rows of one value. A plan text that marks kernels that are no pass
//! is refused before it runs.

use kiln_cpu::{Cpu, CpuDevice};
use kiln_fusion::{plan, KernelKind, Plan, Program, RunContext, SDim};
use kiln_tensor::ir::Graph;
use kiln_tensor::op::UnaryOp;
use kiln_tensor::{Builder, BuilderExt, DType, RawTensor, Result, SymDim};

/// A layer norm of `x [B, T, C]` with weight `w [C]` plus a per-position term
/// `pos [T, C]` (read broadcast across the batch), and the gradient of its input for
/// an incoming gradient `gy`, written as its backward pass computes it:
/// `inv · (gxn − mean(gxn) − xn · mean(gxn · xn))` with `gxn = gy · w`.
fn build<Bd: Builder>(g: &mut Bd, [x, w, pos, gy]: [&Bd::Value; 4]) -> Result<Vec<Bd::Value>> {
    let m = g.mean(x, &[2], true)?;
    let d = g.sub(x, &m)?;
    let d2 = g.square(&d)?;
    let v = g.mean(&d2, &[2], true)?;
    let ve = g.add_scalar(&v, 1e-5)?;
    let inv = g.unary(UnaryOp::Rsqrt, &ve)?;
    let xn = g.mul(&d, &inv)?;
    let y = g.mul(&xn, w)?;
    let y = g.add(&y, pos)?;
    let gxn = g.mul(gy, w)?;
    let mean_g = g.mean(&gxn, &[2], true)?;
    let gx_xn = g.mul(&gxn, &xn)?;
    let mean_gx = g.mean(&gx_xn, &[2], true)?;
    let t = g.mul(&xn, &mean_gx)?;
    let c = g.sub(&gxn, &mean_g)?;
    let c = g.sub(&c, &t)?;
    let gx = g.mul(&c, &inv)?;
    Ok(vec![y, gx])
}

/// The plan for `[B, T, C]` with symbolic `B` and `T`.
fn planned(c: usize) -> Result<Plan<SDim>> {
    let mut g = Graph::<SDim>::new();
    let (b, t) = (SDim::param("B"), SDim::param("T"));
    let x = g.leaf(0, vec![b.clone(), t.clone(), SDim::lit(c)], DType::F32);
    let w = g.leaf(1, vec![SDim::lit(c)], DType::F32);
    let pos = g.leaf(2, vec![t.clone(), SDim::lit(c)], DType::F32);
    let gy = g.leaf(3, vec![b, t, SDim::lit(c)], DType::F32);
    let outputs = build(&mut g, [&x, &w, &pos, &gy])?;
    Ok(plan(&g, &[x, w, pos, gy], &outputs))
}

/// Values over a few binades, different for each input.
fn values(n: usize, k: f32) -> Vec<f32> {
    (0..n)
        .map(|i| ((i as f32 * k).sin() * 2.3) + 0.011 * (i % 97) as f32)
        .collect()
}

/// The values of a plan's outputs.
type Outputs = Vec<Vec<f32>>;

/// Runs `p` for `[b, t, c]`: fused, and op by op.
fn run(p: &Plan<SDim>, [b, t, c]: [usize; 3]) -> Result<(Outputs, Outputs)> {
    let xs = [
        RawTensor::<Cpu>::from_vec(values(b * t * c, 1.3), &[b, t, c], &CpuDevice)?,
        RawTensor::from_vec(values(c, 0.7), &[c], &CpuDevice)?,
        RawTensor::from_vec(values(t * c, 2.9), &[t, c], &CpuDevice)?,
        RawTensor::from_vec(values(b * t * c, 0.31), &[b, t, c], &CpuDevice)?,
    ];
    let refs: Vec<&RawTensor<Cpu>> = xs.iter().collect();
    let sizes = [("B", b), ("T", t)];
    let mut program = Program::<Cpu>::new(Plan::parse(&p.to_text())?, &[]);
    let fused = program
        .run(&mut RunContext::new(&CpuDevice).sizes(&sizes), &refs)?
        .expect("the plan describes these inputs")
        .map(|o| o.to_vec::<f32>())
        .collect::<Result<Vec<_>>>()?;
    let op_by_op = program
        .run_op_by_op(&mut RunContext::new(&CpuDevice).sizes(&sizes), &refs)?
        .iter()
        .map(|o| o.to_vec::<f32>())
        .collect::<Result<Vec<_>>>()?;
    Ok((fused, op_by_op))
}

/// `p` with no kernel marked as a row pass (its slots kept).
fn apart(p: &Plan<SDim>) -> Plan<SDim> {
    let mut p = p.clone();
    for k in &mut p.kernels {
        k.row_pass = None;
    }
    p
}

#[test]
fn a_layer_norm_and_its_gradient_are_row_passes() -> Result<()> {
    let p = planned(64)?;
    let passes: Vec<Vec<KernelKind>> = (0..)
        .map(|id| {
            (p.kernels.iter())
                .filter(|k| k.row_pass == Some(id) && k.kind != KernelKind::View)
                .map(|k| k.kind)
                .collect::<Vec<_>>()
        })
        .take_while(|kinds| !kinds.is_empty())
        .collect();
    // The statistics and the normalisation; the gradient's row sums and its result.
    assert!(passes.len() >= 2, "{}", p.report("layer norm"));
    for kinds in &passes {
        assert!(kinds.len() >= 2, "{}", p.report("layer norm"));
    }
    let reductions =
        |kinds: &[KernelKind]| kinds.iter().filter(|&&k| k == KernelKind::Reduce).count();
    let in_passes: usize = passes.iter().map(|k| reductions(k)).sum();
    let all = p
        .kernels
        .iter()
        .filter(|k| k.kind == KernelKind::Reduce)
        .count();
    assert_eq!(
        in_passes,
        all,
        "every row sum runs in a pass: {}",
        p.report("layer norm")
    );
    // The normalised rows are computed in the passes, not stored between them.
    let elementwise_apart = (p.kernels.iter())
        .filter(|k| k.row_pass.is_none() && k.kind == KernelKind::Elementwise)
        .count();
    assert_eq!(elementwise_apart, 0, "{}", p.report("layer norm"));
    Ok(())
}

#[test]
fn row_passes_give_the_bits_of_their_kernels_run_apart() -> Result<()> {
    // Rows that do not fill a block; many rows (parallel blocks); rows of one value.
    for dims in [
        [3, 37, 130],
        [2, 5, 64],
        [4, 100, 96],
        [8, 200, 128],
        [3, 4, 1],
    ] {
        let p = planned(dims[2])?;
        let (fused, op_by_op) = run(&p, dims)?;
        let (kernels_apart, _) = run(&apart(&p), dims)?;
        for (k, (got, want)) in fused.iter().zip(&kernels_apart).enumerate() {
            let same = got
                .iter()
                .zip(want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{dims:?}, output {k}: a pass changed the bits");
            for (i, (a, b)) in got.iter().zip(&op_by_op[k]).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                    "{dims:?}, output {k}[{i}]: {a} planned, {b} op by op"
                );
            }
        }
    }
    Ok(())
}

#[test]
fn a_plan_text_that_marks_other_kernels_as_a_pass_is_refused() -> Result<()> {
    // A layer norm (a pass), then a sum over the batch (no reduction of rows).
    let mut g = Graph::<SDim>::new();
    let x = g.leaf(
        0,
        vec![SDim::lit(3), SDim::lit(4), SDim::lit(8)],
        DType::F32,
    );
    let y = g.layer_norm(&x, 1, None, None, 1e-5)?;
    let s = g.sum(&y, &[0], true)?;
    let p = plan(&g, &[x], &[y, s]);
    let pass: Vec<usize> = (0..p.kernels.len())
        .filter(|&k| p.kernels[k].row_pass == Some(0))
        .collect();
    assert!(pass.len() >= 3, "{}", p.report("layer norm"));
    let after = (pass[pass.len() - 1] + 1..p.kernels.len())
        .find(|&k| p.kernels[k].kind == KernelKind::Reduce)
        .expect("the sum over the batch is a kernel");
    let normalise = pass[pass.len() - 1];
    let mut with_column_sum = p.clone();
    for k in &mut with_column_sum.kernels[normalise..=after] {
        k.row_pass = Some(0);
    }
    let mut without_reduction = p.clone();
    without_reduction.kernels[normalise].row_pass = Some(5);
    let x = RawTensor::<Cpu>::from_vec(values(96, 1.3), &[3, 4, 8], &CpuDevice)?;
    for (name, bad) in [
        ("a sum over the batch in a pass", with_column_sum),
        ("a pass of one elementwise kernel", without_reduction),
    ] {
        let mut program = Program::<Cpu>::new(Plan::parse(&bad.to_text())?, &[]);
        let refused = match program.run(&mut RunContext::new(&CpuDevice), &[&x]) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("{name}: the plan ran"),
        };
        assert!(refused.contains("row pass"), "{name}: {refused}");
    }
    // The plan as planned runs, and agrees with op by op.
    let mut program = Program::<Cpu>::new(Plan::parse(&p.to_text())?, &[]);
    let fused: Vec<RawTensor<Cpu>> = program
        .run(&mut RunContext::new(&CpuDevice), &[&x])?
        .expect("the plan describes this input")
        .collect();
    let op_by_op = program.run_op_by_op(&mut RunContext::new(&CpuDevice), &[&x])?;
    for (a, b) in fused.iter().zip(&op_by_op) {
        assert_eq!(a.to_vec::<f32>()?, b.to_vec::<f32>()?);
    }
    Ok(())
}
