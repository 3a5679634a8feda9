//! CUDA graphs: the launches of a step (a static training step, an inference pass)
//! recorded once and replayed as one graph launch, so a replay costs the host one
//! driver call instead of its per-kernel work (about 10 to 19 µs per launch on the H200
//! host, BENCHMARKS.md). Capturing runs the step once (the recorded graph is launched),
//! so it has the effects of an eager call.
//!
//! A replay repeats the captured device work exactly: the same kernels on the same
//! buffers with the same scalar arguments. So a capture refuses what a replay could not
//! repeat (the rules are in [`crate::recording`]), with an error that says what to move
//! out of the step: copies from the host (inputs are written into their buffers between
//! replays, [`write_into`]), reads, synchronisations and random draws, and a step that
//! replaces state it read (a parameter updated by allocating a new buffer) instead of
//! updating it in place. Scalars are captured as they were: a learning rate changed
//! after capturing needs a new capture. Kernel metadata comes from the device's metadata
//! cache, filled by running the step once before capturing it; error flags (gather and
//! scatter indices, integer division) are zeroed once and read at the next
//! synchronisation after a replay; a flag keeps its first error until it is reported.
//!
//! The graph keeps every buffer it binds alive, so its addresses stay valid however the
//! caller's tensors are dropped or replaced; it replays on the thread that captured it
//! (CubeCL orders a thread's work on that thread's stream).

use crate::device::Report;
use crate::driver::{driver_error, make_current, raw_resource};
use crate::recording::Recording;
use crate::storage::{host_to_bytes, CubeStorage};
use crate::{Cuda, CudaDevice, KilnRuntime};
use cubecl::cuda::CudaRuntime;
use cubecl::server::Handle;
use cudarc::driver::{result as drv, sys as dsys};
use kiln_tensor::{Error, HostData, RawTensor, Result};
use std::thread::ThreadId;

/// A captured sequence of device work, replayed with [`CudaGraph::replay`].
pub struct CudaGraph {
    device: CudaDevice,
    thread: ThreadId,
    stream: dsys::CUstream,
    graph: dsys::CUgraph,
    exec: dsys::CUgraphExec,
    nodes: usize,
    /// The buffers the graph reads and writes, alive for as long as it may replay.
    _bound: Vec<Handle>,
    /// The error flags of its launches, with their reports.
    checks: Vec<(u64, Handle, Report)>,
}

// SAFETY: the graph's handles are driver objects, not tied to a thread: `replay` refuses
// every thread but the capturing one (whose stream and current context it was recorded
// with), and destroying them is valid from any thread.
unsafe impl Send for CudaGraph {}

/// Ends a capture however the step leaves it (an error, a panic), so that the stream
/// and the device leave capture mode.
struct CaptureGuard<'a> {
    device: &'a CudaDevice,
    stream: dsys::CUstream,
    ended: bool,
}

impl CaptureGuard<'_> {
    /// Ends the capture: the graph (or the driver's error) and what was recorded.
    fn end(&mut self) -> (Result<dsys::CUgraph>, Recording) {
        self.ended = true;
        // SAFETY: the stream is the one the capture began on.
        let graph = unsafe { drv::stream::end_capture(self.stream) }.map_err(|e| {
            Error::Device(format!(
                "the CUDA graph capture failed ({e:?}): the step did something a graph \
                 cannot hold (a synchronisation, or work on another stream)"
            ))
        });
        (graph, self.device.state.end_recording())
    }
}

impl Drop for CaptureGuard<'_> {
    fn drop(&mut self) {
        if !self.ended {
            let (graph, _) = self.end();
            if let Ok(g) = graph {
                // SAFETY: a graph the capture just made, never instantiated.
                unsafe {
                    let _ = drv::graph::destroy(g);
                }
            }
        }
    }
}

impl CudaDevice {
    /// Runs `step` once, recording its device work into a CUDA graph, and returns the
    /// graph with what `step` returned (tensors whose buffers each replay writes, such
    /// as the loss). The step runs as an eager call would (the graph is launched once),
    /// so the host state it changes matches the device whether or not it can be
    /// captured.
    ///
    /// Run the step once before capturing it: that compiles its kernels, picks its
    /// cuBLASLt algorithms, fills the metadata cache and creates optimizer state, none
    /// of which a capture can do. An error (the step's own, or what it did that a
    /// replay could not repeat, see [`crate::recording`]) returns no graph; the step has
    /// still run, with what was refused failing inside it.
    pub fn capture<T>(&self, step: impl FnOnce() -> Result<T>) -> Result<(CudaGraph, T)> {
        let state = &self.state;
        // Errors of earlier launches belong to them, not to the graph.
        state.check_pending()?;
        let thread = std::thread::current().id();
        let probe = state.alloc("capture", kiln_tensor::DType::U32, 1)?;
        let (_, stream) = raw_resource(state, &probe.handle)?;
        drop(probe);
        make_current(state)?;
        state.begin_recording(true)?;
        let mut guard = CaptureGuard {
            device: self,
            stream,
            ended: false,
        };
        // SAFETY: the calling thread's CubeCL stream, with the device's context current.
        // Relaxed mode lets CubeCL's pool allocate pages (cuMemAlloc) mid-capture.
        unsafe {
            drv::stream::begin_capture(
                stream,
                dsys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
            )
        }
        .map_err(|e| driver_error("cuStreamBeginCapture", e))?;
        // A panic in the step ends the capture (the guard) and goes on unwinding.
        let out = step();
        let (graph, recording) = guard.end();
        let graph = graph.map_err(|e| {
            Error::Device(format!(
                "{e}; the step's device work did not run, so what it changed on the host \
                 (optimizer state, replaced buffers) may not match the device"
            ))
        })?;
        let destroy = |g: dsys::CUgraph| unsafe {
            let _ = drv::graph::destroy(g);
        };
        // A launch CubeCL refused mid-capture is reported by its stream.
        if let Err(e) = state.client.flush() {
            destroy(graph);
            return Err(crate::device::server_error(&state.name, e));
        }
        let mut nodes = 0usize;
        // SAFETY: a valid graph; a null node array asks for the count only.
        if let Err(e) =
            unsafe { dsys::cuGraphGetNodes(graph, std::ptr::null_mut(), &mut nodes) }.result()
        {
            destroy(graph);
            return Err(driver_error("cuGraphGetNodes", e));
        }
        // SAFETY: a complete graph from the capture above.
        let exec =
            match unsafe { drv::graph::instantiate(graph, dsys::CUgraphInstantiate_flags(0)) } {
                Ok(exec) => exec,
                Err(e) => {
                    destroy(graph);
                    return Err(driver_error("cuGraphInstantiate", e));
                }
            };
        let captured = CudaGraph {
            device: self.clone(),
            thread,
            stream,
            graph,
            exec,
            nodes,
            _bound: recording.bound.into_values().map(|b| b.handle).collect(),
            checks: recording.checks,
        };
        // The flags were made without a host copy; zero them once, outside the graph.
        for (_, flag, _) in &captured.checks {
            CudaRuntime::fill_zeros(state, flag)?;
        }
        // The recorded work runs once now, so that the step has run as an eager call
        // would have (what was refused failing), whether or not it can be replayed: the
        // host state it changed (optimizer buffers, a program's slots) matches the device.
        captured.replay()?;
        match (out, recording.refused) {
            (Err(e), _) => Err(e),
            (_, Some(msg)) => Err(Error::Device(msg)),
            (Ok(out), None) => Ok((captured, out)),
        }
    }
}

impl kiln_tensor::Replay for CudaGraph {
    fn replay(&self) -> Result<()> {
        CudaGraph::replay(self)
    }
}

impl CudaGraph {
    /// Queues one replay of the captured work on the capturing thread's stream. Errors
    /// the kernels detect are returned by the next download or synchronisation.
    pub fn replay(&self) -> Result<()> {
        if std::thread::current().id() != self.thread {
            return Err(Error::Device(
                "a CUDA graph replays on the thread that captured it (CubeCL orders each \
                 thread's work on its own stream)"
                    .to_string(),
            ));
        }
        let state = &self.device.state;
        state.refuse_in_capture("replaying a graph")?;
        // SAFETY: an instantiated graph and the stream it was captured on, whose
        // buffers `_bound` keeps alive.
        unsafe { drv::graph::launch(self.exec, self.stream) }
            .map_err(|e| driver_error("cuGraphLaunch", e))?;
        state.defer_replay_checks(&self.checks)
    }

    /// The number of nodes (kernels, products, memsets) in the graph.
    pub fn nodes(&self) -> usize {
        self.nodes
    }

    /// The device the graph runs on.
    pub fn device(&self) -> &CudaDevice {
        &self.device
    }
}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        // SAFETY: handles this graph owns; the driver defers destruction of an
        // executable graph until its queued replays finish.
        unsafe {
            let _ = drv::graph::exec_destroy(self.exec);
            let _ = drv::graph::destroy(self.graph);
        }
    }
}

/// Copies host values into a tensor's buffer in place (a captured step's input,
/// between replays), queued on the calling thread's stream. The tensor must cover its
/// whole buffer contiguously, and the values must have its dtype and element count.
pub fn write_into(tensor: &RawTensor<Cuda>, values: &HostData) -> Result<()> {
    let target: &CubeStorage<CudaRuntime> = tensor.storage();
    let layout = tensor.layout();
    if !layout.is_contiguous() || layout.offset() != 0 || layout.numel() != target.len {
        return Err(Error::invalid(
            "write_into",
            format!(
                "the tensor is a view ({layout:?}) of a buffer of {} elements; write into a \
                 tensor that owns its whole buffer",
                target.len
            ),
        ));
    }
    let state = &target.device;
    if values.dtype() != target.dtype || values.len() != target.len {
        return Err(Error::invalid(
            "write_into",
            format!(
                "cannot write {} values of {} into a tensor of {} × {}",
                values.len(),
                values.dtype(),
                target.len,
                target.dtype
            ),
        ));
    }
    state.refuse_in_capture("copying host values to the device")?;
    if target.len == 0 {
        return Ok(());
    }
    let bytes = host_to_bytes(values);
    // Through a fresh buffer (CubeCL copies from pinned staging memory without waiting)
    // and a device copy: a direct copy from pageable memory would first wait for the
    // stream, that is for the previous replay.
    let staged = state.client.create_from_slice(&bytes);
    let (src, _) = raw_resource(state, &staged)?;
    let (dst, stream) = raw_resource(state, &target.handle)?;
    make_current(state)?;
    // SAFETY: both buffers hold `bytes.len()` bytes and are ordered on `stream`; the
    // staging buffer returns to CubeCL's pool, which reuses it in stream order.
    unsafe { drv::memcpy_dtod_async(dst, src, bytes.len(), stream) }
        .map_err(|e| driver_error("cuMemcpyDtoDAsync", e))
}
