//! Row passes against their kernels run apart, on the CPU: a layer norm's forward
//! pass and its input gradient (the small GPT's and W3's shapes), planned once with
//! row passes and once with none, timed in alternation. One parseable line per shape:
//! `rows B=32 T=128 C=128 passes_ms=0.61 apart_ms=0.95 speedup=1.56`.
//!
//! Usage: bench_row_passes [--reps N] (the best of N runs of each, alternating).

use kiln_cpu::{Cpu, CpuDevice};
use kiln_fusion::{plan, Plan, Program, RunContext, SDim};
use kiln_tensor::ir::{Graph, NodeId};
use kiln_tensor::op::UnaryOp;
use kiln_tensor::{BuilderExt, DType, RawTensor, Result, SymDim};
use std::time::Instant;

/// A layer norm of `x` with weight `w` and bias `b` (as `layer_norm` builds it), and
/// its input's gradient for `gy`, as a backward pass computes it.
fn build(g: &mut Graph<SDim>, c: usize) -> Result<(Vec<NodeId>, Vec<NodeId>)> {
    let (bt, t) = (SDim::param("B"), SDim::param("T"));
    let x = g.leaf(0, vec![bt.clone(), t.clone(), SDim::lit(c)], DType::F32);
    let w = g.leaf(1, vec![SDim::lit(c)], DType::F32);
    let b = g.leaf(2, vec![SDim::lit(c)], DType::F32);
    let gy = g.leaf(3, vec![bt, t, SDim::lit(c)], DType::F32);
    let y = g.layer_norm(&x, 1, Some(&w), Some(&b), 1e-5)?;
    let m = g.mean(&x, &[2], true)?;
    let d = g.sub(&x, &m)?;
    let d2 = g.square(&d)?;
    let v = g.mean(&d2, &[2], true)?;
    let ve = g.add_scalar(&v, 1e-5)?;
    let inv = g.unary(UnaryOp::Rsqrt, &ve)?;
    let xn = g.mul(&d, &inv)?;
    let gxn = g.mul(&gy, &w)?;
    let mean_g = g.mean(&gxn, &[2], true)?;
    let gx_xn = g.mul(&gxn, &xn)?;
    let mean_gx = g.mean(&gx_xn, &[2], true)?;
    let t = g.mul(&xn, &mean_gx)?;
    let c = g.sub(&gxn, &mean_g)?;
    let c = g.sub(&c, &t)?;
    let gx = g.mul(&c, &inv)?;
    Ok((vec![x, w, b, gy], vec![y, gx]))
}

fn time(
    program: &mut Program<Cpu>,
    sizes: &[(&str, usize)],
    xs: &[&RawTensor<Cpu>],
) -> Result<f64> {
    let start = Instant::now();
    let outputs = program
        .run(&mut RunContext::new(&CpuDevice).sizes(sizes), xs)?
        .expect("the plan describes these inputs");
    drop(outputs);
    Ok(start.elapsed().as_secs_f64() * 1e3)
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let reps = match args.iter().position(|a| a == "--reps") {
        Some(i) => args
            .get(i + 1)
            .and_then(|r| r.parse().ok())
            .ok_or_else(|| kiln_tensor::Error::invalid("bench", "--reps takes a count"))?,
        None => 50,
    };
    for [b, t, c] in [[32, 128, 128], [16, 256, 512], [8, 1024, 768]] {
        let mut g = Graph::<SDim>::new();
        let (inputs, outputs) = build(&mut g, c)?;
        let with_passes = plan(&g, &inputs, &outputs);
        let mut apart: Plan<SDim> = with_passes.clone();
        apart.kernels.iter_mut().for_each(|k| k.row_pass = None);
        let values = |dims: &[usize], k: f32| {
            let n = dims.iter().product::<usize>();
            let v = (0..n).map(|i| (i as f32 * k).sin()).collect();
            RawTensor::<Cpu>::from_vec(v, dims, &CpuDevice)
        };
        let xs = [
            values(&[b, t, c], 1.3)?,
            values(&[c], 0.7)?,
            values(&[c], 2.1)?,
            values(&[b, t, c], 0.3)?,
        ];
        let refs: Vec<&RawTensor<Cpu>> = xs.iter().collect();
        let sizes = [("B", b), ("T", t)];
        let mut programs = [
            Program::<Cpu>::new(with_passes, &[]),
            Program::<Cpu>::new(apart, &[]),
        ];
        let mut best = [f64::INFINITY; 2];
        for _ in 0..reps {
            for (p, best) in programs.iter_mut().zip(&mut best) {
                *best = best.min(time(p, &sizes, &refs)?);
            }
        }
        println!(
            "rows B={b} T={t} C={c} passes_ms={:.3} apart_ms={:.3} speedup={:.2}",
            best[0],
            best[1],
            best[1] / best[0]
        );
    }
    Ok(())
}
