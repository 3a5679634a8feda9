//! Holding a stream: a host function queued on the calling thread's CUDA stream waits
//! until released, so that tests can see what waits on a stalled stream (an exchange
//! whose peer stopped).

use crate::device::CubeDevice;
use crate::driver::{driver_error, make_current, raw_resource};
use cubecl::cuda::CudaRuntime;
use cudarc::driver::sys as dsys;
use kiln_tensor::{DType, Result};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Holds the calling thread's stream on a device until released: work queued after
/// [`hold_stream`] waits. For tests of what waits on a stalled stream (an exchange
/// whose peer stopped).
pub struct StreamHold(Arc<AtomicBool>);

impl StreamHold {
    /// Lets the held stream go on.
    pub fn release(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

impl Drop for StreamHold {
    fn drop(&mut self) {
        self.release();
    }
}

/// Stops the calling thread's stream on `device` (a host function queued on it that
/// waits) until the returned hold is released or dropped.
pub fn hold_stream(device: &CubeDevice<CudaRuntime>) -> Result<StreamHold> {
    /// The host function: waits for its flag, then drops its reference to it.
    unsafe extern "C" fn wait_for_release(flag: *mut c_void) {
        // SAFETY: the reference `hold_stream` leaked for this call.
        let flag = unsafe { Arc::from_raw(flag as *const AtomicBool) };
        while !flag.load(Ordering::SeqCst) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    let state = &device.state;
    make_current(state)?;
    let probe = state.alloc("hold_stream", DType::U32, 1)?;
    let (_, stream) = raw_resource(state, &probe.handle)?;
    let flag = Arc::new(AtomicBool::new(false));
    let theirs = Arc::into_raw(flag.clone()) as *mut c_void;
    // SAFETY: a live stream; the host function makes no CUDA call and owns `theirs`.
    let queued = unsafe { dsys::cuLaunchHostFunc(stream, Some(wait_for_release), theirs) };
    if queued != dsys::CUresult::CUDA_SUCCESS {
        // SAFETY: not handed to the driver after all.
        drop(unsafe { Arc::from_raw(theirs as *const AtomicBool) });
        return Err(driver_error("cuLaunchHostFunc", queued));
    }
    Ok(StreamHold(flag))
}
