//! Collectives between CUDA ranks through NCCL, NVIDIA's library (what PyTorch's DDP
//! uses), loaded at run time through cudarc like cuBLASLt: one process per GPU, each an
//! [`NcclRank`], meeting through an [`NcclId`] that rank 0 makes and passes to the
//! others (kiln-train's launcher passes it in its rendezvous folder).
//!
//! Exchanges are queued on the CUDA stream CubeCL's kernels run on, so they are ordered
//! after the backward pass's kernels and before the optimizer's, with no host
//! synchronisation: a step's gradients are averaged as one NCCL group per bucket.

use crate::cuda::{make_current, raw_resource};
use crate::storage::device_size;
use crate::{Cuda, CudaDevice};
use cudarc::nccl::{result as nc, sys as ncsys};
use kiln_tensor::{Collective, DType, Error, RawTensor, Result};
use std::ffi::c_void;
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
    comm: ncsys::ncclComm_t,
    rank: usize,
    world: usize,
    device: CudaDevice,
}

// SAFETY: the communicator is used by one thread at a time (`&self` calls are made by
// the rank's training loop), after making its device's context current.
unsafe impl Send for NcclRank {}

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
    /// most `timeout` for every rank to join (NCCL itself would wait forever).
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
        Ok(NcclRank {
            comm,
            rank,
            world,
            device: device.clone(),
        })
    }

    /// An error if NCCL found one in the group since the last call (a peer that
    /// failed), so that this rank stops instead of queueing work that never ends.
    fn check(&self, op: &str) -> Result<()> {
        let mut status = ncsys::ncclResult_t::ncclSuccess;
        // SAFETY: a live communicator; `status` is written by NCCL.
        let r = unsafe { ncsys::ncclCommGetAsyncError(self.comm, &mut status) };
        r.result().map_err(|e| nccl_error(op, e, Some(self.comm)))?;
        status
            .result()
            .map(|_| ())
            .map_err(|e| nccl_error(op, e, Some(self.comm)))
    }

    /// Runs `each` for every tensor (made contiguous, on this rank's device), as one
    /// NCCL group, with its input and output addresses, length, NCCL dtype and the
    /// stream; returns the outputs.
    fn grouped(
        &self,
        op: &'static str,
        tensors: &[RawTensor<Cuda>],
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
        nc::group_start().map_err(|e| nccl_error("ncclGroupStart", e, Some(self.comm)))?;
        let mut queued = Ok(());
        for ((t, dtype), out) in inputs.iter().zip(&outputs) {
            let esize = device_size(t.dtype()) as u64;
            let (src, _) = raw_resource(dev, &t.storage().handle)?;
            let src = src + t.layout().offset() as u64 * esize;
            let (dst, stream) = raw_resource(dev, &out.handle)?;
            if let Err(e) = each(
                src as *const c_void,
                dst as *mut c_void,
                t.numel(),
                *dtype,
                stream as _,
            ) {
                queued = Err(nccl_error(op, e, Some(self.comm)));
                break;
            }
        }
        let ended = nc::group_end().map_err(|e| nccl_error("ncclGroupEnd", e, Some(self.comm)));
        queued?;
        ended?;
        inputs
            .iter()
            .zip(outputs)
            .map(|((t, _), out)| RawTensor::from_storage(out, *t.dims(), self.device.clone()))
            .collect()
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
        let comm = self.comm;
        self.grouped(
            "all_reduce_mean",
            tensors,
            &|src, dst, n, dtype, stream| unsafe {
                // SAFETY: `src` and `dst` hold `n` elements on this rank's device, ordered
                // on `stream`; the buffers outlive the call (held by `grouped`'s caller).
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

    fn broadcast(&self, tensors: &[RawTensor<Cuda>], root: usize) -> Result<Vec<RawTensor<Cuda>>> {
        if root >= self.world {
            return Err(Error::invalid(
                "broadcast",
                format!("root {root} is not a rank of {}", self.world),
            ));
        }
        let comm = self.comm;
        self.grouped("broadcast", tensors, &|src, dst, n, dtype, stream| unsafe {
            // SAFETY: as in `all_reduce_mean`.
            nc::broadcast(src, dst, n, dtype, root as i32, comm, stream)
        })
    }
}

impl Drop for NcclRank {
    fn drop(&mut self) {
        // Queued exchanges finish first (a stream sync), then the communicator goes.
        let _ = make_current(&self.device.state);
        let failed = self.check("ncclCommDestroy").is_err();
        // SAFETY: the communicator is not used after this.
        unsafe {
            if failed {
                let _ = nc::comm_abort(self.comm);
            } else {
                let _ = nc::comm_destroy(self.comm);
            }
        }
    }
}
