//! The CUDA runtime: CubeCL's CUDA C++ kernels through NVRTC, and matrix products
//! through cuBLASLt (3 to 4 times CubeCL's own matmuls on an H200).
//!
//! Libraries are loaded at run time (cudarc's dynamic loading, CUDA 13 bindings):
//! libcuda from the driver, and NVRTC and cuBLASLt from a CUDA 13 install or PyTorch's
//! bundled `nvidia/cu13/lib`, named in `LD_LIBRARY_PATH`. NVRTC compiles against the
//! CUDA headers at run time, so `CUDA_PATH` must name an install with `include/` (and
//! `include/cccl`).
//!
//! cuBLASLt queues its products on the CUDA stream CubeCL's kernels run on (CubeCL 0.10
//! keeps that stream private; Kiln's patched cubecl-cuda, vendor/README.md, hands it
//! out with a buffer's resource), so a product is ordered after the kernels that wrote
//! its inputs and before those that read its result, with no host synchronisation, and
//! buffers freed afterwards are reused in stream order.
//!
//! This module opens a device and adapts the runtime to Kiln ([`KilnRuntime`]: the
//! device's state, products, graph capture, in-place writes). Its submodules own the
//! rest: `cublaslt` runs the products and chooses each problem's algorithm, `algo` the
//! opt-in timed search among candidates, `tf32` the TF32 switch, and `stream_hold` a
//! test's hold on a stream. Driver calls outside CubeCL (the primary context, a
//! buffer's address and stream) come from the crate's `driver` module, which graph
//! capture ([`crate::graph`]) and NCCL ([`crate::nccl`]) share: this module uses graph
//! capture, and graph capture does not use this module.

mod algo;
mod cublaslt;
mod stream_hold;
mod tf32;

pub use algo::{algorithm_search, set_algorithm_search, AlgorithmSearch};
pub use stream_hold::{hold_stream, StreamHold};
pub use tf32::{allow_tf32, set_allow_tf32};

use crate::device::{CubeDevice, DeviceState, KilnRuntime, Opened};
use crate::driver::{driver_error, raw_resource, PrimaryContext};
use crate::storage::CubeStorage;
use crate::strided::{coalesce, Operand};
use crate::CubeBackend;
use cubecl::cuda::CudaRuntime;
use cubecl::server::Handle;
use cublaslt::{as_lt, lt_matmul, Blas};
use cudarc::driver::result as drv;
use kiln_tensor::{DType, Error, Result, TensorMeta, View};
use std::sync::atomic::Ordering;
use std::sync::Mutex;

/// What to install when no CUDA driver or device is found.
pub const INSTALL_HINT: &str = "install the NVIDIA driver (libcuda.so) and a CUDA 13 toolkit or \
     PyTorch's CUDA 13 libraries (NVRTC, cuBLASLt), name their folders in LD_LIBRARY_PATH, and \
     set CUDA_PATH to a CUDA install with include/ and include/cccl";

/// The CUDA runtime's per-device state: cuBLASLt, made on first use.
pub struct CudaExtra {
    ordinal: usize,
    blas: Mutex<Option<Blas>>,
    /// The primary context, retained on first use outside CubeCL.
    context: PrimaryContext,
    /// Products that added a bias in cuBLASLt's epilogue.
    bias_epilogues: std::sync::atomic::AtomicUsize,
}

impl AsRef<PrimaryContext> for CudaExtra {
    fn as_ref(&self) -> &PrimaryContext {
        &self.context
    }
}

impl CubeDevice<CudaRuntime> {
    /// How many products so far added their bias inside cuBLASLt (a fused epilogue)
    /// instead of in a kernel after the product.
    pub fn bias_epilogues(&self) -> usize {
        self.state.extra().bias_epilogues.load(Ordering::Relaxed)
    }

    /// The timed algorithm searches this device's products have made so far.
    pub fn algorithm_searches(&self) -> Vec<AlgorithmSearch> {
        let blas = self
            .state
            .extra()
            .blas
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        blas.as_ref()
            .map(|b| b.searches.clone())
            .unwrap_or_default()
    }
}

/// Runs `f` between `cuProfilerStart` and `cuProfilerStop`, so that `ncu
/// --profile-from-start off` profiles exactly the kernels it launches (`f` should
/// synchronise the device before it returns). Without a profiler attached both calls
/// do nothing.
pub fn profiler_range<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: plain driver calls on the current context; a failure only means no profile.
    unsafe { cudarc::driver::sys::cuProfilerStart() };
    let out = f();
    // SAFETY: as above.
    unsafe { cudarc::driver::sys::cuProfilerStop() };
    out
}

/// Runs a call that may panic because a library could not be loaded.
fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        Err(Error::Device(format!(
            "{what}: a CUDA library could not be loaded ({msg}); {INSTALL_HINT}"
        )))
    })
}

/// The kernels NVRTC compiles without fused multiply-adds (by the start of their
/// entrypoint names): the elementwise family (op by op, fused, grouped, mixed
/// precision), the float reductions (whose prologues are fused expressions) and the
/// row passes. NVRTC contracts `a · b + c` where its scheduling of the surrounding
/// code allows, so the same steps fused alone and among other groups rounded
/// differently on an H100 (AdamW's moments, one ulp apart); uncontracted, every step
/// rounds on its own in each of them, as on the CPU, and a plan gives the bits of its
/// ops run one by one. These kernels are bound by memory; products and attention keep
/// their fused multiply-adds.
const UNCONTRACTED: &[&str] = &[
    "unary_float",
    "binary_float",
    "fused_",
    "reduce_float",
    "row_pass",
];

impl KilnRuntime for CudaRuntime {
    const NAME: &'static str = "cuda";
    type Extra = CudaExtra;
    type Bits16 = u16;

    fn open(ordinal: usize) -> Result<Opened<Self>> {
        guarded("opening a CUDA device", || {
            drv::init().map_err(|e| {
                Error::Device(format!(
                    "the CUDA driver did not initialise ({e:?}): {INSTALL_HINT}"
                ))
            })?;
            let count =
                drv::device::get_count().map_err(|e| driver_error("cuDeviceGetCount", e))?;
            if ordinal >= count as usize {
                return Err(Error::Device(format!(
                    "no CUDA device {ordinal} (found {count}): {INSTALL_HINT}"
                )));
            }
            let dev =
                drv::device::get(ordinal as i32).map_err(|e| driver_error("cuDeviceGet", e))?;
            let name =
                drv::device::get_name(dev).map_err(|e| driver_error("cuDeviceGetName", e))?;
            let total = unsafe { drv::device::total_mem(dev) }
                .map_err(|e| driver_error("cuDeviceTotalMem", e))?;
            if cubecl::cuda::install::cuda_path().is_none_or(|p| !p.join("include").exists()) {
                return Err(Error::Device(format!(
                    "CubeCL compiles CUDA kernels with NVRTC against the CUDA headers, but none were \
                     found (CUDA_PATH unset and /usr/local/cuda missing): {INSTALL_HINT}"
                )));
            }
            cubecl::cuda::UNCONTRACTED_KERNELS.get_or_init(|| UNCONTRACTED);
            Ok(Opened {
                device: cubecl::cuda::CudaDevice::new(ordinal),
                name: format!("{name} (CUDA device {ordinal})"),
                // CubeCL's CUDA memory pages are a quarter of the device memory.
                max_buffer_bytes: total as u64 / 4,
                dtypes: DType::ALL.to_vec(),
                cpu_adapter: false,
                // Kiln's own limit refuses an allocation before the driver would fail
                // it (deep inside CubeCL's deferred allocation); the tenth left over
                // covers the pools' pages, cuBLASLt's workspace and the driver's own.
                default_memory_limit: Some(total as u64 / 10 * 9),
                extra: CudaExtra {
                    ordinal,
                    blas: Mutex::new(None),
                    context: PrimaryContext::new(ordinal),
                    bias_epilogues: Default::default(),
                },
            })
        })
    }

    fn registry() -> &'static Mutex<Vec<(usize, CubeDevice<Self>)>> {
        static DEVICES: Mutex<Vec<(usize, CubeDevice<CudaRuntime>)>> = Mutex::new(Vec::new());
        &DEVICES
    }

    const CAPTURES: bool = true;

    fn capture_step(
        device: &CubeDevice<Self>,
        step: &mut dyn FnMut() -> Result<()>,
    ) -> Option<Result<Box<dyn kiln_tensor::Replay>>> {
        Some(
            device
                .capture(step)
                .map(|(graph, ())| Box::new(graph) as Box<dyn kiln_tensor::Replay>),
        )
    }

    fn write_host(
        tensor: &kiln_tensor::RawTensor<CubeBackend<Self>>,
        values: &kiln_tensor::HostData,
    ) -> Option<Result<()>> {
        Some(crate::graph::write_into(tensor, values))
    }

    fn fill_zeros(state: &DeviceState<Self>, handle: &Handle) -> Result<()> {
        let (ptr, stream) = raw_resource(state, handle)?;
        let bytes = handle.size_in_used() as usize;
        // SAFETY: the address and size are the live buffer's, on the stream that orders it.
        unsafe { drv::memset_d8_async(ptr, 0, bytes, stream) }
            .map_err(|e| driver_error("cuMemsetD8Async", e))
    }

    const VENDOR_MATMUL: bool = true;

    const GROUPS_FUSED_ELEMENTWISE: bool = true;

    fn vendor_matmul(
        device: &CubeDevice<Self>,
        a: View<'_, CubeBackend<Self>>,
        b: View<'_, CubeBackend<Self>>,
        out: &TensorMeta,
        bias: Option<View<'_, CubeBackend<Self>>>,
    ) -> Option<Result<CubeStorage<Self>>> {
        let r = out.dims.len();
        let (m, n) = (out.dims[r - 2], out.dims[r - 1]);
        let k = a.layout.dims()[r - 1];
        if m == 0 || n == 0 || k == 0 {
            return None;
        }
        // One batch stride per operand: the batch dims must coalesce to at most one.
        let batch_dims = &out.dims[..r - 2];
        let (sa, sb) = (a.layout.strides(), b.layout.strides());
        let (bd, ops) = coalesce(
            batch_dims,
            &[
                Operand {
                    offset: 0,
                    strides: sa[..r - 2].to_vec(),
                },
                Operand {
                    offset: 0,
                    strides: sb[..r - 2].to_vec(),
                },
                Operand::contiguous(batch_dims, 0),
            ],
        );
        if bd.len() > 1 {
            return None;
        }
        let batch = bd.first().copied().unwrap_or(1);
        let bs = |i: usize| ops[i].strides.first().copied().unwrap_or(0);
        // Cᵀ = Bᵀ·Aᵀ in column-major: B is cuBLASLt's first operand, A its second.
        let x = as_lt(k, n, sb[r - 2], sb[r - 1], bs(1))?;
        let y = as_lt(m, k, sa[r - 2], sa[r - 1], bs(0))?;
        Some(lt_matmul(device, a, b, out, x, y, (m, n, k), batch, bias))
    }
}
