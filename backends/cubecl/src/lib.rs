//! # kiln-cubecl
//!
//! Kiln's GPU backend: one `Backend` implementation, `CubeBackend<R>`, generic over
//! CubeCL runtimes, with `Wgpu` (feature `wgpu`: Vulkan, Metal, DX12 through CubeCL's
//! WGSL compiler) and `Cuda` (feature `cuda`: CUDA C++ through NVRTC, matrix
//! products through cuBLASLt).
//!
//! It owns the device (adapter or GPU selection, limits, the error flags: `device`),
//! device buffers (`storage`), the `#[cube]` kernels (`kernels`) and their
//! launches (`ops`). Every primitive of the op table runs as a kernel whose inputs are
//! strided views (views never reach a backend, so a transposed or broadcast input is
//! read in place) and whose op is comptime data, so CubeCL compiles one specialised
//! kernel per op, dtype and rank and caches it.
//!
//! ## The CubeCL version: 0.10.0, for both runtimes
//!
//! cubecl-cuda 0.11 depends on cubecl-llvm, whose build script downloads a prebuilt
//! LLVM: that fails on machines that reach only the package registries (CI, Kiln's
//! developers). cubecl-cuda 0.10.0 has no such dependency, and cubecl 0.10.0's wgpu
//! runtime runs on Mesa's lavapipe, so one version serves both and a fresh machine
//! builds it from crates.io alone, with no build script that downloads anything.
//!
//! ## Dtypes
//!
//! | runtime | dtypes |
//! | --- | --- |
//! | wgpu | f32, i32, u32, bool; f16 where the adapter has `SHADER_F16` (WGSL has no f64 or bf16) |
//! | cuda | every dtype: f32, f64, f16, bf16, i32, u32, bool |
//!
//! Half floats compute in f32 and round once, as on the CPU; bools are stored as u32.
//! An op on a dtype a device lacks is an `Error::Unsupported`.
//!
//! ## Errors
//!
//! Opening a device without a driver or adapter is an `Error::Device` that says
//! what to install. A buffer larger than the device binds (lavapipe caps a storage
//! buffer at 128 MiB, and over that launches were silently skipped) is refused before
//! anything is queued. Out-of-range gather/scatter indices and integer division by
//! zero are detected by the kernels, each launch writing its own flag. Kernels run
//! asynchronously, so the flags are read at the launching thread's next download or
//! `synchronize` (or after 64 unread ones), which returns the first error, naming the op
//! and the bad index, as CUDA and PyTorch report device-side errors: reading each flag
//! in its op would stall the host once per gather in every training step.
//!
//! ## Random numbers
//!
//! `rand` runs on the device (`kernels::random`): `kiln_tensor::rng`'s counter-based
//! bits exactly, mapped to values in the compute type (f32 for f32 and the half floats,
//! f64 for f64) with the device's `ln`, `sqrt` and `cos`, so values agree with the
//! CPU's f64 mapping to a few ulps, not bit for bit. A draw cannot be captured into a
//! CUDA graph (its seed is a launch argument, so each replay would repeat it).
//!
//! ## Fused plans
//!
//! `Backend::fused_elementwise` runs a fused expression of a build-time plan (an
//! elementwise group, a reduction's prologue or epilogue, a product's epilogue, an
//! optimizer update) as one generic `#[cube]` kernel (`kernels::fused`) whose
//! comptime data is the expression's structure; CubeCL compiles it once per device and
//! caches it, and constants are run-time scalars. Contiguous launches move 16-byte
//! vectors (several per unit on large tensors); broadcasts and views take a strided
//! variant. cuBLASLt products queue on CubeCL's own CUDA stream (through a patched
//! cubecl-cuda, `vendor/README.md`), so a step never waits on the host.
//!
//! ## CUDA graphs
//!
//! `CudaDevice::capture` records the device work of a step (a static training step:
//! forward, backward and the optimizer's in-place update) into a CUDA graph, and
//! `CudaGraph::replay` runs it with one driver call, so a step no longer pays the
//! host's work per kernel. New inputs are written into the captured input tensors
//! between replays (`write_into`). A capture refuses what a replay could not repeat
//! (a copy from the host, a read, state replaced instead of updated in place) with an
//! error naming it; kernel metadata comes from a per-device cache of read-only buffers,
//! so steady-state steps upload nothing (module `graph`).
//!
//! ## Not yet here
//!
//! cuBLASLt's ReLU and GELU epilogues (they turn NaN into 0, where Kiln's activations
//! keep it; a product's bias is added by cuBLASLt, activations run as one fused kernel
//! after it), and random draws inside a captured graph (a step with dropout cannot be
//! captured: it needs a seed read from device memory and advanced by each replay).
//!
//! ## Features
//!
//! Without `wgpu` or `cuda` the crate is empty (so the rest of the workspace builds
//! without compiling CubeCL).

#![cfg(any(feature = "wgpu", feature = "cuda"))]
#![warn(missing_docs)]

pub mod device;
// `#[cube]` generates undocumented launch items (a struct and functions per kernel);
// every kernel itself is documented.
#[allow(missing_docs)]
pub mod kernels;
pub mod ops;
pub mod recording;
pub mod storage;
pub mod strided;
pub mod watchdog;

#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "cuda")]
mod driver;
#[cfg(feature = "cuda")]
pub mod graph;
#[cfg(feature = "cuda")]
pub mod nccl;
#[cfg(feature = "wgpu")]
pub mod wgpu;

pub use device::{CubeDevice, DeviceState, KilnRuntime};
#[cfg(feature = "cuda")]
pub use graph::{write_into, CudaGraph};
pub use ops::matmul::{product_kernel, set_product_kernel, ProductKernel};
pub use storage::CubeStorage;

use crate::strided::Operand;
use kiln_tensor::fused::{FusedExpr, NativeFn, ProductEpilogue};
use kiln_tensor::{
    AttentionInput, Backend, DType, Dims, Error, HostData, Layout, Op, Result, TensorMeta, View,
};
use std::fmt;
use std::marker::PhantomData;

/// Kiln's backend over the CubeCL runtime `R`.
pub struct CubeBackend<R: KilnRuntime>(PhantomData<R>);

/// The wgpu backend (Vulkan, Metal, DX12; lavapipe on machines without a GPU).
#[cfg(feature = "wgpu")]
pub type Wgpu = CubeBackend<cubecl::wgpu::WgpuRuntime>;
/// A wgpu device.
#[cfg(feature = "wgpu")]
pub type WgpuDevice = CubeDevice<cubecl::wgpu::WgpuRuntime>;
/// CubeCL's wgpu runtime, for code generic over the runtime (`CubeBackend<R>`).
#[cfg(feature = "wgpu")]
pub use cubecl::wgpu::WgpuRuntime;

/// The CUDA backend.
#[cfg(feature = "cuda")]
pub type Cuda = CubeBackend<cubecl::cuda::CudaRuntime>;
/// A CUDA device.
#[cfg(feature = "cuda")]
pub type CudaDevice = CubeDevice<cubecl::cuda::CudaRuntime>;
/// CubeCL's CUDA runtime, for code generic over the runtime (`CubeBackend<R>`).
#[cfg(feature = "cuda")]
pub use cubecl::cuda::CudaRuntime;

impl<R: KilnRuntime> Clone for CubeBackend<R> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<R: KilnRuntime> Copy for CubeBackend<R> {}
impl<R: KilnRuntime> Default for CubeBackend<R> {
    fn default() -> Self {
        CubeBackend(PhantomData)
    }
}
impl<R: KilnRuntime> fmt::Debug for CubeBackend<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CubeBackend<{}>", R::NAME)
    }
}

/// Each input's extent fits its buffer and the buffer lives on `device`.
fn check_inputs<R: KilnRuntime>(
    device: &CubeDevice<R>,
    op: &Op,
    inputs: &[View<'_, CubeBackend<R>>],
) -> Result<()> {
    for v in inputs {
        check_extent(v.storage, &v.layout)?;
        if v.storage.device.ordinal != device.state.ordinal
            || !std::sync::Arc::ptr_eq(&v.storage.device, &device.state)
        {
            return Err(Error::DeviceMismatch {
                op: op.name(),
                lhs: <CubeBackend<R> as Backend>::device_name(device),
                rhs: format!("{}:{}", R::NAME, v.storage.device.ordinal),
            });
        }
    }
    Ok(())
}

/// A layout must stay inside its buffer: a broken view is reported, never read.
pub(crate) fn check_extent<R: KilnRuntime>(s: &CubeStorage<R>, l: &Layout) -> Result<()> {
    if l.storage_extent() > s.len {
        return Err(Error::invalid(
            "view",
            format!("layout {l:?} reaches past a buffer of {} elements", s.len),
        ));
    }
    Ok(())
}

impl<R: KilnRuntime> Backend for CubeBackend<R> {
    type Device = CubeDevice<R>;
    type Storage = CubeStorage<R>;

    const NAME: &'static str = R::NAME;

    fn refuse_in_capture(device: &CubeDevice<R>, what: &dyn Fn() -> String) -> Result<()> {
        device.state.refuse_in_capture_with(what)
    }

    fn draw_with_device_seed(
        device: &CubeDevice<R>,
        op: &Op,
        inputs: &[View<'_, Self>],
        seed: View<'_, Self>,
        out: &TensorMeta,
    ) -> Result<CubeStorage<R>> {
        kiln_tensor::backend::check_device_seed(seed)?;
        check_extent(seed.storage, &seed.layout)?;
        match op {
            Op::Rand {
                dist,
                seed: own,
                dtype,
                ..
            } => {
                let n = out.dims.iter().product();
                let seed = ops::DrawSeed::Device {
                    own: *own,
                    seed: seed.storage,
                };
                ops::rand(&device.state, n, *dist, seed, *dtype)
            }
            Op::Attention(_) | Op::AttentionLse(_) | Op::AttentionGrad { .. } => {
                check_inputs(device, op, inputs)?;
                ops::attention::attention_drawing(device, op, inputs, out, Some(seed.storage))
            }
            other => Err(Error::invalid(
                other.name(),
                "draws no random numbers, so it takes no seed from device memory",
            )),
        }
    }

    fn assign(
        dst: &kiln_tensor::RawTensor<Self>,
        src: &kiln_tensor::RawTensor<Self>,
    ) -> Result<bool> {
        if dst.dims() != src.dims() || dst.dtype() != src.dtype() {
            return Err(Error::shape(
                "assign",
                format!(
                    "{} {} cannot be written into {} {}",
                    src.dtype(),
                    src.dims(),
                    dst.dtype(),
                    dst.dims()
                ),
            ));
        }
        let (d, s) = (&**dst.storage(), &**src.storage());
        check_extent(d, dst.layout())?;
        check_extent(s, src.layout())?;
        ops::elementwise::copy_strided(
            &d.device,
            s,
            &Operand::of(src.layout()),
            d,
            &Operand::of(dst.layout()),
            dst.dims(),
        )?;
        Ok(true)
    }

    fn buffer_id(storage: &CubeStorage<R>) -> Option<u64> {
        Some(storage.id)
    }

    fn capturing(device: &CubeDevice<R>) -> bool {
        device.state.recorder.recording_here()
    }

    fn captures(device: &CubeDevice<R>) -> bool {
        let _ = device;
        R::CAPTURES
    }

    fn capture(
        device: &CubeDevice<R>,
        step: &mut dyn FnMut() -> Result<()>,
    ) -> Result<Box<dyn kiln_tensor::Replay>> {
        R::capture_step(device, step).unwrap_or_else(|| {
            Err(Error::invalid(
                "capture",
                format!("the {} backend does not capture steps", R::NAME),
            ))
        })
    }

    fn write_host(
        tensor: &kiln_tensor::RawTensor<Self>,
        values: &kiln_tensor::HostData,
    ) -> Result<()> {
        R::write_host(tensor, values).unwrap_or_else(|| {
            Err(Error::invalid(
                "write_host",
                format!(
                    "the {} backend does not write into buffers in place",
                    R::NAME
                ),
            ))
        })
    }

    fn device_name(device: &CubeDevice<R>) -> String {
        format!("{device:?}")
    }

    fn storage_dtype(s: &CubeStorage<R>) -> DType {
        s.dtype
    }

    fn storage_len(s: &CubeStorage<R>) -> usize {
        s.len
    }

    fn upload(device: &CubeDevice<R>, data: HostData) -> Result<CubeStorage<R>> {
        device.state.upload(&data)
    }

    fn download(s: &CubeStorage<R>, layout: &Layout) -> Result<HostData> {
        check_extent(s, layout)?;
        let dev = &s.device;
        if layout.is_contiguous() && layout.offset() == 0 && layout.numel() == s.len {
            return dev.read(s);
        }
        let c = ops::contiguous(
            dev,
            View {
                storage: s,
                layout: *layout,
            },
        )?;
        dev.read(&c)
    }

    fn contiguous(device: &CubeDevice<R>, x: View<'_, Self>) -> Result<CubeStorage<R>> {
        check_extent(x.storage, &x.layout)?;
        ops::contiguous(&device.state, x)
    }

    fn synchronize(device: &CubeDevice<R>) -> Result<()> {
        let dev = &device.state;
        dev.refuse_in_capture("synchronising the device")?;
        cubecl::future::block_on(dev.client.sync())
            .map_err(|e| device::server_error(&dev.name, e))?;
        dev.check_pending()
    }

    fn execute(
        device: &CubeDevice<R>,
        op: &Op,
        inputs: &[View<'_, Self>],
        out: &TensorMeta,
    ) -> Result<CubeStorage<R>> {
        check_inputs(device, op, inputs)?;
        ops::execute(device, op, inputs, out)
    }

    fn reduce_with_prologue(
        device: &CubeDevice<R>,
        op: &Op,
        prologue: &FusedExpr,
        inputs: &[View<'_, Self>],
        dims: &Dims,
        out: &TensorMeta,
    ) -> Result<Option<CubeStorage<R>>> {
        let Op::Reduce { op: r, axes } = op else {
            return Ok(None);
        };
        check_inputs(device, op, inputs)?;
        ops::reduce::reduce_with_prologue(&device.state, *r, prologue, inputs, dims, axes, out)
    }

    fn execute_one_pass_into(
        device: &CubeDevice<R>,
        ops: &[&Op],
        inputs: &[View<'_, Self>],
        metas: &[&TensorMeta],
        outs: &mut [&mut CubeStorage<R>],
    ) -> Result<()> {
        match (ops, metas, outs) {
            ([op @ Op::Attention(_), Op::AttentionLse(_)], [meta, _], [out, lse]) => {
                check_inputs(device, op, inputs)?;
                for v in inputs {
                    device.state.check_dtype(op.name(), v.storage.dtype)?;
                }
                let (o, l) = ops::attention::attention_with_lse(device, op, inputs, meta)?;
                **out = o;
                **lse = l;
                Ok(())
            }
            (ops, metas, outs) => {
                let wrt = |input| {
                    ops.iter()
                        .position(|op| matches!(op, Op::AttentionGrad { wrt, .. } if *wrt == input))
                };
                if let (Some(k), Some(v)) = (wrt(AttentionInput::Key), wrt(AttentionInput::Value)) {
                    check_inputs(device, ops[k], inputs)?;
                    for x in inputs {
                        device.state.check_dtype(ops[k].name(), x.storage.dtype)?;
                    }
                    let (dk, dv) =
                        ops::attention::key_and_value_grads(device, ops[k], inputs, metas[k])?;
                    *outs[k] = dk;
                    let done = match dv {
                        Some(dv) => {
                            *outs[v] = dv;
                            v
                        }
                        None => k,
                    };
                    for (i, op) in ops.iter().enumerate() {
                        if i != k && i != done {
                            Self::execute_into(device, op, inputs, metas[i], outs[i])?;
                        }
                    }
                    return Ok(());
                }
                kiln_tensor::backend::one_pass_by_ops::<Self>(device, ops, inputs, metas, outs)
            }
        }
    }

    fn alloc(device: &CubeDevice<R>, dtype: DType, len: usize) -> Result<CubeStorage<R>> {
        device.state.alloc("alloc", dtype, len)
    }

    fn product_with_epilogue(
        device: &CubeDevice<R>,
        op: &Op,
        operands: &[View<'_, Self>],
        out: &TensorMeta,
        epilogue: &FusedExpr,
        inputs: &[View<'_, Self>],
    ) -> Result<Option<CubeStorage<R>>> {
        // cuBLASLt's bias epilogue alone: its ReLU epilogues turn NaN into 0, where
        // Kiln's `relu` keeps NaN, so a diverging model would look healthy.
        let (
            Op::MatMul,
            [a, b],
            Some(ProductEpilogue {
                bias: Some(k),
                activation: None,
            }),
        ) = (op, operands, ProductEpilogue::of(epilogue))
        else {
            return Ok(None);
        };
        let (a, b, bias) = (*a, *b, inputs[k]);
        if out.dtype != DType::F32
            || bias.storage.dtype != DType::F32
            || !bias.layout.is_broadcast_row(&out.dims)
        {
            return Ok(None);
        }
        for v in [a, b, bias] {
            check_extent(v.storage, &v.layout)?;
            if !std::sync::Arc::ptr_eq(&v.storage.device, &device.state) {
                return Err(Error::DeviceMismatch {
                    op: "matmul",
                    lhs: Self::device_name(device),
                    rhs: format!("{}:{}", R::NAME, v.storage.device.ordinal),
                });
            }
        }
        R::vendor_matmul(device, a, b, out, Some(bias)).transpose()
    }

    fn fused_elementwise(
        device: &CubeDevice<R>,
        expr: &FusedExpr,
        native: Option<NativeFn>,
        inputs: &[View<'_, Self>],
        dims: &Dims,
        outputs: &mut [&mut CubeStorage<R>],
    ) -> Result<()> {
        // The native loop is host code; the device runs the expression as one kernel.
        let _ = native;
        // A group at whose edges mixed precision casts (bf16 or f16 in or out, the
        // rest f32) has a kernel of its own (op by op where bf16 meets f16); any other
        // dtype is refused by the f32 kernel's checks.
        let edge = |d: DType| d == DType::F32 || d.is_half();
        let mixed = inputs.iter().all(|v| edge(v.storage.dtype))
            && outputs.iter().all(|o| edge(o.dtype))
            && (inputs.iter().any(|v| v.storage.dtype != DType::F32)
                || outputs.iter().any(|o| o.dtype != DType::F32));
        if mixed {
            if ops::fused::fused_mixed(device, expr, inputs, dims, outputs)? {
                return Ok(());
            }
            return kiln_tensor::backend::fused_by_ops::<Self>(device, expr, inputs, dims, outputs);
        }
        ops::fused::fused_elementwise(device, expr, inputs, dims, outputs)
    }

    fn fused_rows(
        device: &CubeDevice<R>,
        pass: &kiln_tensor::rows::RowPass,
        inputs: &[View<'_, Self>],
        outputs: &mut [&mut CubeStorage<R>],
    ) -> Result<bool> {
        ops::rows::fused_rows(device, pass, inputs, outputs)
    }

    fn groups_fused_elementwise(_: &CubeDevice<R>) -> bool {
        R::GROUPS_FUSED_ELEMENTWISE
    }

    fn fused_elementwise_groups(
        device: &CubeDevice<R>,
        expr: &FusedExpr,
        inputs: &[View<'_, Self>],
        dims: &[Dims],
        outputs: &mut [&mut CubeStorage<R>],
    ) -> Result<()> {
        ops::fused::fused_elementwise_groups(device, expr, inputs, dims, outputs)
    }
}
