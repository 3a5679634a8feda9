//! An int8 product takes its elementwise epilogue as a float product does, and a
//! device that computes a bias row and an activation inside the product (the CPU) gives
//! the op-by-op path's values bit for bit: NaN rows, a ReLU that keeps NaN, an
//! activation alone, and epilogues it cannot fuse (a bias that is not one row, other
//! arithmetic), which run as the product then the fused kernel.

use kiln_cpu::{Cpu, CpuDevice};
use kiln_fusion::{plan, KernelKind, Plan, Program, RunContext, SDim};
use kiln_tensor::ir::{Graph, NodeId};
use kiln_tensor::{BuilderExt, DType, HostData, RawTensor, Result, SymDim, UnaryOp};

const K: usize = 70;
const N: usize = 9;

/// Leaves `x [B, K]`, `w [N, K]` (i8), four `scale [N]`, `bias [N]`, `full [B, N]`;
/// outputs `[relu(p0 + bias), tanh(p1), p2 + full, p3 · 2 + bias]`, `pi` the product
/// by scale `i` (four products, as the graph keeps one node for equal ones).
fn graph() -> Result<(Graph<SDim>, Vec<NodeId>, Vec<NodeId>)> {
    let mut g = Graph::<SDim>::new();
    let b = SDim::param("B");
    let x = g.leaf(0, vec![b.clone(), SDim::lit(K)], DType::F32);
    let w = g.leaf(1, vec![SDim::lit(N), SDim::lit(K)], DType::I8);
    let scales: Vec<NodeId> = (2..6)
        .map(|i| g.leaf(i, vec![SDim::lit(N)], DType::F32))
        .collect();
    let bias = g.leaf(6, vec![SDim::lit(N)], DType::F32);
    let full = g.leaf(7, vec![b, SDim::lit(N)], DType::F32);
    let p: Vec<NodeId> = (scales.iter())
        .map(|s| g.matmul_int8(&x, &w, s))
        .collect::<Result<_>>()?;
    let linear = g.add(&p[0], &bias)?;
    let linear = g.relu(&linear)?;
    let alone = g.unary(UnaryOp::Tanh, &p[1])?;
    let plus_full = g.add(&p[2], &full)?;
    let scaled = g.mul_scalar(&p[3], 2.0)?;
    let other = g.add(&scaled, &bias)?;
    let mut inputs = vec![x, w];
    inputs.extend(scales);
    inputs.extend([bias, full]);
    Ok((g, inputs, vec![linear, alone, plus_full, other]))
}

/// Deterministic values in about ±`amp`.
fn values(n: usize, seed: usize, amp: f32) -> Vec<f32> {
    (0..n)
        .map(|i| amp * (((i * 7919 + seed * 104_729) % 1000) as f32 / 500.0 - 1.0))
        .collect()
}

#[test]
fn int8_products_fuse_their_epilogues_and_match_op_by_op() -> Result<()> {
    let (g, inputs, outputs) = graph()?;
    let p = plan(&g, &inputs, &outputs);
    let products: Vec<_> = p
        .kernels
        .iter()
        .filter(|k| k.kind == KernelKind::MatMul)
        .collect();
    assert_eq!(products.len(), 4, "{:?}", p.kernels);
    for k in &products {
        assert!(k.nodes.len() > 1, "a product without its epilogue: {k:?}");
    }

    let mut program = Program::<Cpu>::new(Plan::parse(&p.to_text())?, &[]);
    // Few rows (weights split between threads) and many (rows split between them).
    for rows in [5, 21] {
        let mut xs = values(rows * K, 1, 3.0);
        xs[2 * K + 4] = f32::NAN; // a row computed in f32, whose NaN every epilogue keeps
        xs[3 * K..4 * K].fill(0.0); // a row of zeros: scale 0
        let ws: Vec<i8> = (0..N * K)
            .map(|i| ((i * 37 % 255) as i32 - 127) as i8)
            .collect();
        let tensor = |v: Vec<f32>, dims: &[usize]| RawTensor::<Cpu>::from_vec(v, dims, &CpuDevice);
        let x = tensor(xs, &[rows, K])?;
        let w = RawTensor::<Cpu>::from_host(HostData::I8(ws), &[N, K], &CpuDevice)?;
        let scales: Vec<RawTensor<Cpu>> = (0..4)
            .map(|i| {
                tensor(
                    values(N, 2 + i, 0.01).iter().map(|s| s.abs()).collect(),
                    &[N],
                )
            })
            .collect::<Result<_>>()?;
        let bias = tensor(values(N, 8, 0.5), &[N])?;
        let full = tensor(values(rows * N, 9, 0.5), &[rows, N])?;
        let mut args = vec![&x, &w];
        args.extend(&scales);
        args.extend([&bias, &full]);
        let params = [("B", rows)];
        let fused: Vec<RawTensor<Cpu>> = program
            .run(&mut RunContext::new(&CpuDevice).sizes(&params), &args)?
            .expect("the plan describes these inputs")
            .collect();
        let eager = program.run_op_by_op(&mut RunContext::new(&CpuDevice).sizes(&params), &args)?;
        assert_eq!(fused.len(), 4);
        for (i, (f, e)) in fused.iter().zip(&eager).enumerate() {
            let (f, e): (Vec<f32>, Vec<f32>) = (f.to_vec()?, e.to_vec()?);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&f),
                bits(&e),
                "output {i}: fused {f:?}, op by op {e:?}"
            );
            // The NaN row stays NaN through the ReLU; other rows are not all NaN.
            assert!(
                f[2 * N..3 * N].iter().all(|v| v.is_nan()),
                "output {i}: {f:?}"
            );
            assert!(f[..N].iter().all(|v| !v.is_nan()), "output {i}: {f:?}");
        }
    }
    Ok(())
}
