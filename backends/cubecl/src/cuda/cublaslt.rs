//! Matrix products through cuBLASLt: each device's cuBLASLt state ([`Blas`]: handle,
//! workspace, the algorithm kept per problem), a tensor product posed as cuBLASLt's
//! column-major problem ([`as_lt`], [`lt_matmul`]: operands, dtypes, the bias
//! epilogue), choosing its algorithm ([`choose_algorithm`]; the timed search is in
//! [`super::algo`]) and the launch ([`product`]).

use super::algo::{algorithm_search, fastest, AlgorithmSearch, CANDIDATES};
use super::guarded;
use super::tf32::allow_tf32;
use crate::device::{CubeDevice, DeviceState};
use crate::driver::{driver_error, raw_resource};
use crate::storage::{device_size, CubeStorage};
use crate::CubeBackend;
use cubecl::cuda::CudaRuntime;
use cudarc::cublaslt::{result as lt, sys as ltsys};
use cudarc::driver::{result as drv, sys as dsys};
use kiln_tensor::{DType, Error, Result, TensorMeta, View};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::Ordering;

/// Bytes of cuBLASLt workspace (its heuristics pick faster algorithms with one).
const WORKSPACE: usize = 32 << 20;

/// cuBLASLt state of one device, made on first use.
pub(super) struct Blas {
    ctx: dsys::CUcontext,
    handle: ltsys::cublasLtHandle_t,
    workspace: dsys::CUdeviceptr,
    /// The stream of the last product: the workspace is in use in its order.
    workspace_stream: dsys::CUstream,
    /// The fastest algorithm per problem: timed among cuBLASLt's heuristic candidates.
    algos: HashMap<String, ltsys::cublasLtMatmulAlgo_t>,
    /// Every timed search so far, in order.
    pub(super) searches: Vec<AlgorithmSearch>,
}

// SAFETY: the raw handles are only used under the `Mutex` of `CudaExtra`, after making
// the device's context current on the calling thread.
unsafe impl Send for Blas {}

fn blas_error(what: &str, e: lt::CublasError) -> Error {
    Error::Device(format!("cuBLASLt {what} failed: {e:?}"))
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
pub(super) struct LtMatrix {
    rows: u64,
    cols: u64,
    ld: i64,
    trans: bool,
    batch_stride: i64,
}

/// A row-major `[rows, cols]` operand with strides `(sr, sc)`, as cuBLASLt sees it in
/// column-major order (the transpose of a row-major matrix is column-major).
pub(super) fn as_lt(
    rows: usize,
    cols: usize,
    sr: usize,
    sc: usize,
    batch_stride: usize,
) -> Option<LtMatrix> {
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

/// The largest power of two (at most 256) dividing an address.
fn alignment(ptr: u64) -> u32 {
    ptr.trailing_zeros().min(8)
}

#[allow(clippy::too_many_arguments)]
pub(super) fn lt_matmul(
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
        let algo = choose_algorithm(
            blas,
            dev,
            key,
            desc,
            (pb, lx),
            (pa, ly),
            (pc, ld),
            dtype,
            stream,
        )?;
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

/// The algorithm for the problem `key` names: the one kept for it, else cuBLASLt's
/// heuristic's first choice or, with [`algorithm_search`] on (and outside a graph
/// capture), the fastest of its candidates, kept for the problem's next product.
///
/// Unsafe: `desc` and the layouts must be live cuBLASLt objects, and the addresses
/// device buffers ordered on `stream`, as in [`lt_matmul`].
#[allow(clippy::too_many_arguments)]
unsafe fn choose_algorithm(
    blas: &mut Blas,
    dev: &DeviceState<CudaRuntime>,
    key: String,
    desc: ltsys::cublasLtMatmulDesc_t,
    (pb, lx): (u64, ltsys::cublasLtMatrixLayout_t),
    (pa, ly): (u64, ltsys::cublasLtMatrixLayout_t),
    (pc, ld): (u64, ltsys::cublasLtMatrixLayout_t),
    dtype: DType,
    stream: dsys::CUstream,
) -> Result<ltsys::cublasLtMatmulAlgo_t> {
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
            let algo = if candidates.len() > 1 && algorithm_search() && !dev.capturing_graph_here()
            {
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
    Ok(algo)
}

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
