//! Fused kernels are compiled per expression shape, not per constant value: an
//! optimizer whose learning rate follows a schedule runs one kernel for every value
//! (and uses each value). Its own test binary, so that no other test compiles kernels
//! on the device meanwhile.

#![cfg(any(feature = "wgpu", feature = "cuda"))]

use kiln_tensor::fused::{ExprStep, FusedExpr};
use kiln_tensor::{Backend, BinaryOp, DType, Dims, RawTensor, Result};

#[cfg(feature = "wgpu")]
#[test]
fn wgpu_new_constants_reuse_the_compiled_kernel() -> Result<()> {
    let dev = kiln_cubecl::WgpuDevice::first()
        .unwrap_or_else(|e| panic!("no wgpu device for the kernel-cache test: {e}"));
    new_constants_reuse_the_compiled_kernel(&dev)
}

#[cfg(feature = "cuda")]
#[test]
fn cuda_new_constants_reuse_the_compiled_kernel() -> Result<()> {
    let dev = kiln_cubecl::CudaDevice::first()
        .unwrap_or_else(|e| panic!("no CUDA device for the kernel-cache test: {e}"));
    new_constants_reuse_the_compiled_kernel(&dev)
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
    // A shape of expression no other test uses: x * c - 0.5.
    let expr = |c: f32| FusedExpr {
        inputs: 1,
        steps: vec![
            ExprStep::Input(0),
            ExprStep::Const(c),
            ExprStep::Binary(BinaryOp::Mul, 0, 1),
            ExprStep::Const(0.5),
            ExprStep::Binary(BinaryOp::Sub, 2, 3),
        ],
        results: vec![4],
    };
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
