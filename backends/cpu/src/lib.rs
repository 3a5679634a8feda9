//! # kiln-cpu
//!
//! Kiln's pure-Rust CPU backend: one `Vec` per buffer, kernels generic over dtypes
//! (f16 and bf16 compute in f32), threads through `rayon`, matrix products through the
//! packed GEMM of [`gemm`]. Each concern has its module: `elementwise`, `reduce`,
//! `movement`, `index`, `window` (unfold/fold), `source` (constants, random numbers),
//! `matmul`.

pub mod elementwise;
pub mod gemm;
pub mod index;
pub mod math;
pub mod matmul;
pub mod movement;
pub mod reduce;
pub mod source;
pub mod storage;
pub mod strided;
pub mod window;

pub use storage::CpuStorage;

use kiln_tensor::{Backend, DType, Dims, Error, HostData, Layout, Op, Result, TensorMeta, View};

/// The CPU backend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cpu;

/// The CPU (there is one).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuDevice;

impl Backend for Cpu {
    type Device = CpuDevice;
    type Storage = CpuStorage;

    const NAME: &'static str = "cpu";

    fn device_name(_: &CpuDevice) -> String {
        "cpu".into()
    }

    fn storage_dtype(s: &CpuStorage) -> DType {
        s.dtype()
    }

    fn storage_len(s: &CpuStorage) -> usize {
        s.len()
    }

    fn upload(_: &CpuDevice, data: HostData) -> Result<CpuStorage> {
        Ok(CpuStorage::from_host(data))
    }

    fn download(s: &CpuStorage, layout: &Layout) -> Result<HostData> {
        check_extent(s, layout)?;
        Ok(movement::contiguous(s, layout).into_host())
    }

    fn contiguous(_: &CpuDevice, x: View<'_, Cpu>) -> Result<CpuStorage> {
        check_extent(x.storage, &x.layout)?;
        Ok(movement::contiguous(x.storage, &x.layout))
    }

    fn synchronize(_: &CpuDevice) -> Result<()> {
        Ok(())
    }

    fn execute(
        _: &CpuDevice,
        op: &Op,
        inputs: &[View<'_, Cpu>],
        out: &TensorMeta,
    ) -> Result<CpuStorage> {
        for v in inputs {
            check_extent(v.storage, &v.layout)?;
        }
        let dims = Dims::new(&out.dims)?;
        let x = |i: usize| (inputs[i].storage, &inputs[i].layout);
        let result = match op {
            Op::Unary(u) => elementwise::unary(*u, x(0).0, x(0).1)?,
            Op::Binary(b) => elementwise::binary(*b, &dims, x(0).0, x(0).1, x(1).0, x(1).1)?,
            Op::Compare(c) => elementwise::compare(*c, &dims, x(0).0, x(0).1, x(1).0, x(1).1)?,
            Op::Where => {
                elementwise::select(&dims, x(0).0, x(0).1, x(1).0, x(1).1, x(2).0, x(2).1)?
            }
            Op::Cast { dtype } => elementwise::cast(x(0).0, x(0).1, *dtype)?,
            Op::Reduce { op, axes } => reduce::reduce(*op, x(0).0, x(0).1, axes)?,
            Op::Concat { axis } => {
                let parts: Vec<_> = (0..inputs.len()).map(x).collect();
                movement::concat(&parts, *axis, &dims)?
            }
            Op::Pad {
                axis,
                before,
                after,
                value,
            } => movement::pad(x(0).0, x(0).1, *axis, *before, *after, *value),
            Op::MatMul => matmul::matmul(x(0).0, x(0).1, x(1).0, x(1).1)?,
            Op::Gather { axis } => index::gather(x(0).0, x(0).1, x(1).0, x(1).1, *axis)?,
            Op::ScatterAdd { axis, .. } => {
                index::scatter_add(x(0).0, x(0).1, x(1).0, x(1).1, *axis, &dims)?
            }
            Op::Unfold2d(w) => window::unfold2d(x(0).0, x(0).1, w)?,
            Op::Fold2d {
                window,
                height,
                width,
            } => window::fold2d(x(0).0, x(0).1, window, *height, *width)?,
            Op::Full { value, dtype, .. } => source::full(dims.numel(), *value, *dtype),
            Op::Rand {
                dist, seed, dtype, ..
            } => source::rand(dims.numel(), *dist, *seed, *dtype)?,
            Op::Reshape { .. } | Op::Permute { .. } | Op::Expand { .. } | Op::Slice { .. } => {
                return Err(Error::invalid(
                    op.name(),
                    "views are layout changes and never reach a backend",
                ))
            }
        };
        debug_assert_eq!(
            result.len(),
            dims.numel(),
            "{} produced the wrong element count",
            op.name()
        );
        debug_assert_eq!(
            result.dtype(),
            out.dtype,
            "{} produced the wrong dtype",
            op.name()
        );
        Ok(result)
    }
}

/// A layout must stay inside its buffer: a broken view is a bug, reported as an error
/// rather than an out-of-bounds read.
fn check_extent(s: &CpuStorage, l: &Layout) -> Result<()> {
    if l.storage_extent() > s.len() {
        return Err(Error::invalid(
            "view",
            format!(
                "layout {:?} reaches past a buffer of {} elements",
                l,
                s.len()
            ),
        ));
    }
    Ok(())
}
