//! Device buffers: [`CubeStorage`] (a CubeCL handle with its dtype and length), how each
//! dtype is laid out on the device (bool as u32 0/1, i8 as bytes that kernels read four
//! to a u32 word, the rest native), and the host <-> device conversions.

use crate::device::{server_error, DeviceState, KilnRuntime};
use cubecl::server::Handle;
use half::{bf16, f16};
use kiln_tensor::{DType, Error, HostData, Result};
use std::fmt;
use std::sync::Arc;

/// A buffer of elements on a CubeCL device.
pub struct CubeStorage<R: KilnRuntime> {
    pub(crate) handle: Handle,
    pub(crate) dtype: DType,
    pub(crate) len: usize,
    /// Unique per device, increasing with creation (graph captures tell buffers made
    /// before them from their own by it).
    pub(crate) id: u64,
    pub(crate) device: Arc<DeviceState<R>>,
}

impl<R: KilnRuntime> Drop for CubeStorage<R> {
    fn drop(&mut self) {
        if self.device.recorder.is_active() {
            self.device.note_released(self.id);
        }
    }
}

impl<R: KilnRuntime> fmt::Debug for CubeStorage<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CubeStorage<{}>({} × {})", R::NAME, self.len, self.dtype)
    }
}

impl<R: KilnRuntime> CubeStorage<R> {
    /// The CubeCL handle.
    pub fn handle(&self) -> &Handle {
        &self.handle
    }

    /// The dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Bytes per element as stored on the device (bools take a u32).
pub fn device_size(dtype: DType) -> usize {
    match dtype {
        DType::Bool => 4,
        d => d.size_in_bytes(),
    }
}

/// The bytes a buffer of `len` elements of `dtype` takes on the device: i8 buffers are
/// whole u32 words (kernels read them a word at a time: WGSL has no 8-bit type, and
/// CubeCL's CUDA kernels are not trusted with one).
pub fn device_bytes(dtype: DType, len: usize) -> usize {
    match dtype {
        DType::I8 => len.div_ceil(4) * 4,
        d => len * device_size(d),
    }
}

/// Runs `$body` with `$T` bound to the device element type of a dtype.
macro_rules! with_device_type {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            kiln_tensor::DType::F32 => {
                type $T = f32;
                $body
            }
            kiln_tensor::DType::F64 => {
                type $T = f64;
                $body
            }
            kiln_tensor::DType::F16 => {
                type $T = half::f16;
                $body
            }
            kiln_tensor::DType::BF16 => {
                type $T = half::bf16;
                $body
            }
            kiln_tensor::DType::I32 => {
                type $T = i32;
                $body
            }
            kiln_tensor::DType::U32 | kiln_tensor::DType::Bool => {
                type $T = u32;
                $body
            }
            // Generic kernels never see i8: `ops::int8` routes its buffers.
            kiln_tensor::DType::I8 => unreachable!("i8 buffers reach only ops::int8's kernels"),
        }
    };
}
pub(crate) use with_device_type;

/// Runs `$body` with `$F` the storage type and `$A` the compute type of a float dtype
/// (`$other` for any other dtype).
macro_rules! with_float_type {
    ($dtype:expr, $F:ident, $A:ident => $body:expr, $other:expr) => {
        match $dtype {
            kiln_tensor::DType::F32 => {
                type $F = f32;
                type $A = f32;
                $body
            }
            kiln_tensor::DType::F64 => {
                type $F = f64;
                type $A = f64;
                $body
            }
            kiln_tensor::DType::F16 => {
                type $F = half::f16;
                type $A = f32;
                $body
            }
            kiln_tensor::DType::BF16 => {
                type $F = half::bf16;
                type $A = f32;
                $body
            }
            _ => $other,
        }
    };
}
pub(crate) use with_float_type;

/// The device bytes of host values.
pub fn host_to_bytes(data: &HostData) -> Vec<u8> {
    fn le<T: Copy, const N: usize>(v: &[T], f: impl Fn(T) -> [u8; N]) -> Vec<u8> {
        v.iter().flat_map(|x| f(*x)).collect()
    }
    match data {
        HostData::F32(v) => le(v, f32::to_le_bytes),
        HostData::F64(v) => le(v, f64::to_le_bytes),
        HostData::F16(v) => le(v, |x: f16| x.to_bits().to_le_bytes()),
        HostData::BF16(v) => le(v, |x: bf16| x.to_bits().to_le_bytes()),
        HostData::I32(v) => le(v, i32::to_le_bytes),
        HostData::U32(v) => le(v, u32::to_le_bytes),
        HostData::I8(v) => le(v, i8::to_le_bytes),
        HostData::Bool(v) => le(v, |x: bool| (x as u32).to_le_bytes()),
    }
}

/// Host values of `dtype` from the first `len` elements of device bytes.
pub fn bytes_to_host(dtype: DType, bytes: &[u8], len: usize) -> Result<HostData> {
    let size = device_size(dtype);
    if bytes.len() < len * size {
        return Err(Error::Device(format!(
            "a download returned {} bytes for {len} elements of {dtype}",
            bytes.len()
        )));
    }
    let chunks = bytes[..len * size].chunks_exact(size);
    Ok(match dtype {
        DType::F32 => HostData::F32(
            chunks
                .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
                .collect(),
        ),
        DType::F64 => HostData::F64(
            chunks
                .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect(),
        ),
        DType::F16 => HostData::F16(
            chunks
                .map(|c| f16::from_bits(u16::from_le_bytes(c.try_into().expect("2 bytes"))))
                .collect(),
        ),
        DType::BF16 => HostData::BF16(
            chunks
                .map(|c| bf16::from_bits(u16::from_le_bytes(c.try_into().expect("2 bytes"))))
                .collect(),
        ),
        DType::I32 => HostData::I32(
            chunks
                .map(|c| i32::from_le_bytes(c.try_into().expect("4 bytes")))
                .collect(),
        ),
        DType::U32 => HostData::U32(
            chunks
                .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
                .collect(),
        ),
        DType::Bool => HostData::Bool(
            chunks
                .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")) != 0)
                .collect(),
        ),
        DType::I8 => HostData::I8(chunks.map(|c| c[0] as i8).collect()),
    })
}

impl<R: KilnRuntime> DeviceState<R> {
    /// Refuses dtypes this device does not hold.
    pub(crate) fn check_dtype(&self, op: &str, dtype: DType) -> Result<()> {
        if self.dtypes.contains(&dtype) {
            Ok(())
        } else {
            Err(Error::Unsupported {
                op: op.to_string(),
                backend: R::NAME,
                dtype,
            })
        }
    }

    /// A new uninitialised buffer of `len` elements of `dtype`.
    pub(crate) fn alloc(
        self: &Arc<Self>,
        op: &str,
        dtype: DType,
        len: usize,
    ) -> Result<CubeStorage<R>> {
        self.check_dtype(op, dtype)?;
        let bytes = device_bytes(dtype, len) as u64;
        self.check_size(op, bytes)?;
        if len > u32::MAX as usize {
            return Err(Error::invalid(
                "alloc",
                format!("{len} elements exceed the 2^32 elements a kernel can index"),
            ));
        }
        self.check_memory(bytes)?;
        // An empty tensor still gets a (never read) word.
        let handle = self.reserve(bytes)?;
        Ok(self.wrap(handle, dtype, len))
    }

    /// A new buffer holding host values.
    pub(crate) fn upload(self: &Arc<Self>, data: &HostData) -> Result<CubeStorage<R>> {
        let dtype = data.dtype();
        self.check_dtype("upload", dtype)?;
        self.refuse_in_capture("copying host values to the device")?;
        let mut bytes = host_to_bytes(data);
        bytes.resize(device_bytes(dtype, data.len()), 0);
        self.check_size("upload", bytes.len() as u64)?;
        self.check_memory(bytes.len() as u64)?;
        if bytes.is_empty() {
            bytes = vec![0; 4];
        }
        let handle = self.reserve_with(&bytes)?;
        Ok(self.wrap(handle, dtype, data.len()))
    }

    /// The values of a whole contiguous buffer, after every queued kernel finished.
    pub(crate) fn read(&self, s: &CubeStorage<R>) -> Result<HostData> {
        // Errors of earlier launches on this thread come first: their results may be
        // what is being read.
        self.check_pending()?;
        if s.len == 0 {
            return bytes_to_host(s.dtype, &[], 0);
        }
        let bytes = self
            .client
            .read_one(s.handle.clone())
            .map_err(|e| server_error(&self.name, e))?;
        // A fault the driver reported while this was computed makes the values garbage.
        if let Some(error) = R::take_driver_error(self) {
            return Err(error);
        }
        bytes_to_host(s.dtype, &bytes, s.len)
    }
}
