//! Devices: the [`KilnRuntime`] trait that adapts a CubeCL runtime to Kiln (how a device
//! is opened, what it cannot do, which dtypes it holds), the per-device state every
//! buffer points back to, and the per-launch error flags through which kernels report
//! bad indices and integer division by zero.

pub(crate) use crate::recording::Report;
use crate::recording::{Recorder, Recording};
use crate::storage::CubeStorage;
use cubecl::prelude::*;
use cubecl::server::Handle;
use kiln_tensor::{DType, Error, Result, TensorMeta, View};
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

use crate::CubeBackend;

/// What opening a device yields.
pub struct Opened<R: KilnRuntime> {
    /// The CubeCL device the client was registered under.
    pub device: R::Device,
    /// The device in words (adapter or GPU name and driver).
    pub name: String,
    /// The largest buffer one kernel may bind, in bytes.
    pub max_buffer_bytes: u64,
    /// The dtypes this device stores and computes.
    pub dtypes: Vec<DType>,
    /// Whether the device is a CPU driver (lavapipe), which some kernels special-case.
    pub cpu_adapter: bool,
    /// The memory limit the device opens with when `KILN_MEMORY_LIMIT` sets none, so
    /// that running out is Kiln's error rather than the driver's (`None`: no limit).
    pub default_memory_limit: Option<u64>,
    /// Runtime-specific state (cuBLASLt on CUDA).
    pub extra: R::Extra,
}

/// A CubeCL runtime Kiln can run on: wgpu (Vulkan, Metal, DX12) or CUDA.
pub trait KilnRuntime: Runtime + Sized {
    /// The backend's name in messages (`wgpu`, `cuda`).
    const NAME: &'static str;
    /// The 2-byte type that kernels moving bits unchanged (copies, fills, gathers)
    /// read and write f16 and bf16 values as: `u16` where the runtime has it, `f16`
    /// on WGSL, which has no 16-bit integer (a load and store keep an f16's bits).
    type Bits16: cubecl::prelude::CubePrimitive;
    /// State a device of this runtime keeps beside CubeCL's client.
    type Extra: Send + Sync + 'static;

    /// Opens device `ordinal`, or says what is missing (driver, adapter).
    fn open(ordinal: usize) -> Result<Opened<Self>>;

    /// The devices opened so far, so that each is opened once per process.
    fn registry() -> &'static Mutex<Vec<(usize, CubeDevice<Self>)>>;

    /// Whether [`KilnRuntime::vendor_matmul`] runs products (so that operands it cannot
    /// take as laid out are worth a contiguous copy).
    const VENDOR_MATMUL: bool = false;

    /// Whether many groups of one fused expression share launches of the multi-tensor
    /// kernel (`Backend::groups_fused_elementwise`). Off where the kernel has not yet
    /// run against the one-group-at-a-time path on the runtime's hardware (CUDA: the
    /// `w3groups` case of `scripts/gpu_device_run.sh` checks it there).
    const GROUPS_FUSED_ELEMENTWISE: bool = false;

    /// A matrix product the runtime runs through a vendor library, or `None` to use
    /// Kiln's own kernel. `bias`, where given, is an f32 row `[N]` broadcast over the
    /// result (stride 0 but along the last dim) that the library adds to it as its
    /// epilogue; a runtime that cannot add it returns `None`.
    fn vendor_matmul(
        _device: &CubeDevice<Self>,
        _a: View<'_, CubeBackend<Self>>,
        _b: View<'_, CubeBackend<Self>>,
        _out: &TensorMeta,
        _bias: Option<View<'_, CubeBackend<Self>>>,
    ) -> Option<Result<CubeStorage<Self>>> {
        None
    }

    /// Whether [`KilnRuntime::capture_step`] captures (CUDA graphs).
    const CAPTURES: bool = false;

    /// Captures `step` as a replayable graph (see `Backend::capture`); `None` for
    /// runtimes without graph capture.
    fn capture_step(
        _device: &CubeDevice<Self>,
        _step: &mut dyn FnMut() -> Result<()>,
    ) -> Option<Result<Box<dyn kiln_tensor::Replay>>> {
        None
    }

    /// Writes host values into a tensor's own buffer in place (`Backend::write_host`);
    /// `None` for runtimes without graph capture.
    fn write_host(
        _tensor: &kiln_tensor::RawTensor<CubeBackend<Self>>,
        _values: &kiln_tensor::HostData,
    ) -> Option<Result<()>> {
        None
    }

    /// Runs `allocate` (CubeCL reserving `bytes` of device memory; device work runs on
    /// the calling thread) and returns [`Error::OutOfMemory`] where the driver refused
    /// the memory, after handing back what CubeCL reserved. Runtimes whose allocator
    /// reports failure through CubeCL's own errors just run it.
    fn guard_allocation(
        _state: &DeviceState<Self>,
        _bytes: u64,
        allocate: &mut dyn FnMut() -> Handle,
    ) -> Result<Handle> {
        Ok(allocate())
    }

    /// The first error the driver reported outside any error scope since the last call
    /// (reported at the next synchronisation, as CUDA reports a kernel's fault).
    fn take_driver_error(_state: &DeviceState<Self>) -> Option<Error> {
        None
    }

    /// Queues zeros over a whole buffer on the calling thread's stream (re-arms the
    /// error flags of a captured graph). Runtimes without graph capture never need it.
    fn fill_zeros(_state: &DeviceState<Self>, _handle: &Handle) -> Result<()> {
        Err(Error::Device(format!(
            "{} cannot zero a buffer in place",
            Self::NAME
        )))
    }
}

/// Codes kernels leave in the device error flag.
pub mod flag {
    /// A gather index out of range.
    pub const GATHER: u32 = 1;
    /// A scatter-add index out of range.
    pub const SCATTER: u32 = 2;
    /// An integer division by zero.
    pub const DIV_ZERO: u32 = crate::kernels::elementwise::FLAG_DIV_ZERO;
}

/// One opened device: CubeCL's client and what Kiln knows about the device.
pub struct DeviceState<R: KilnRuntime> {
    pub(crate) client: ComputeClient<R>,
    pub(crate) ordinal: usize,
    pub(crate) name: String,
    pub(crate) max_buffer_bytes: u64,
    pub(crate) dtypes: Vec<DType>,
    pub(crate) cpu_adapter: bool,
    pub(crate) extra: R::Extra,
    /// Error flags of launches not read yet, per thread, in launch order.
    pub(crate) pending: Mutex<Vec<PendingCheck>>,
    /// The fused-kernel configurations launched so far (each is one compiled kernel).
    pub(crate) fused_kernels: Mutex<std::collections::HashSet<crate::kernels::fused::FusedConfig>>,
    /// Read-only metadata buffers (kernels' extents and strides) by thread and content:
    /// uploaded the first time a launch needs them and bound by every later launch with
    /// the same metadata, so steady-state steps copy nothing from the host. Per thread,
    /// because each thread's work runs on its own stream: a shared buffer would make
    /// streams wait on each other (and a graph capture cannot wait on another stream).
    pub(crate) metadata: Mutex<HashMap<ThreadId, HashMap<Vec<u32>, Handle>>>,
    /// The graph captures (or capture-rule checks) in progress on this device.
    pub(crate) recorder: Recorder,
    /// The id the next buffer takes (ids order buffers by creation).
    pub(crate) next_buffer: AtomicU64,
    /// The most device memory tensors may hold, in bytes (0: no limit but the device's).
    pub(crate) memory_limit: AtomicU64,
    /// An upper bound of the bytes tensors hold: the last measure plus every allocation
    /// since (frees are not counted, so it only overestimates).
    pub(crate) usage_bound: AtomicU64,
}

/// The error flag of one launch that may fail, read at its thread's next
/// synchronisation point.
pub(crate) struct PendingCheck {
    flag: Handle,
    thread: ThreadId,
    report: Report,
    /// A flag a graph writes on every replay: zeroed again once its error is reported,
    /// and registered once however many replays are waiting to be read.
    rearm: Option<u64>,
}

/// Unread flags one thread may leave before a launch waits to read them (a loop that
/// never reads a result would otherwise collect flags without bound).
const MAX_PENDING: usize = 64;

/// Distinct metadata buffers a thread keeps before its cache starts afresh.
const MAX_METADATA: usize = 4096;

/// Threads with a metadata cache before all caches start afresh.
const MAX_METADATA_THREADS: usize = 64;

impl<R: KilnRuntime> DeviceState<R> {
    /// The runtime-specific state.
    pub fn extra(&self) -> &R::Extra {
        &self.extra
    }

    /// CubeCL's client for this device.
    pub fn client(&self) -> &ComputeClient<R> {
        &self.client
    }

    /// A fresh zeroed error flag for one launch of a kernel that may fail: two words,
    /// the error code and a detail (the bad index's bits). Under a graph capture the
    /// flag is left for the capture to zero once it ends (a copy from the host cannot
    /// be captured).
    pub(crate) fn new_flag(self: &Arc<Self>) -> Result<CubeStorage<R>> {
        let handle = if self.capturing_graph_here() {
            self.reserve(8)?
        } else {
            self.reserve_with(&[0u8; 8])?
        };
        Ok(self.wrap(handle, DType::U32, 2))
    }

    /// A new device buffer of `bytes` (at least one word: CubeCL refuses empty ones).
    pub(crate) fn reserve(&self, bytes: u64) -> Result<Handle> {
        let bytes = bytes.max(4);
        R::guard_allocation(self, bytes, &mut || self.client.empty(bytes as usize))
    }

    /// A new device buffer holding `bytes`.
    pub(crate) fn reserve_with(&self, bytes: &[u8]) -> Result<Handle> {
        R::guard_allocation(self, bytes.len() as u64, &mut || {
            self.client.create_from_slice(bytes)
        })
    }

    /// Starts recording the calling thread's launches (`graph`: for a CUDA graph).
    pub(crate) fn begin_recording(&self, graph: bool) -> Result<()> {
        let first_buffer = self.next_buffer.load(Ordering::Relaxed);
        self.recorder.begin(&self.name, graph, first_buffer)
    }

    /// Stops the calling thread's recording and returns what was recorded.
    pub(crate) fn end_recording(&self) -> Recording {
        self.recorder.end()
    }

    /// Whether a CUDA graph is being captured on the calling thread.
    pub(crate) fn capturing_graph_here(&self) -> bool {
        self.recorder.capturing_graph_here()
    }

    /// An error if the calling thread is recording: `what` cannot be replayed.
    pub(crate) fn refuse_in_capture(&self, what: &str) -> Result<()> {
        self.recorder.refuse(what)
    }

    /// [`DeviceState::refuse_in_capture`] with the words written only while some thread
    /// records (the check is lock-free otherwise).
    pub(crate) fn refuse_in_capture_with(&self, what: &dyn Fn() -> String) -> Result<()> {
        if !self.recorder.is_active() {
            return Ok(());
        }
        self.recorder.refuse(&what())
    }

    /// Notes that a launch binds `s` (reading it, or writing part of it).
    pub(crate) fn note_bound(&self, s: &CubeStorage<R>) {
        self.recorder.note_bound(s.id, &s.handle);
    }

    /// Notes that a launch overwrites the whole of `s` without reading it.
    pub(crate) fn note_overwritten(&self, s: &CubeStorage<R>) {
        self.recorder.note_overwritten(s.id, &s.handle);
    }

    /// Notes that buffer `id` is no longer referenced.
    pub(crate) fn note_released(&self, id: u64) {
        self.recorder.note_released(id);
    }

    /// A new buffer id.
    pub(crate) fn buffer_id(&self) -> u64 {
        self.next_buffer.fetch_add(1, Ordering::Relaxed)
    }

    /// Wraps a CubeCL handle as a buffer of this device.
    pub(crate) fn wrap(
        self: &Arc<Self>,
        handle: Handle,
        dtype: DType,
        len: usize,
    ) -> CubeStorage<R> {
        CubeStorage {
            handle,
            dtype,
            len,
            id: self.buffer_id(),
            device: self.clone(),
        }
    }

    /// The metadata buffer holding `words` (read-only; shared by every launch that
    /// needs the same words).
    pub(crate) fn metadata(self: &Arc<Self>, words: &[u32]) -> Result<CubeStorage<R>> {
        let thread = std::thread::current().id();
        let cache = self.metadata.lock().expect("metadata cache");
        if let Some(h) = cache.get(&thread).and_then(|mine| mine.get(words)) {
            return Ok(self.wrap(h.clone(), DType::U32, words.len()));
        }
        drop(cache);
        self.refuse_in_capture(
            "uploading a kernel's metadata (extents or strides seen for the first time)",
        )?;
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let handle = self.reserve_with(&bytes)?;
        let mut cache = self.metadata.lock().expect("metadata cache");
        if cache.len() >= MAX_METADATA_THREADS && !cache.contains_key(&thread) {
            // Threads that ended leave their caches behind; start afresh.
            cache.clear();
        }
        let mine = cache.entry(thread).or_default();
        if mine.len() >= MAX_METADATA {
            // Launches keep their own handles; dropping the cache only costs uploads.
            mine.clear();
        }
        mine.insert(words.to_vec(), handle.clone());
        Ok(self.wrap(handle, DType::U32, words.len()))
    }

    /// Registers the error flag of a launch that may fail (a gather or scatter-add index
    /// out of range, an integer division by zero). Kernels run asynchronously, so the
    /// flag is read at the launching thread's next synchronisation point (a download,
    /// `synchronize`), where the error is returned, as CUDA and PyTorch report device-side
    /// errors; reading it here would stall the host until the device caught up, once per
    /// gather in every training step.
    pub(crate) fn defer_check(&self, flag: &CubeStorage<R>, report: Report) -> Result<()> {
        if self.recorder.keep_check(flag.id, &flag.handle, &report) {
            return Ok(());
        }
        self.push_check(flag.handle.clone(), report, None)
    }

    /// Registers the flags of launches run (not captured) under the capture rules.
    pub(crate) fn defer_checks(&self, checks: Vec<(u64, Handle, Report)>) -> Result<()> {
        for (_, flag, report) in checks {
            self.push_check(flag, report, None)?;
        }
        Ok(())
    }

    /// Registers the flags of one graph replay (each flag once however many replays
    /// are waiting to be read: a flag keeps its first error until it is reported).
    #[cfg(feature = "cuda")]
    pub(crate) fn defer_replay_checks(&self, checks: &[(u64, Handle, Report)]) -> Result<()> {
        for (id, flag, report) in checks {
            self.push_check(flag.clone(), report.clone(), Some(*id))?;
        }
        Ok(())
    }

    pub(crate) fn push_check(
        &self,
        flag: Handle,
        report: Report,
        rearm: Option<u64>,
    ) -> Result<()> {
        let thread = std::thread::current().id();
        let waiting = {
            let mut pending = self.pending.lock().expect("pending flags");
            if rearm.is_some()
                && pending
                    .iter()
                    .any(|p| p.rearm == rearm && p.thread == thread)
            {
                return Ok(());
            }
            pending.push(PendingCheck {
                flag,
                thread,
                report,
                rearm,
            });
            pending.iter().filter(|p| p.thread == thread).count()
        };
        if waiting >= MAX_PENDING {
            self.check_pending()?;
        }
        Ok(())
    }

    /// Reads the flags the calling thread's launches left (one synchronisation) and
    /// returns the first error among them, in launch order.
    pub(crate) fn check_pending(&self) -> Result<()> {
        self.refuse_in_capture("reading kernels' error flags (a synchronisation)")?;
        if let Some(error) = R::take_driver_error(self) {
            return Err(error);
        }
        let thread = std::thread::current().id();
        let mine: Vec<PendingCheck> = {
            let mut pending = self.pending.lock().expect("pending flags");
            let (mine, others) = std::mem::take(&mut *pending)
                .into_iter()
                .partition(|p| p.thread == thread);
            *pending = others;
            mine
        };
        if mine.is_empty() {
            return Ok(());
        }
        let handles = mine.iter().map(|p| p.flag.clone()).collect();
        let flags = cubecl::future::block_on(self.client.read_async(handles))
            .map_err(|e| server_error(&self.name, e))?;
        for (check, bytes) in mine.iter().zip(flags) {
            let word = |i: usize| {
                u32::from_le_bytes([
                    bytes[4 * i],
                    bytes[4 * i + 1],
                    bytes[4 * i + 2],
                    bytes[4 * i + 3],
                ])
            };
            if word(0) != 0 {
                let error = (check.report)(word(0), word(1));
                // A graph's flag is written by every replay: clear it, or every later
                // read would report this error again.
                for c in mine.iter().filter(|c| c.rearm.is_some()) {
                    R::fill_zeros(self, &c.flag)?;
                }
                return Err(error);
            }
        }
        Ok(())
    }

    /// Refuses a new buffer of `bytes` that would take the memory tensors hold past the
    /// device's memory limit ([`CubeDevice::set_memory_limit`]) with
    /// [`Error::OutOfMemory`], which leaves the device usable: drop tensors and go on.
    /// Near the limit, memory reserved but unused is given back first.
    pub(crate) fn check_memory(&self, bytes: u64) -> Result<()> {
        let limit = self.memory_limit.load(Ordering::Relaxed);
        if limit == 0 {
            return Ok(());
        }
        // Measuring asks CubeCL's server (a round trip per allocation): below half the
        // limit by the upper bound, nothing can be near it.
        let bound = self
            .usage_bound
            .fetch_add(bytes, Ordering::Relaxed)
            .saturating_add(bytes);
        if bound <= limit / 2 {
            return Ok(());
        }
        let usage = self
            .client
            .memory_usage()
            .map_err(|e| server_error(&self.name, e))?;
        self.usage_bound
            .store(usage.bytes_in_use.saturating_add(bytes), Ordering::Relaxed);
        if usage.bytes_in_use.saturating_add(bytes) > limit {
            self.usage_bound
                .store(usage.bytes_in_use, Ordering::Relaxed);
            return Err(Error::OutOfMemory {
                device: format!(
                    "{} ({} of its {limit}-byte memory limit in use)",
                    self.name, usage.bytes_in_use
                ),
                bytes: bytes as usize,
            });
        }
        if usage.bytes_reserved.saturating_add(bytes) > limit {
            self.client.memory_cleanup();
        }
        Ok(())
    }

    /// Checks that a buffer of `bytes` fits what one kernel may bind.
    pub(crate) fn check_size(&self, op: &str, bytes: u64) -> Result<()> {
        if bytes > self.max_buffer_bytes {
            return Err(Error::Device(format!(
                "`{op}` needs a buffer of {bytes} bytes, but {} binds at most {} bytes per buffer \
                 (Mesa's lavapipe caps storage buffers at 128 MiB); split the work or use a GPU",
                self.name, self.max_buffer_bytes
            )));
        }
        Ok(())
    }
}

/// The memory limit `KILN_MEMORY_LIMIT` asks for: bytes, or a number with `KiB`,
/// `MiB` or `GiB` (an error naming the variable for anything else).
fn memory_limit_from_env() -> Result<Option<u64>> {
    let Ok(text) = std::env::var("KILN_MEMORY_LIMIT") else {
        return Ok(None);
    };
    parse_size(&text).map(Some).ok_or_else(|| {
        Error::invalid(
            "KILN_MEMORY_LIMIT",
            format!(
                "{text:?} is not a size: give bytes, or a number with KiB, MiB or GiB (512MiB)"
            ),
        )
    })
}

/// `512MiB`, `2 GiB`, `1048576`: a positive size in bytes.
pub(crate) fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" | "kb" => 1 << 10,
        "m" | "mib" | "mb" => 1 << 20,
        "g" | "gib" | "gb" => 1 << 30,
        _ => return None,
    };
    let value: f64 = number.parse().ok()?;
    let bytes = value * scale as f64;
    (bytes >= 1.0 && bytes < u64::MAX as f64).then_some(bytes as u64)
}

/// Turns a CubeCL server error into Kiln's error (out of memory when it is one).
pub(crate) fn server_error(device: &str, e: cubecl::server::ServerError) -> Error {
    let text = format!("{e}");
    let lower = text.to_lowercase();
    if lower.contains("out of memory") || lower.contains("can't allocate") {
        let bytes = lower
            .split("size: ")
            .nth(1)
            .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        return Error::OutOfMemory {
            device: device.to_string(),
            bytes,
        };
    }
    Error::Device(format!("{device}: {text}"))
}

/// A device of runtime `R`: cheap to clone, compared by identity.
pub struct CubeDevice<R: KilnRuntime> {
    pub(crate) state: Arc<DeviceState<R>>,
}

impl<R: KilnRuntime> Clone for CubeDevice<R> {
    fn clone(&self) -> Self {
        CubeDevice {
            state: self.state.clone(),
        }
    }
}

impl<R: KilnRuntime> PartialEq for CubeDevice<R> {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.state, &other.state)
    }
}

impl<R: KilnRuntime> fmt::Debug for CubeDevice<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{} ({})",
            R::NAME,
            self.state.ordinal,
            self.state.name
        )
    }
}

impl<R: KilnRuntime> CubeDevice<R> {
    /// How many distinct fused kernels this device has compiled (one per expression
    /// shape and launch variant; constants are run-time values and do not count).
    pub fn fused_kernels(&self) -> usize {
        self.state
            .fused_kernels
            .lock()
            .expect("fused kernels")
            .len()
    }

    /// Device memory of the calling thread's stream, in bytes: `(in use, reserved)`
    /// (CubeCL's pools reserve pages and reuse them; a step that reserves nothing new
    /// allocates no device memory).
    pub fn memory_usage(&self) -> Result<(u64, u64)> {
        let u = self
            .state
            .client
            .memory_usage()
            .map_err(|e| server_error(&self.state.name, e))?;
        Ok((u.bytes_in_use, u.bytes_reserved))
    }

    /// Opens device `ordinal` of this runtime (once per process; later calls return
    /// the same device). On wgpu, hardware adapters come first, then software ones
    /// (lavapipe), so ordinal 0 is the GPU where there is one.
    pub fn new(ordinal: usize) -> Result<Self> {
        let mut registry = R::registry().lock().expect("device registry lock");
        if let Some((_, d)) = registry.iter().find(|(o, _)| *o == ordinal) {
            return Ok(d.clone());
        }
        let opened = R::open(ordinal)?;
        let client = R::client(&opened.device);
        let device = CubeDevice {
            state: Arc::new(DeviceState {
                client,
                ordinal,
                name: opened.name,
                max_buffer_bytes: opened.max_buffer_bytes,
                dtypes: opened.dtypes,
                cpu_adapter: opened.cpu_adapter,
                extra: opened.extra,
                pending: Mutex::new(Vec::new()),
                fused_kernels: Mutex::new(Default::default()),
                metadata: Mutex::new(HashMap::new()),
                recorder: Recorder::default(),
                next_buffer: AtomicU64::new(0),
                usage_bound: AtomicU64::new(0),
                memory_limit: AtomicU64::new(
                    memory_limit_from_env()?
                        .or(opened.default_memory_limit)
                        .unwrap_or(0),
                ),
            }),
        };
        registry.push((ordinal, device.clone()));
        Ok(device)
    }

    /// The first device (`new(0)`).
    pub fn first() -> Result<Self> {
        Self::new(0)
    }

    /// The device in words.
    pub fn name(&self) -> &str {
        &self.state.name
    }

    /// The dtypes this device supports.
    pub fn dtypes(&self) -> &[DType] {
        &self.state.dtypes
    }

    /// The largest buffer one kernel may bind, in bytes.
    pub fn max_buffer_bytes(&self) -> u64 {
        self.state.max_buffer_bytes
    }

    /// Limits the device memory this process's tensors may hold on the calling thread's
    /// stream to `bytes` (`None`: no limit but the device's; the environment variable
    /// `KILN_MEMORY_LIMIT`, as `512MiB` or `2GiB`, sets it when the device opens, and
    /// without it a CUDA device opens limited to 90% of its memory). An allocation past
    /// it is an [`Error::OutOfMemory`] the program can catch and survive: the device
    /// stays usable once tensors are dropped. Worth setting where the driver's own
    /// out-of-memory is fatal (wgpu aborts on it).
    pub fn set_memory_limit(&self, bytes: Option<u64>) {
        self.state
            .memory_limit
            .store(bytes.unwrap_or(0), Ordering::Relaxed);
    }

    /// The memory limit [`CubeDevice::set_memory_limit`] set, if any.
    pub fn memory_limit(&self) -> Option<u64> {
        match self.state.memory_limit.load(Ordering::Relaxed) {
            0 => None,
            n => Some(n),
        }
    }

    /// The shared state (client, limits).
    pub fn state(&self) -> &Arc<DeviceState<R>> {
        &self.state
    }
}

impl<R: KilnRuntime> CubeDevice<R> {
    /// Runs `step` (for real) under the rules of a CUDA graph capture, on any runtime:
    /// an error where capturing it would fail (a host copy, a read, state replaced
    /// instead of updated in place), else what `step` returned. Kernel errors of the
    /// step are reported as usual, at the next read.
    pub fn check_capturable<T>(&self, step: impl FnOnce() -> Result<T>) -> Result<T> {
        let state = &self.state;
        state.check_pending()?;
        state.begin_recording(false)?;
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(step));
        let recording = state.end_recording();
        let out = out.unwrap_or_else(|p| std::panic::resume_unwind(p));
        state.defer_checks(recording.checks)?;
        match recording.refused {
            Some(msg) => Err(Error::Device(msg)),
            None => out,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn memory_limits_parse_as_sizes() {
        assert_eq!(parse_size("1048576"), Some(1 << 20));
        assert_eq!(parse_size("512MiB"), Some(512 << 20));
        assert_eq!(parse_size("2 GiB"), Some(2 << 30));
        assert_eq!(parse_size("1.5g"), Some(3 << 29));
        assert_eq!(parse_size("64k"), Some(64 << 10));
        for bad in ["", "0", "-5MiB", "lots", "12 parsecs", "1e99GiB"] {
            assert_eq!(parse_size(bad), None, "{bad}");
        }
    }
}
