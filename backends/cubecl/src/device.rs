//! Devices: the [`KilnRuntime`] trait that adapts a CubeCL runtime to Kiln (how a device
//! is opened, what it cannot do, which dtypes it holds), the per-device state every
//! buffer points back to, and the per-launch error flags through which kernels report
//! bad indices and integer division by zero.

use crate::storage::CubeStorage;
use cubecl::prelude::*;
use cubecl::server::Handle;
use kiln_tensor::{DType, Error, Result, TensorMeta, View};
use std::fmt;
use std::sync::{Arc, Mutex};

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
    /// Runtime-specific state (cuBLASLt on CUDA).
    pub extra: R::Extra,
}

/// A CubeCL runtime Kiln can run on: wgpu (Vulkan, Metal, DX12) or CUDA.
pub trait KilnRuntime: Runtime + Sized {
    /// The backend's name in messages (`wgpu`, `cuda`).
    const NAME: &'static str;
    /// State a device of this runtime keeps beside CubeCL's client.
    type Extra: Send + Sync + 'static;

    /// Opens device `ordinal`, or says what is missing (driver, adapter).
    fn open(ordinal: usize) -> Result<Opened<Self>>;

    /// The devices opened so far, so that each is opened once per process.
    fn registry() -> &'static Mutex<Vec<(usize, CubeDevice<Self>)>>;

    /// A matrix product the runtime runs through a vendor library, or `None` to use
    /// Kiln's own kernel.
    fn vendor_matmul(
        _device: &CubeDevice<Self>,
        _a: View<'_, CubeBackend<Self>>,
        _b: View<'_, CubeBackend<Self>>,
        _out: &TensorMeta,
    ) -> Option<Result<CubeStorage<Self>>> {
        None
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
}

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
    /// the error code and a detail (the bad index's bits).
    pub(crate) fn new_flag(&self) -> Handle {
        self.client.create_from_slice(&[0u8; 8])
    }

    /// Reads the error flag of a launch that may fail, once it ran: `None` when the
    /// kernel reported nothing, else its code and detail.
    ///
    /// Each launch gets its own flag and the op reads it before it returns, so an
    /// error is reported by the op that caused it, on the thread that ran it (a
    /// device-wide flag read later would be reported by whichever op synchronised
    /// next, on any thread). The cost is one synchronisation per gather, scatter-add
    /// or integer division.
    pub(crate) fn read_flag(&self, flag: Handle) -> Result<Option<(u32, u32)>> {
        let bytes = self
            .client
            .read_one(flag)
            .map_err(|e| server_error(&self.name, e))?;
        let word = |i: usize| {
            u32::from_le_bytes([
                bytes[4 * i],
                bytes[4 * i + 1],
                bytes[4 * i + 2],
                bytes[4 * i + 3],
            ])
        };
        Ok((word(0) != 0).then(|| (word(0), word(1))))
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

    /// The shared state (client, limits).
    pub fn state(&self) -> &Arc<DeviceState<R>> {
        &self.state
    }
}
