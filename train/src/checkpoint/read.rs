//! Tensors of a safetensors file on a device: [`ReadTensor::tensor`] decodes what a
//! [`Reader`] (kiln-safetensors: the header validated, the bytes verified) reads.

use kiln_safetensors::{checked_dtype, Checksums, Reader};
use kiln_tensor::{bf16, f16, Backend, DType, Dims, Error, HostData, RawTensor, Result};
use safetensors::tensor::TensorInfo;
use std::path::Path;

/// Reading a file's tensors onto a device.
pub(crate) trait ReadTensor {
    /// Tensor `name` on `device`, read, verified and decoded; a tensor of a file built
    /// into the program is read in place where the backend can
    /// ([`Backend::upload_static`]).
    fn tensor<B: Backend>(
        &self,
        name: &str,
        checksums: Checksums,
        device: &B::Device,
    ) -> Result<RawTensor<B>>;
}

impl ReadTensor for Reader {
    fn tensor<B: Backend>(
        &self,
        name: &str,
        checksums: Checksums,
        device: &B::Device,
    ) -> Result<RawTensor<B>> {
        if let Some(bytes) = self.embedded_bytes(name, checksums) {
            let bytes = bytes?;
            let info = self.info(name).expect("`embedded_bytes` found it");
            let dtype = checked_dtype(self.path(), name, info, bytes)?;
            if let Some(storage) = B::upload_static(device, bytes, dtype) {
                let dims = Dims::new(&info.shape)?;
                return RawTensor::from_storage(storage, dims, device.clone());
            }
            return decode(self.path(), name, info, bytes, device);
        }
        let bytes = self.bytes(name, checksums)?;
        let info = self.info(name).expect("`bytes` found it");
        decode(self.path(), name, info, &bytes, device)
    }
}

/// Decodes `N`-byte little-endian elements; the caller has checked the length.
fn decode_le<const N: usize, T>(bytes: &[u8], f: fn([u8; N]) -> T) -> Vec<T> {
    bytes
        .chunks_exact(N)
        .map(|c| f(c.try_into().expect("chunks_exact yields N bytes")))
        .collect()
}

/// Builds tensor `name` on `device` from its `bytes` as the header `info` describes.
fn decode<B: Backend>(
    path: &Path,
    name: &str,
    info: &TensorInfo,
    bytes: &[u8],
    device: &B::Device,
) -> Result<RawTensor<B>> {
    let bad = |msg: String| Error::Format(format!("`{}`: tensor `{name}` {msg}", path.display()));
    let dtype = checked_dtype(path, name, info, bytes)?;
    let host = match dtype {
        DType::F32 => HostData::F32(decode_le(bytes, f32::from_le_bytes)),
        DType::F64 => HostData::F64(decode_le(bytes, f64::from_le_bytes)),
        DType::F16 => HostData::F16(decode_le(bytes, f16::from_le_bytes)),
        DType::BF16 => HostData::BF16(decode_le(bytes, bf16::from_le_bytes)),
        DType::I32 => HostData::I32(decode_le(bytes, i32::from_le_bytes)),
        DType::U32 => HostData::U32(decode_le(bytes, u32::from_le_bytes)),
        DType::I8 => HostData::I8(decode_le(bytes, i8::from_le_bytes)),
        DType::Bool => {
            if let Some(b) = bytes.iter().find(|&&b| b > 1) {
                return Err(bad(format!(
                    "holds the byte {b}, which is not a bool (0 or 1)"
                )));
            }
            HostData::Bool(bytes.iter().map(|&b| b == 1).collect())
        }
    };
    RawTensor::from_host(host, &info.shape, device)
        .map_err(|e| bad(format!("cannot be built: {e}")))
}
