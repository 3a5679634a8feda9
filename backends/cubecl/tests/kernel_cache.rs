//! Fused kernels are compiled per expression shape, not per constant value: an
//! optimizer whose learning rate follows a schedule runs one kernel for every value
//! (and uses each value), also when thousands of launches with distinct values are
//! queued before one read (wgpu reuses bind groups and metadata buffers by what they
//! hold). Its own test binary, so that no other test compiles kernels on the device
//! meanwhile.

#![cfg(any(feature = "wgpu", feature = "cuda"))]

use kiln_tensor::fused::{ExprStep, FusedExpr};
use kiln_tensor::{Backend, BinaryOp, DType, Dims, RawTensor, Result};

#[cfg(feature = "wgpu")]
fn wgpu() -> kiln_cubecl::WgpuDevice {
    kiln_cubecl::WgpuDevice::first()
        .unwrap_or_else(|e| panic!("no wgpu device for the kernel-cache test: {e}"))
}

#[cfg(feature = "cuda")]
fn cuda() -> kiln_cubecl::CudaDevice {
    kiln_cubecl::CudaDevice::first()
        .unwrap_or_else(|e| panic!("no CUDA device for the kernel-cache test: {e}"))
}

#[cfg(feature = "wgpu")]
#[test]
fn wgpu_new_constants_reuse_the_compiled_kernel() -> Result<()> {
    new_constants_reuse_the_compiled_kernel(&wgpu())
}

#[cfg(feature = "cuda")]
#[test]
fn cuda_new_constants_reuse_the_compiled_kernel() -> Result<()> {
    new_constants_reuse_the_compiled_kernel(&cuda())
}

#[cfg(feature = "wgpu")]
#[test]
fn wgpu_queued_launches_keep_their_constants() -> Result<()> {
    queued_launches_keep_their_constants(&wgpu())
}

#[cfg(feature = "cuda")]
#[test]
fn cuda_queued_launches_keep_their_constants() -> Result<()> {
    queued_launches_keep_their_constants(&cuda())
}

/// `x * c - 0.5`, an expression shape no other test uses.
fn scaled_less_half(c: f32) -> FusedExpr {
    FusedExpr {
        inputs: 1,
        steps: vec![
            ExprStep::Input(0),
            ExprStep::Const(c),
            ExprStep::Binary(BinaryOp::Mul, 0, 1),
            ExprStep::Const(0.5),
            ExprStep::Binary(BinaryOp::Sub, 2, 3),
        ],
        results: vec![4],
    }
}

/// `x * c - 0.5` for 5,000 constants queued before any read (more distinct kernel
/// metadata than wgpu's stream caches), into buffers of their own, then again into the
/// same buffers in reverse order with other constants: every result is its own
/// launch's.
fn queued_launches_keep_their_constants<R: kiln_cubecl::KilnRuntime>(
    dev: &kiln_cubecl::CubeDevice<R>,
) -> Result<()> {
    type G<R> = kiln_cubecl::CubeBackend<R>;
    let x = RawTensor::<G<R>>::from_vec(vec![1f32, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], &[8], dev)?;
    let dims = Dims::new(&[8])?;
    let expr = scaled_less_half;
    let n = 5000;
    let constant = |round: usize, i: usize| (i + round * n) as f32 * 0.25;
    let mut outs = (0..n)
        .map(|_| G::<R>::alloc(dev, DType::F32, 8))
        .collect::<Result<Vec<_>>>()?;
    for round in 0..2 {
        let order: Vec<usize> = match round {
            0 => (0..n).collect(),
            _ => (0..n).rev().collect(),
        };
        for i in order {
            let c = constant(round, i);
            G::<R>::fused_elementwise(
                dev,
                &expr(c),
                None,
                &[x.view()],
                &dims,
                &mut [&mut outs[i]],
            )?;
        }
    }
    for (i, out) in outs.iter().enumerate() {
        let got = G::<R>::download(out, &kiln_tensor::Layout::contiguous(dims))?;
        let kiln_tensor::HostData::F32(got) = got else {
            panic!("an f32 buffer read as another dtype")
        };
        assert_eq!(
            got[7],
            8.0 * constant(1, i) - 0.5,
            "launch {i} of the second round"
        );
    }
    Ok(())
}

/// An optimizer's learning rate changes every step of a schedule: each value must run
/// the kernel compiled for the first (constants are run-time values), and be used.
fn new_constants_reuse_the_compiled_kernel<R: kiln_cubecl::KilnRuntime>(
    dev: &kiln_cubecl::CubeDevice<R>,
) -> Result<()> {
    type G<R> = kiln_cubecl::CubeBackend<R>;
    let x = RawTensor::<G<R>>::from_vec(vec![1f32, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], &[8], dev)?;
    let mut out = G::<R>::alloc(dev, DType::F32, 8)?;
    let dims = Dims::new(&[8])?;
    let expr = scaled_less_half;
    G::<R>::fused_elementwise(dev, &expr(1.0), None, &[x.view()], &dims, &mut [&mut out])?;
    let compiled = dev.fused_kernels();
    for step in 0..40 {
        let c = 0.1 * step as f32;
        G::<R>::fused_elementwise(dev, &expr(c), None, &[x.view()], &dims, &mut [&mut out])?;
        let got = RawTensor::<G<R>>::from_storage(
            G::<R>::contiguous(
                dev,
                kiln_tensor::View {
                    storage: &out,
                    layout: kiln_tensor::Layout::contiguous(dims),
                },
            )?,
            dims,
            dev.clone(),
        )?
        .to_vec::<f32>()?;
        assert_eq!(got[7], 8.0 * c - 0.5, "constant {c} not used");
    }
    assert_eq!(
        dev.fused_kernels(),
        compiled,
        "a new constant compiled a new kernel"
    );
    Ok(())
}
