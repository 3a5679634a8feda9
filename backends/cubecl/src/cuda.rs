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

use crate::device::{CubeDevice, DeviceState, KilnRuntime, Opened};
use crate::storage::{device_size, CubeStorage};
use crate::strided::{coalesce, Operand};
use crate::CubeBackend;
use cubecl::cuda::CudaRuntime;
use cubecl::server::Handle;
use cudarc::cublaslt::{result as lt, sys as ltsys};
use cudarc::driver::{result as drv, sys as dsys};
use kiln_tensor::{DType, Error, Result, TensorMeta, View};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// What to install when no CUDA driver or device is found.
pub const INSTALL_HINT: &str = "install the NVIDIA driver (libcuda.so) and a CUDA 13 toolkit or \
     PyTorch's CUDA 13 libraries (NVRTC, cuBLASLt), name their folders in LD_LIBRARY_PATH, and \
     set CUDA_PATH to a CUDA install with include/ and include/cccl";

/// Bytes of cuBLASLt workspace (its heuristics pick faster algorithms with one).
const WORKSPACE: usize = 32 << 20;

static TF32: AtomicBool = AtomicBool::new(false);
static SEARCH: AtomicBool = AtomicBool::new(false);

/// Whether the first product of each shape times cuBLASLt's candidate algorithms and
/// keeps the fastest, or takes its heuristic's first choice (the default). Off by
/// default, like PyTorch's `cudnn.benchmark`: timing noise picks different algorithms
/// in different processes, whose results differ in the last bits, and on the H200 it
/// did not make W1's step faster (BENCHMARKS.md).
pub fn set_algorithm_search(on: bool) {
    SEARCH.store(on, Ordering::SeqCst);
}

/// Whether products search for their fastest algorithm.
pub fn algorithm_search() -> bool {
    SEARCH.load(Ordering::SeqCst)
}

/// One timed algorithm search: the problem, the heuristic's first choice's time and the
/// chosen one's (microseconds), and how many candidates were timed.
#[derive(Clone, Debug)]
pub struct AlgorithmSearch {
    /// The product: dtype, TF32, `m x n x k`, leading dims, transposes, batch, alignments.
    pub problem: String,
    /// The heuristic's first choice, in microseconds.
    pub heuristic_us: f64,
    /// The fastest candidate, in microseconds.
    pub chosen_us: f64,
    /// How many candidates the heuristic offered.
    pub candidates: usize,
}

/// Lets f32 products use TF32 tensor cores (10-bit mantissa inputs, f32 accumulation),
/// as PyTorch's `allow_tf32`. Off by default: f32 products are then exact f32 GEMMs.
pub fn set_allow_tf32(allow: bool) {
    TF32.store(allow, Ordering::SeqCst);
}

/// Whether f32 products may use TF32.
pub fn allow_tf32() -> bool {
    TF32.load(Ordering::SeqCst)
}

/// cuBLASLt state of one device, made on first use.
struct Blas {
    ctx: dsys::CUcontext,
    handle: ltsys::cublasLtHandle_t,
    workspace: dsys::CUdeviceptr,
    /// The stream of the last product: the workspace is in use in its order.
    workspace_stream: dsys::CUstream,
    /// The fastest algorithm per problem: timed among cuBLASLt's heuristic candidates.
    algos: HashMap<String, ltsys::cublasLtMatmulAlgo_t>,
    /// Every timed search so far, in order.
    searches: Vec<AlgorithmSearch>,
}

// SAFETY: the raw handles are only used under the `Mutex` of `CudaExtra`, after making
// the device's context current on the calling thread.
unsafe impl Send for Blas {}

/// The CUDA runtime's per-device state: cuBLASLt, made on first use.
pub struct CudaExtra {
    ordinal: usize,
    blas: Mutex<Option<Blas>>,
    /// The primary context's address, retained on first use outside CubeCL.
    context: std::sync::OnceLock<std::result::Result<usize, String>>,
    /// Products that added a bias in cuBLASLt's epilogue.
    bias_epilogues: std::sync::atomic::AtomicUsize,
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

pub(crate) fn driver_error(what: &str, e: impl std::fmt::Debug) -> Error {
    Error::Device(format!("CUDA {what} failed: {e:?}"))
}

fn blas_error(what: &str, e: lt::CublasError) -> Error {
    Error::Device(format!("cuBLASLt {what} failed: {e:?}"))
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

impl Blas {
    fn new(ordinal: usize) -> Result<Blas> {
        guarded("cuBLASLt", || unsafe {
            let dev =
                drv::device::get(ordinal as i32).map_err(|e| driver_error("cuDeviceGet", e))?;
            let ctx = drv::primary_ctx::retain(dev)
                .map_err(|e| driver_error("cuDevicePrimaryCtxRetain", e))?;
            drv::ctx::set_current(ctx).map_err(|e| driver_error("cuCtxSetCurrent", e))?;
            let handle = lt::create_handle().map_err(|e| blas_error("cublasLtCreate", e))?;
            let workspace =
                drv::malloc_sync(WORKSPACE).map_err(|e| driver_error("cuMemAlloc", e))?;
            Ok(Blas {
                ctx,
                handle,
                workspace,
                workspace_stream: std::ptr::null_mut(),
                algos: HashMap::new(),
                searches: Vec::new(),
            })
        })
    }

    fn make_current(&self) -> Result<()> {
        unsafe { drv::ctx::set_current(self.ctx) }.map_err(|e| driver_error("cuCtxSetCurrent", e))
    }

    /// Makes the workspace safe to use on `stream`: products queued on another stream
    /// (another thread's CubeCL stream) may still use it, so that stream is waited for.
    fn claim_workspace(&mut self, stream: dsys::CUstream) -> Result<()> {
        if !self.workspace_stream.is_null() && self.workspace_stream != stream {
            unsafe { drv::stream::synchronize(self.workspace_stream) }
                .map_err(|e| driver_error("cuStreamSynchronize (cuBLASLt workspace)", e))?;
        }
        self.workspace_stream = stream;
        Ok(())
    }
}

/// One operand of a column-major cuBLASLt call.
struct LtMatrix {
    rows: u64,
    cols: u64,
    ld: i64,
    trans: bool,
    batch_stride: i64,
}

/// A row-major `[rows, cols]` operand with strides `(sr, sc)`, as cuBLASLt sees it in
/// column-major order (the transpose of a row-major matrix is column-major).
fn as_lt(rows: usize, cols: usize, sr: usize, sc: usize, batch_stride: usize) -> Option<LtMatrix> {
    if sc == 1 || cols == 1 && sr != 1 {
        // Row-major: column-major view is the transpose, cols × rows.
        let ld = if rows == 1 { cols } else { sr };
        (ld >= cols.max(1)).then_some(LtMatrix {
            rows: cols as u64,
            cols: rows as u64,
            ld: ld as i64,
            trans: false,
            batch_stride: batch_stride as i64,
        })
    } else if sr == 1 {
        // Column-major: column-major view is the matrix itself, rows × cols.
        let ld = if cols == 1 { rows } else { sc };
        (ld >= rows.max(1)).then_some(LtMatrix {
            rows: rows as u64,
            cols: cols as u64,
            ld: ld as i64,
            trans: true,
            batch_stride: batch_stride as i64,
        })
    } else {
        None
    }
}

/// Makes the device's primary context (the one CubeCL runs in) current on the calling
/// thread, for driver calls made outside CubeCL.
pub(crate) fn make_current(state: &DeviceState<CudaRuntime>) -> Result<()> {
    let ctx = *state
        .extra()
        .context
        .get_or_init(|| unsafe {
            drv::device::get(state.extra().ordinal as i32)
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

/// The largest power of two (at most 256) dividing an address.
fn alignment(ptr: u64) -> u32 {
    ptr.trailing_zeros().min(8)
}

impl KilnRuntime for CudaRuntime {
    const NAME: &'static str = "cuda";
    type Extra = CudaExtra;

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
            Ok(Opened {
                device: cubecl::cuda::CudaDevice::new(ordinal),
                name: format!("{name} (CUDA device {ordinal})"),
                // CubeCL's CUDA memory pages are a quarter of the device memory.
                max_buffer_bytes: total as u64 / 4,
                dtypes: DType::ALL.to_vec(),
                cpu_adapter: false,
                extra: CudaExtra {
                    ordinal,
                    blas: Mutex::new(None),
                    context: std::sync::OnceLock::new(),
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

#[allow(clippy::too_many_arguments)]
fn lt_matmul(
    device: &CubeDevice<CudaRuntime>,
    a: View<'_, CubeBackend<CudaRuntime>>,
    b: View<'_, CubeBackend<CudaRuntime>>,
    out: &TensorMeta,
    x: LtMatrix,
    y: LtMatrix,
    (m, n, k): (usize, usize, usize),
    batch: usize,
    bias: Option<View<'_, CubeBackend<CudaRuntime>>>,
) -> Result<CubeStorage<CudaRuntime>> {
    let dev = &device.state;
    let dtype = out.dtype;
    let (data_type, compute, scale) = match dtype {
        DType::F32 if allow_tf32() => (
            ltsys::cudaDataType::CUDA_R_32F,
            ltsys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
            ltsys::cudaDataType::CUDA_R_32F,
        ),
        DType::F32 => (
            ltsys::cudaDataType::CUDA_R_32F,
            ltsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            ltsys::cudaDataType::CUDA_R_32F,
        ),
        DType::F16 => (
            ltsys::cudaDataType::CUDA_R_16F,
            ltsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            ltsys::cudaDataType::CUDA_R_32F,
        ),
        DType::BF16 => (
            ltsys::cudaDataType::CUDA_R_16BF,
            ltsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            ltsys::cudaDataType::CUDA_R_32F,
        ),
        DType::F64 => (
            ltsys::cudaDataType::CUDA_R_64F,
            ltsys::cublasComputeType_t::CUBLAS_COMPUTE_64F,
            ltsys::cudaDataType::CUDA_R_64F,
        ),
        other => {
            return Err(Error::dtype(
                "matmul",
                format!("multiplies floats, not {other}"),
            ))
        }
    };
    let result = dev.alloc("matmul", dtype, out.dims.iter().product())?;
    let mut guard = dev.extra().blas.lock().expect("cuBLASLt lock");
    if guard.is_none() {
        *guard = Some(Blas::new(dev.extra().ordinal)?);
    }
    let blas = guard.as_mut().expect("made above");
    blas.make_current()?;
    let esize = device_size(dtype) as u64;
    // Asking CubeCL for a buffer's resource orders the buffer on the calling thread's
    // stream (inputs written on another stream are waited for there, on the device).
    let resource = |s: &CubeStorage<CudaRuntime>| -> Result<(u64, dsys::CUstream)> {
        dev.note_bound(s);
        raw_resource(dev, &s.handle)
    };
    let pa = resource(a.storage)?.0 + a.layout.offset() as u64 * esize;
    let pb = resource(b.storage)?.0 + b.layout.offset() as u64 * esize;
    let (pc, stream) = resource(&result)?;
    // The bias row (f32, one value per output column: per row of cuBLASLt's
    // column-major result), added by the product's epilogue.
    let pbias = match bias {
        Some(v) => Some(resource(v.storage)?.0 + v.layout.offset() as u64 * 4),
        None => None,
    };
    blas.claim_workspace(stream)?;
    let key = format!(
        "{dtype}{} {}x{}x{} {} {} {} {} {} {} {} {:?}",
        allow_tf32(),
        m,
        n,
        k,
        x.ld,
        y.ld,
        x.trans,
        y.trans,
        batch,
        alignment(pa).min(alignment(pb)),
        alignment(pc),
        pbias.map(alignment)
    );
    unsafe {
        let desc =
            lt::create_matmul_desc(compute, scale).map_err(|e| blas_error("matmul desc", e))?;
        let set_desc = |attr, v: i32| {
            lt::set_matmul_desc_attribute(desc, attr, &v as *const i32 as *const c_void, 4)
        };
        set_desc(
            ltsys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
            x.trans as i32,
        )
        .map_err(|e| blas_error("TRANSA", e))?;
        set_desc(
            ltsys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB,
            y.trans as i32,
        )
        .map_err(|e| blas_error("TRANSB", e))?;
        if let Some(p) = pbias {
            set_desc(
                ltsys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_EPILOGUE,
                ltsys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS as i32,
            )
            .map_err(|e| blas_error("EPILOGUE", e))?;
            lt::set_matmul_desc_attribute(
                desc,
                ltsys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                &p as *const u64 as *const c_void,
                8,
            )
            .map_err(|e| blas_error("BIAS_POINTER", e))?;
            // One row for every matrix of a batch.
            let batch_stride = 0i64;
            lt::set_matmul_desc_attribute(
                desc,
                ltsys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE,
                &batch_stride as *const i64 as *const c_void,
                8,
            )
            .map_err(|e| blas_error("BIAS_BATCH_STRIDE", e))?;
        }
        let layout = |mx: &LtMatrix| -> Result<ltsys::cublasLtMatrixLayout_t> {
            let l = lt::create_matrix_layout(data_type, mx.rows, mx.cols, mx.ld)
                .map_err(|e| blas_error("matrix layout", e))?;
            if batch > 1 {
                let count = batch as i32;
                lt::set_matrix_layout_attribute(
                    l,
                    ltsys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                    &count as *const i32 as *const c_void,
                    4,
                )
                .map_err(|e| blas_error("batch count", e))?;
                lt::set_matrix_layout_attribute(
                    l,
                    ltsys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                    &mx.batch_stride as *const i64 as *const c_void,
                    8,
                )
                .map_err(|e| blas_error("batch stride", e))?;
            }
            Ok(l)
        };
        let lx = layout(&x)?;
        let ly = layout(&y)?;
        let d = LtMatrix {
            rows: n as u64,
            cols: m as u64,
            ld: n as i64,
            trans: false,
            batch_stride: (m * n) as i64,
        };
        let ld = layout(&d)?;
        let algo = match blas.algos.get(&key) {
            Some(a) => *a,
            None => {
                let pref = lt::create_matmul_pref().map_err(|e| blas_error("preference", e))?;
                let ws = WORKSPACE as u64;
                lt::set_matmul_pref_attribute(
                    pref,
                    ltsys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                    &ws as *const u64 as *const c_void,
                    8,
                )
                .map_err(|e| blas_error("workspace preference", e))?;
                for (attr, p) in [
                    (ltsys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, pb),
                    (ltsys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, pa),
                    (ltsys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, pc),
                    (ltsys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, pc),
                ] {
                    let align: u32 = 1 << alignment(p);
                    lt::set_matmul_pref_attribute(pref, attr, &align as *const u32 as *const c_void, 4)
                        .map_err(|e| blas_error("alignment preference", e))?;
                }
                let mut found =
                    [std::mem::zeroed::<ltsys::cublasLtMatmulHeuristicResult_t>(); CANDIDATES];
                let mut count = 0i32;
                let h = ltsys::cublasLtMatmulAlgoGetHeuristic(
                    blas.handle,
                    desc,
                    lx,
                    ly,
                    ld,
                    ld,
                    pref,
                    CANDIDATES as i32,
                    found.as_mut_ptr(),
                    &mut count,
                )
                .result()
                .map_err(|e| blas_error("heuristic", e));
                let _ = lt::destroy_matmul_pref(pref);
                h?;
                let candidates: Vec<ltsys::cublasLtMatmulAlgo_t> = found
                    [..count.clamp(0, CANDIDATES as i32) as usize]
                    .iter()
                    .map(|r| r.algo)
                    .collect();
                let Some(&first) = candidates.first() else {
                    return Err(blas_error(
                        "heuristic",
                        lt::CublasError(ltsys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED),
                    ));
                };
                // Timing needs a synchronisation, which a graph capture cannot hold:
                // a product first seen there takes the heuristic's choice.
                let algo =
                    if candidates.len() > 1 && algorithm_search() && !dev.capturing_graph_here() {
                        let run = |algo: &ltsys::cublasLtMatmulAlgo_t| {
                            product(
                                blas,
                                desc,
                                (pb, lx),
                                (pa, ly),
                                (pc, ld),
                                dtype,
                                algo,
                                stream,
                            )
                        };
                        let (best, timings) = fastest(&candidates, stream, run)?;
                        blas.searches.push(AlgorithmSearch {
                            problem: key.clone(),
                            heuristic_us: timings[0],
                            chosen_us: timings[best],
                            candidates: candidates.len(),
                        });
                        candidates[best]
                    } else {
                        first
                    };
                blas.algos.insert(key, algo);
                algo
            }
        };
        let status = product(
            blas,
            desc,
            (pb, lx),
            (pa, ly),
            (pc, ld),
            dtype,
            &algo,
            stream,
        );
        let _ = lt::destroy_matrix_layout(lx);
        let _ = lt::destroy_matrix_layout(ly);
        let _ = lt::destroy_matrix_layout(ld);
        let _ = lt::destroy_matmul_desc(desc);
        status.map_err(|e| blas_error("cublasLtMatmul", e))?;
    }
    if pbias.is_some() {
        dev.extra().bias_epilogues.fetch_add(1, Ordering::Relaxed);
    }
    Ok(result)
}

/// How many of cuBLASLt's heuristic candidates the timed search tries.
const CANDIDATES: usize = 8;

/// Launches one product with `algo`: cuBLASLt's column-major `D = first · second`,
/// each operand a device address and its layout.
#[allow(clippy::too_many_arguments)]
unsafe fn product(
    blas: &Blas,
    desc: ltsys::cublasLtMatmulDesc_t,
    (p1, l1): (u64, ltsys::cublasLtMatrixLayout_t),
    (p2, l2): (u64, ltsys::cublasLtMatrixLayout_t),
    (pc, ld): (u64, ltsys::cublasLtMatrixLayout_t),
    dtype: DType,
    algo: &ltsys::cublasLtMatmulAlgo_t,
    stream: dsys::CUstream,
) -> std::result::Result<(), lt::CublasError> {
    let (one32, zero32, one64, zero64) = (1f32, 0f32, 1f64, 0f64);
    let (alpha, beta): (*const c_void, *const c_void) = if dtype == DType::F64 {
        (&one64 as *const f64 as _, &zero64 as *const f64 as _)
    } else {
        (&one32 as *const f32 as _, &zero32 as *const f32 as _)
    };
    lt::matmul(
        blas.handle,
        desc,
        alpha,
        beta,
        p1 as *const c_void,
        l1,
        p2 as *const c_void,
        l2,
        pc as *const c_void,
        ld,
        pc as *mut c_void,
        ld,
        algo,
        blas.workspace as *mut c_void,
        WORKSPACE,
        stream as ltsys::cudaStream_t,
    )
}

/// The candidate that runs fastest on `stream` (median of three timed runs after a
/// warm one; a candidate that fails to launch is skipped) and every candidate's time
/// in microseconds (`f64::INFINITY` for those skipped).
fn fastest<T>(
    candidates: &[T],
    stream: dsys::CUstream,
    mut run: impl FnMut(&T) -> std::result::Result<(), lt::CublasError>,
) -> Result<(usize, Vec<f64>)> {
    let event = || {
        drv::event::create(dsys::CUevent_flags::CU_EVENT_DEFAULT)
            .map_err(|e| driver_error("cuEventCreate", e))
    };
    let (start, end) = (event()?, event()?);
    let mut times = Vec::with_capacity(candidates.len());
    let timed =
        |run: &mut dyn FnMut() -> std::result::Result<(), lt::CublasError>| -> Result<Option<f64>> {
            if run().is_err() {
                return Ok(None);
            }
            let mut reps = [0f64; 3];
            for r in &mut reps {
                unsafe {
                    drv::event::record(start, stream)
                        .map_err(|e| driver_error("cuEventRecord", e))?;
                    if run().is_err() {
                        return Ok(None);
                    }
                    drv::event::record(end, stream)
                        .map_err(|e| driver_error("cuEventRecord", e))?;
                    drv::event::synchronize(end)
                        .map_err(|e| driver_error("cuEventSynchronize", e))?;
                    *r = drv::event::elapsed(start, end)
                        .map_err(|e| driver_error("cuEventElapsedTime", e))?
                        as f64
                        * 1e3;
                }
            }
            reps.sort_by(f64::total_cmp);
            Ok(Some(reps[1]))
        };
    for c in candidates {
        let t = timed(&mut || run(c));
        times.push(t.map(|t| t.unwrap_or(f64::INFINITY)));
    }
    unsafe {
        let _ = drv::event::destroy(start);
        let _ = drv::event::destroy(end);
    }
    let times = times.into_iter().collect::<Result<Vec<f64>>>()?;
    let best = (0..times.len())
        .min_by(|&a, &b| times[a].total_cmp(&times[b]))
        .unwrap_or(0);
    Ok((best, times))
}

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
