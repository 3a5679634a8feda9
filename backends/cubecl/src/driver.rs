//! CUDA driver calls Kiln makes outside CubeCL: making a device's primary context
//! current on the calling thread ([`PrimaryContext`], [`make_current`]), a buffer's
//! device address and the stream that orders it ([`raw_resource`]), and the error a
//! failed driver call becomes ([`driver_error`]).
//!
//! The CUDA runtime ([`crate::cuda`]), graph capture ([`crate::graph`]) and NCCL
//! ([`crate::nccl`]) build on this module, which imports none of them. The runtime in
//! turn uses graph capture (its `KilnRuntime` implementation captures steps and writes
//! inputs in place), so graph capture takes these pieces from here, not from the
//! runtime: imports run one way, driver ← graph ← cuda.

use crate::device::{DeviceState, KilnRuntime};
use cubecl::cuda::CudaRuntime;
use cubecl::server::Handle;
use cudarc::driver::{result as drv, sys as dsys};
use kiln_tensor::{Error, Result};
use std::sync::OnceLock;

/// The error a failed driver call (`what`) becomes.
pub(crate) fn driver_error(what: &str, e: impl std::fmt::Debug) -> Error {
    Error::Device(format!("CUDA {what} failed: {e:?}"))
}

/// A device's primary context (the one CubeCL runs in), retained the first time it is
/// made current outside CubeCL and kept for the process's life. A runtime's per-device
/// state holds one and hands it to [`make_current`] through `AsRef`.
pub(crate) struct PrimaryContext {
    ordinal: usize,
    /// The primary context's address, retained on first use outside CubeCL.
    context: OnceLock<std::result::Result<usize, String>>,
}

impl PrimaryContext {
    /// Device `ordinal`'s primary context, not retained yet.
    pub(crate) fn new(ordinal: usize) -> Self {
        PrimaryContext {
            ordinal,
            context: OnceLock::new(),
        }
    }
}

/// Makes the device's primary context (the one CubeCL runs in) current on the calling
/// thread, for driver calls made outside CubeCL.
pub(crate) fn make_current<R: KilnRuntime>(state: &DeviceState<R>) -> Result<()>
where
    R::Extra: AsRef<PrimaryContext>,
{
    let primary: &PrimaryContext = state.extra().as_ref();
    let ctx = *primary
        .context
        .get_or_init(|| unsafe {
            drv::device::get(primary.ordinal as i32)
                .and_then(|d| drv::primary_ctx::retain(d))
                .map(|c| c as usize)
                .map_err(|e| format!("{e:?}"))
        })
        .as_ref()
        .map_err(|e| Error::Device(format!("CUDA cuDevicePrimaryCtxRetain failed: {e}")))?;
    // SAFETY: the device's primary context, retained above for the process's life.
    unsafe { drv::ctx::set_current(ctx as dsys::CUcontext) }
        .map_err(|e| driver_error("cuCtxSetCurrent", e))
}

/// A buffer's device address and the calling thread's CUDA stream, which orders it
/// (asking CubeCL for the resource makes work queued on other streams wait there).
pub(crate) fn raw_resource(
    dev: &DeviceState<CudaRuntime>,
    h: &Handle,
) -> Result<(u64, dsys::CUstream)> {
    dev.client
        .get_resource(h.clone())
        .map(|r| (r.resource().ptr, r.resource().stream))
        .map_err(|e| crate::device::server_error(&dev.name, e))
}
