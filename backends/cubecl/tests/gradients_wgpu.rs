//! Gradients on wgpu through the runtime tape, held equal to the CPU backend's.
//! `kiln_autodiff::gradcheck` needs f64, which wgpu lacks; the CPU backend's own
//! gradients are checked against finite differences in f64 by kiln-autodiff, so
//! agreeing with them in f32 checks the GPU kernels under every VJP rule used here.

#![cfg(feature = "wgpu")]

use kiln_autodiff::Tape;
use kiln_cpu::{Cpu, CpuDevice};
use kiln_cubecl::{Wgpu, WgpuDevice};
use kiln_tensor::{Backend, BuilderExt, Conv2dOptions, RandDist, RawTensor, Result};

fn device() -> WgpuDevice {
    WgpuDevice::first().unwrap_or_else(|e| panic!("no wgpu device for the gradient tests: {e}"))
}

/// A model-shaped loss over random inputs: the gradients of every leaf, on backend `B`.
type Loss<B> = fn(&mut Tape<B>, &[kiln_autodiff::Var<B>]) -> Result<kiln_autodiff::Var<B>>;

fn grads<B: Backend>(
    dev: &B::Device,
    shapes: &[&[usize]],
    labels: Option<(&[usize], Vec<i32>)>,
    loss: Loss<B>,
) -> Result<Vec<Vec<f32>>> {
    let mut tape = Tape::<B>::new(dev.clone());
    let mut leaves = Vec::new();
    for (i, s) in shapes.iter().enumerate() {
        let t = RawTensor::<B>::rand(
            s,
            RandDist::Normal {
                mean: 0.0,
                std: 0.5,
            },
            100 + i as u64,
            kiln_tensor::DType::F32,
            dev,
        )?;
        leaves.push(tape.leaf(t));
    }
    if let Some((dims, y)) = labels {
        let y = RawTensor::<B>::from_vec(y, dims, dev)?;
        leaves.push(tape.constant(y));
    }
    let l = loss(&mut tape, &leaves)?;
    let g = tape.gradients(&l)?;
    let mut out = vec![l.value().to_vec::<f32>()?];
    for v in &leaves[..shapes.len()] {
        out.push(g.get_or_zeros(v)?.to_vec::<f32>()?);
    }
    Ok(out)
}

fn assert_close(name: &str, gpu: &[Vec<f32>], cpu: &[Vec<f32>]) {
    assert_eq!(gpu.len(), cpu.len());
    for (k, (g, c)) in gpu.iter().zip(cpu).enumerate() {
        let scale = c.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-3);
        for (i, (a, b)) in g.iter().zip(c).enumerate() {
            assert!(
                (a - b).abs() <= 1e-4 * scale + 1e-6,
                "{name}: output {k} element {i}: wgpu {a} vs cpu {b} (scale {scale})"
            );
        }
    }
}

fn check(
    name: &str,
    shapes: &[&[usize]],
    labels: Option<(&[usize], Vec<i32>)>,
    gpu: Loss<Wgpu>,
    cpu: Loss<Cpu>,
) {
    let g = grads::<Wgpu>(&device(), shapes, labels.clone(), gpu).expect("wgpu gradients");
    let c = grads::<Cpu>(&CpuDevice, shapes, labels, cpu).expect("cpu gradients");
    assert_close(name, &g, &c);
}

macro_rules! both {
    ($f:expr) => {
        ($f as Loss<Wgpu>, $f as Loss<Cpu>)
    };
}

#[test]
fn mlp_cross_entropy() {
    fn f<B: Backend>(
        t: &mut Tape<B>,
        v: &[kiln_autodiff::Var<B>],
    ) -> Result<kiln_autodiff::Var<B>> {
        let h = t.linear(&v[0], &v[1], Some(&v[2]))?;
        let h = t.relu(&h)?;
        let o = t.linear(&h, &v[3], Some(&v[4]))?;
        t.cross_entropy(&o, &v[5], 0.1)
    }
    let (g, c) = both!(f);
    let y = vec![0, 3, 1, 4, 4, 2, 0, 1];
    check(
        "mlp",
        &[&[8, 12], &[16, 12], &[16], &[5, 16], &[5]],
        Some((&[8], y)),
        g,
        c,
    );
}

#[test]
fn conv_pool_layer_norm() {
    fn f<B: Backend>(
        t: &mut Tape<B>,
        v: &[kiln_autodiff::Var<B>],
    ) -> Result<kiln_autodiff::Var<B>> {
        let opts = Conv2dOptions {
            padding: [1, 1],
            ..Conv2dOptions::default()
        };
        let h = t.conv2d(&v[0], &v[1], Some(&v[2]), opts)?;
        let h = t.max_pool2d(&h, [2, 2], [2, 2], [0, 0])?;
        let h = t.gelu_erf(&h)?;
        let h = t.layer_norm(&h, 2, None, None, 1e-5)?;
        let s = t.softmax(&h, 3)?;
        let s = t.mul(&s, &h)?;
        t.mean_all(&s)
    }
    let (g, c) = both!(f);
    check("conv", &[&[2, 3, 6, 6], &[4, 3, 3, 3], &[4]], None, g, c);
}
