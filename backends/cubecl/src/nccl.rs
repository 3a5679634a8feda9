//! Collectives between CUDA ranks through NCCL, NVIDIA's library (what PyTorch's DDP
//! uses), loaded at run time through cudarc like cuBLASLt: one process per GPU, each an
//! [`NcclRank`], meeting through an [`NcclId`] that rank 0 makes and passes to the
//! others (kiln-train's launcher passes it in its rendezvous folder).
//!
//! Exchanges are queued on the CUDA stream CubeCL's kernels run on, so they are ordered
//! after the backward pass's kernels and before the optimizer's, with no host
//! synchronisation: a step's gradients are averaged as one NCCL group per bucket.
//! Started exchanges ([`Collective::start_all_reduce_mean`]) run on a stream of their
//! own, after the work queued before them and beside the rest of the backward pass;
//! the optimizer's work waits for them ([`Collective::finish_exchanges`]). Both
//! streams are captured into a step's CUDA graph alike.
//!
//! A watchdog thread ([`crate::watchdog`]) fails the group when an exchange has not
//! ended within the rank's timeout of being queued (a peer died mid-exchange, which
//! NCCL would wait on forever): it aborts the communicator, which ends the waiting
//! kernels, and the rank's next call fails saying why.

use crate::driver::{driver_error, make_current, raw_resource};
use crate::storage::device_size;
use crate::watchdog::{Mark, Watchdog};
use crate::{Cuda, CudaDevice};
use cudarc::driver::{result as drv, sys as dsys};
use cudarc::nccl::{result as nc, sys as ncsys};
use kiln_tensor::{Collective, DType, Error, RawTensor, Result};
use std::cell::{Cell, RefCell};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What to install when NCCL is not found.
pub const NCCL_HINT: &str = "NCCL is loaded as libnccl.so from LD_LIBRARY_PATH: PyTorch's CUDA \
     wheels carry it (nvidia/nccl/lib/libnccl.so.2; link libnccl.so to it), as does NVIDIA's \
     libnccl2 package";

/// The id every rank of one NCCL group joins with: rank 0 makes it, the others read it.
#[derive(Clone, Copy)]
pub struct NcclId(ncsys::ncclUniqueId);

impl NcclId {
    /// A new group's id (rank 0's part: it listens for the other ranks).
    pub fn new() -> Result<NcclId> {
        loaded()?;
        nc::get_uniqueid()
            .map(NcclId)
            .map_err(|e| nccl_error("ncclGetUniqueId", e, None))
    }

    /// Its bytes, to pass to the other ranks.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.0.internal.iter().map(|&b| b as u8).collect()
    }

    /// The id rank 0 made, from its bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<NcclId> {
        let mut id = ncsys::ncclUniqueId { internal: [0; 128] };
        if bytes.len() != id.internal.len() {
            return Err(Error::invalid(
                "NcclId",
                format!(
                    "an NCCL id is {} bytes, not {}",
                    id.internal.len(),
                    bytes.len()
                ),
            ));
        }
        for (to, &from) in id.internal.iter_mut().zip(bytes) {
            *to = from as _;
        }
        Ok(NcclId(id))
    }
}

/// One rank of an NCCL group, on its own CUDA device.
pub struct NcclRank {
    comm: Arc<Comm>,
    rank: usize,
    world: usize,
    device: CudaDevice,
    /// The stream started exchanges run on, beside the work queued after them.
    side: dsys::CUstream,
    /// Recorded on the calling thread's stream before a started exchange (the side
    /// stream waits for it), and on the side stream after it (work queued after
    /// [`Collective::finish_exchanges`] waits for that).
    ready: dsys::CUevent,
    done: dsys::CUevent,
    /// Whether exchanges were started since the last `finish_exchanges`.
    started: Cell<bool>,
    /// The buffers started exchanges read and write, held until later work is ordered
    /// after them (freed earlier, the pool would hand them to that work meanwhile).
    in_flight: RefCell<Vec<RawTensor<Cuda>>>,
    /// A buffer whose resource names the calling thread's stream.
    probe: RawTensor<Cuda>,
    watchdog: Option<Watchdog>,
}

// SAFETY: the rank is used by one thread at a time (`&self` calls are made by the
// rank's training loop), after making its device's context current; its stream and
// events are handles valid on any thread.
unsafe impl Send for NcclRank {}

/// An NCCL communicator, shared with the watchdog that may abort it.
struct Comm {
    raw: ncsys::ncclComm_t,
    /// Held by every call into NCCL, so that an abort does not free the communicator
    /// under one.
    calls: Mutex<()>,
    /// Whether the watchdog aborted it (then it is gone: never used again).
    aborted: AtomicBool,
}

// SAFETY: NCCL calls on the communicator are serialised by `calls`; the watchdog's
// abort is the one call that may come from another thread, as NCCL allows.
unsafe impl Send for Comm {}
unsafe impl Sync for Comm {}

impl Comm {
    /// Aborts the communicator (ending kernels that wait on a peer), once. Waits a
    /// little for a call in progress to return; one that does not is stuck in NCCL,
    /// which the abort is there to end.
    fn abort(&self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        let mut held = self.calls.try_lock().ok();
        while held.is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
            held = self.calls.try_lock().ok();
        }
        if !self.aborted.swap(true, Ordering::SeqCst) {
            // SAFETY: a live communicator, never used after this (`aborted`).
            let _ = unsafe { nc::comm_abort(self.raw) };
        }
    }
}

/// A recorded CUDA event: a point in a stream's work, for the watchdog.
struct EventMark(dsys::CUevent);

// SAFETY: an event handle is usable from any thread of its context's process.
unsafe impl Send for EventMark {}

impl Mark for EventMark {
    fn ended(&self) -> std::result::Result<bool, String> {
        // SAFETY: a live event, recorded once.
        match unsafe { dsys::cuEventQuery(self.0) } {
            dsys::CUresult::CUDA_SUCCESS => Ok(true),
            dsys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            e => Err(format!("{e:?}")),
        }
    }
}

impl Drop for EventMark {
    fn drop(&mut self) {
        // SAFETY: the event is not used after this.
        unsafe { dsys::cuEventDestroy_v2(self.0) };
    }
}

/// Whether `stream` is being captured into a graph (its work is not run now).
fn capturing(stream: dsys::CUstream) -> Result<bool> {
    let mut status = dsys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: a live stream; `status` is written by the driver.
    unsafe { dsys::cuStreamIsCapturing(stream, &mut status) }
        .result()
        .map_err(|e| driver_error("cuStreamIsCapturing", e))?;
    Ok(status != dsys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// A new event without timing (the caller's context current).
fn new_event() -> Result<dsys::CUevent> {
    drv::event::create(dsys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
        .map_err(|e| driver_error("cuEventCreate", e))
}

/// Records `event` on `stream`.
fn record(event: dsys::CUevent, stream: dsys::CUstream) -> Result<()> {
    // SAFETY: callers pass a live event and stream of the current context.
    unsafe { drv::event::record(event, stream) }.map_err(|e| driver_error("cuEventRecord", e))
}

/// Makes the work queued on `stream` from now on wait for `event`'s last record.
fn wait(stream: dsys::CUstream, event: dsys::CUevent) -> Result<()> {
    // SAFETY: callers pass a live event and stream of the current context.
    unsafe {
        drv::stream::wait_event(
            stream,
            event,
            dsys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
        )
    }
    .map_err(|e| driver_error("cuStreamWaitEvent", e))
}

/// An error unless libnccl can be loaded (cudarc panics on a missing library).
fn loaded() -> Result<()> {
    let present = std::panic::catch_unwind(|| unsafe { ncsys::is_culib_present() });
    match present {
        Ok(true) => Ok(()),
        _ => Err(Error::Device(format!(
            "NCCL could not be loaded: {NCCL_HINT}"
        ))),
    }
}

/// An NCCL call's error in words, with what NCCL last said on `comm`.
fn nccl_error(what: &str, e: nc::NcclError, comm: Option<ncsys::ncclComm_t>) -> Error {
    let text = |p: *const std::ffi::c_char| {
        if p.is_null() {
            String::new()
        } else {
            // SAFETY: NCCL returns NUL-terminated static strings.
            unsafe { std::ffi::CStr::from_ptr(p) }
                .to_string_lossy()
                .into_owned()
        }
    };
    let name = text(unsafe { ncsys::ncclGetErrorString(e.0) });
    let last = comm
        .map(|c| text(unsafe { ncsys::ncclGetLastError(c) }))
        .unwrap_or_default();
    let detail = if last.is_empty() {
        String::new()
    } else {
        format!(": {last}")
    };
    Error::Device(format!("NCCL {what} failed ({name}){detail}"))
}

/// NCCL's name for a dtype.
fn nccl_dtype(op: &'static str, dtype: DType) -> Result<ncsys::ncclDataType_t> {
    use ncsys::ncclDataType_t as T;
    Ok(match dtype {
        DType::F32 => T::ncclFloat32,
        DType::F64 => T::ncclFloat64,
        DType::F16 => T::ncclFloat16,
        DType::BF16 => T::ncclBfloat16,
        DType::I32 => T::ncclInt32,
        DType::U32 => T::ncclUint32,
        DType::Bool if device_size(DType::Bool) == 4 => T::ncclUint32,
        DType::Bool => T::ncclUint8,
        DType::I8 => T::ncclInt8,
    })
    .and_then(|t| match op {
        "all_reduce_mean" if !dtype.is_float() => Err(Error::dtype(
            op,
            format!("averages float tensors, not {dtype}"),
        )),
        _ => Ok(t),
    })
}

impl NcclRank {
    /// Joins the group of `world` ranks `id` names as `rank`, on `device`; waits at
    /// most `timeout` for every rank to join (NCCL itself would wait forever), and
    /// fails the group when an exchange has not ended `timeout` after it was queued (a
    /// peer that died mid-exchange): later calls then fail with an error saying so.
    pub fn join(
        device: &CudaDevice,
        id: &NcclId,
        rank: usize,
        world: usize,
        timeout: Duration,
    ) -> Result<NcclRank> {
        if rank >= world {
            return Err(Error::invalid(
                "NcclRank",
                format!("rank {rank} is not a rank of {world}"),
            ));
        }
        loaded()?;
        let (id, state) = (*id, device.state.clone());
        let (tx, rx) = std::sync::mpsc::channel();
        // ncclCommInitRank blocks until every rank joins: it runs on a thread of its
        // own, so that a rank that never comes makes this one fail, not hang.
        std::thread::spawn(move || {
            let joined = make_current(&state).and_then(|()| {
                let mut comm = std::ptr::null_mut();
                // SAFETY: `comm` is written by NCCL; the device's context is current.
                unsafe { nc::comm_init_rank(&mut comm, world as i32, id.0, rank as i32) }
                    .map(|_| comm as usize)
                    .map_err(|e| nccl_error("ncclCommInitRank", e, None))
            });
            let _ = tx.send(joined);
        });
        let comm = match rx.recv_timeout(timeout) {
            Ok(joined) => joined? as ncsys::ncclComm_t,
            Err(_) => {
                return Err(Error::Device(format!(
                    "NCCL rank {rank}: waited {:.0} s for all {world} ranks to join (a rank died or never started)",
                    timeout.as_secs_f64()
                )))
            }
        };
        // The stream and events below belong to the device's context.
        make_current(&device.state)?;
        let comm = Arc::new(Comm {
            raw: comm,
            calls: Mutex::new(()),
            aborted: AtomicBool::new(false),
        });
        let side = drv::stream::create(drv::stream::StreamKind::NonBlocking)
            .map_err(|e| driver_error("cuStreamCreate", e))?;
        let (state, aborting) = (device.state.clone(), comm.clone());
        let watchdog = Watchdog::spawn(
            format!("NCCL rank {rank} of {world}"),
            timeout,
            move || {
                let _ = make_current(&state);
                // Relaxed: its event queries must not disturb a capture on another
                // thread (the training loop's).
                let mut mode = dsys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
                // SAFETY: `mode` is read and written by the driver.
                unsafe { dsys::cuThreadExchangeStreamCaptureMode(&mut mode) };
            },
            move || aborting.abort(),
        );
        Ok(NcclRank {
            comm,
            rank,
            world,
            side,
            ready: new_event()?,
            done: new_event()?,
            started: Cell::new(false),
            in_flight: RefCell::new(Vec::new()),
            probe: RawTensor::zeros(&[1], DType::U32, device)?,
            device: device.clone(),
            watchdog: Some(watchdog),
        })
    }

    /// An error if the group has failed: the watchdog aborted it, or NCCL found an
    /// error since the last call (a peer that failed), so that this rank stops instead
    /// of queueing work that never ends.
    fn check(&self, op: &str) -> Result<()> {
        if let Some(why) = self.watchdog.as_ref().and_then(Watchdog::failed) {
            return Err(Error::Device(why));
        }
        let _call = self.comm.calls.lock().unwrap_or_else(|e| e.into_inner());
        self.not_aborted()?;
        let mut status = ncsys::ncclResult_t::ncclSuccess;
        // SAFETY: a live communicator; `status` is written by NCCL.
        let r = unsafe { ncsys::ncclCommGetAsyncError(self.comm.raw, &mut status) };
        r.result()
            .map_err(|e| nccl_error(op, e, Some(self.comm.raw)))?;
        status
            .result()
            .map(|_| ())
            .map_err(|e| nccl_error(op, e, Some(self.comm.raw)))
    }

    /// An error, the watchdog's, if it aborted the communicator (call with `calls`
    /// held: the communicator may be used only while this says it is there).
    fn not_aborted(&self) -> Result<()> {
        if !self.comm.aborted.load(Ordering::SeqCst) {
            return Ok(());
        }
        let why = self.watchdog.as_ref().and_then(Watchdog::failed);
        Err(Error::Device(why.unwrap_or_else(|| {
            format!(
                "NCCL rank {} of {}: the group was aborted",
                self.rank, self.world
            )
        })))
    }

    /// The calling thread's stream on this rank's device (CubeCL's, which its kernels
    /// and cuBLASLt's products run on).
    fn stream(&self) -> Result<dsys::CUstream> {
        raw_resource(&self.device.state, &self.probe.storage().handle).map(|(_, s)| s)
    }

    /// Puts the work queued on `stream` so far under the watchdog's timeout (not while
    /// it is being captured: a replay's work is watched when it is queued).
    fn watch_stream(&self, stream: dsys::CUstream) -> Result<()> {
        let Some(watchdog) = &self.watchdog else {
            return Ok(());
        };
        if capturing(stream)? {
            return Ok(());
        }
        let event = EventMark(new_event()?);
        record(event.0, stream)?;
        watchdog.watch(Box::new(event));
        Ok(())
    }

    /// Runs `each` for every tensor (made contiguous, on this rank's device), as one
    /// NCCL group, with its input and output addresses, length, NCCL dtype and the
    /// stream; returns the outputs. `beside`: on the side stream, after the work
    /// queued so far and beside the work queued next (a started exchange).
    fn grouped(
        &self,
        op: &'static str,
        tensors: &[RawTensor<Cuda>],
        beside: bool,
        each: &dyn Fn(
            *const c_void,
            *mut c_void,
            usize,
            ncsys::ncclDataType_t,
            ncsys::cudaStream_t,
        ) -> std::result::Result<nc::NcclStatus, nc::NcclError>,
    ) -> Result<Vec<RawTensor<Cuda>>> {
        let dev = &self.device.state;
        make_current(dev)?;
        self.check(op)?;
        let mut inputs = Vec::with_capacity(tensors.len());
        let mut outputs = Vec::with_capacity(tensors.len());
        for t in tensors {
            if t.device() != &self.device {
                return Err(Error::invalid(
                    op,
                    format!(
                        "rank {} exchanges tensors on {}, not on {}",
                        self.rank,
                        self.device.name(),
                        t.device().name()
                    ),
                ));
            }
            let dtype = nccl_dtype(op, t.dtype())?;
            let t = t.contiguous()?;
            let out = dev.alloc(op, t.dtype(), t.numel())?;
            dev.note_bound(t.storage());
            dev.note_overwritten(&out);
            inputs.push((t, dtype));
            outputs.push(out);
        }
        let main = self.stream()?;
        let stream = match beside {
            true => {
                record(self.ready, main)?;
                wait(self.side, self.ready)?;
                self.side
            }
            false => main,
        };
        {
            let _call = self.comm.calls.lock().unwrap_or_else(|e| e.into_inner());
            // The watchdog may have aborted the group since `check`: the communicator
            // is gone then.
            self.not_aborted()?;
            let comm = self.comm.raw;
            nc::group_start().map_err(|e| nccl_error("ncclGroupStart", e, Some(comm)))?;
            let mut queued = Ok(());
            for ((t, dtype), out) in inputs.iter().zip(&outputs) {
                let esize = device_size(t.dtype()) as u64;
                let (src, _) = raw_resource(dev, &t.storage().handle)?;
                let src = src + t.layout().offset() as u64 * esize;
                let (dst, _) = raw_resource(dev, &out.handle)?;
                if let Err(e) = each(
                    src as *const c_void,
                    dst as *mut c_void,
                    t.numel(),
                    *dtype,
                    stream as _,
                ) {
                    queued = Err(nccl_error(op, e, Some(comm)));
                    break;
                }
            }
            let ended = nc::group_end().map_err(|e| nccl_error("ncclGroupEnd", e, Some(comm)));
            queued?;
            ended?;
        }
        let outputs = inputs
            .iter()
            .zip(outputs)
            .map(|((t, _), out)| RawTensor::from_storage(out, *t.dims(), self.device.clone()))
            .collect::<Result<Vec<_>>>()?;
        if beside {
            record(self.done, self.side)?;
            self.started.set(true);
            let mut held = self.in_flight.borrow_mut();
            held.extend(inputs.into_iter().map(|(t, _)| t));
            held.extend(outputs.iter().cloned());
        }
        self.watch_stream(stream)?;
        Ok(outputs)
    }
}

impl Collective<Cuda> for NcclRank {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.world
    }

    fn captures(&self) -> bool {
        true
    }

    fn all_reduce_mean(&self, tensors: &[RawTensor<Cuda>]) -> Result<Vec<RawTensor<Cuda>>> {
        self.averaged(tensors, false)
    }

    fn start_all_reduce_mean(&self, tensors: &[RawTensor<Cuda>]) -> Result<Vec<RawTensor<Cuda>>> {
        self.averaged(tensors, true)
    }

    fn finish_exchanges(&self) -> Result<()> {
        if !self.started.replace(false) {
            return Ok(());
        }
        make_current(&self.device.state)?;
        let main = self.stream()?;
        wait(main, self.done)?;
        // Work queued from now on (what reuses these buffers) waits for the exchanges.
        self.in_flight.borrow_mut().clear();
        self.watch_stream(main)
    }

    fn watch(&self) -> Result<()> {
        make_current(&self.device.state)?;
        self.check("watch")?;
        self.watch_stream(self.stream()?)
    }

    fn broadcast(&self, tensors: &[RawTensor<Cuda>], root: usize) -> Result<Vec<RawTensor<Cuda>>> {
        if root >= self.world {
            return Err(Error::invalid(
                "broadcast",
                format!("root {root} is not a rank of {}", self.world),
            ));
        }
        let comm = self.comm.raw;
        self.grouped(
            "broadcast",
            tensors,
            false,
            &|src, dst, n, dtype, stream| unsafe {
                // SAFETY: as in `all_reduce_mean`.
                nc::broadcast(src, dst, n, dtype, root as i32, comm, stream)
            },
        )
    }
}

impl NcclRank {
    /// `tensors` averaged over the ranks, on the calling thread's stream or `beside` it.
    fn averaged(&self, tensors: &[RawTensor<Cuda>], beside: bool) -> Result<Vec<RawTensor<Cuda>>> {
        let comm = self.comm.raw;
        self.grouped(
            "all_reduce_mean",
            tensors,
            beside,
            &|src, dst, n, dtype, stream| unsafe {
                // SAFETY: `src` and `dst` hold `n` elements on this rank's device, ordered
                // on `stream`; the buffers outlive the exchange (held by `grouped`'s
                // caller, or in `in_flight` for a started one).
                nc::all_reduce(
                    src,
                    dst,
                    n,
                    dtype,
                    ncsys::ncclRedOp_t::ncclAvg,
                    comm,
                    stream,
                )
            },
        )
    }
}

impl Drop for NcclRank {
    fn drop(&mut self) {
        let _ = make_current(&self.device.state);
        // Exchanges still running on the side stream end first (the watchdog, still
        // running, aborts them where a peer died), then the communicator goes.
        // SAFETY: the side stream, live until destroyed below.
        unsafe { dsys::cuStreamSynchronize(self.side) };
        self.in_flight.borrow_mut().clear();
        let failed = self.check("ncclCommDestroy").is_err();
        drop(self.watchdog.take());
        // SAFETY: the communicator, events and stream are not used after this.
        unsafe {
            if !self.comm.aborted.load(Ordering::SeqCst) {
                let _ = match failed {
                    true => nc::comm_abort(self.comm.raw),
                    false => nc::comm_destroy(self.comm.raw),
                };
            }
            dsys::cuEventDestroy_v2(self.ready);
            dsys::cuEventDestroy_v2(self.done);
            dsys::cuStreamDestroy_v2(self.side);
        }
    }
}
