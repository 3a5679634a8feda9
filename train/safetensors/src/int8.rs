//! The int8 checkpoint format's rules, in one place: `kiln-quantize` writes files by
//! them, and kiln-train's `checkpoint::int8::read_int8`, every load into an int8
//! instance (from a file or from `kiln::embed!`'s bytes) and `kiln::embed!` at build
//! time check a file by [`check_int8`].
//!
//! An int8 checkpoint says `kiln.quantization = int8-per-row` in its metadata (any
//! other label is refused, naming it: a file of another quantisation is not read as
//! int8). Each int8 tensor is a matrix beside `<name>_scale`, one finite,
//! non-negative f32 scale per row, and its values lie in −127..=127 (the symmetric
//! rule never gives −128). Every float tensor it keeps (biases, normalisation
//! parameters, convolutions) is finite: an instance for inference answers NaN for
//! every input after one NaN bias. Its other tensors are as the model holds them.

use crate::{
    from_st_dtype, Checksums, Reader, BATCH_NORM_COUNTER, INT8_PER_ROW, QUANTIZATION_KEY,
    SCALE_SUFFIX,
};
use kiln_tensor::{Error, Result};
use safetensors::Dtype;

/// `text` from a file as it may be shown: control characters, line breaks and
/// terminal escapes escaped, so a hostile file cannot write to the terminal.
pub fn shown(text: &str) -> String {
    text.escape_debug().to_string()
}

/// The file's quantisation label, refused unless it is [`INT8_PER_ROW`] (a file
/// without one is not quantised).
pub fn check_int8_label(file: &Reader) -> Result<()> {
    let bad = |why: String| Error::Format(format!("`{}`: {why}", file.path().display()));
    match file.metadata().get(QUANTIZATION_KEY).map(String::as_str) {
        Some(INT8_PER_ROW) => Ok(()),
        Some(other) => Err(bad(format!(
            "its quantisation is `{}`, not `{INT8_PER_ROW}`, the one this Kiln reads: it cannot be read as int8",
            shown(other)
        ))),
        None => Err(bad(
            "it is not quantised (kiln-quantize writes int8 checkpoints)".into(),
        )),
    }
}

/// Checks `file` by the int8 format's rules (the module's): its label, each int8
/// matrix's scales and values, and every float tensor finite; each tensor's bytes are
/// verified against its checksum as `checksums` asks. An error names the file, the
/// tensor and the value.
pub fn check_int8(file: &Reader, checksums: Checksums) -> Result<()> {
    check_int8_label(file)?;
    let bad = |why: String| Error::Format(format!("`{}`: {why}", file.path().display()));
    for name in file.names() {
        let Some(info) = file.info(&name) else {
            continue;
        };
        let shape = info.shape.clone();
        let named = shown(&name);
        match info.dtype {
            Dtype::I8 => {
                let [rows, cols] = shape[..] else {
                    return Err(bad(format!(
                        "int8 tensor `{named}` has dims {shape:?}, not a matrix's"
                    )));
                };
                let scale_name = format!("{name}{SCALE_SUFFIX}");
                let scales = match file.info(&scale_name) {
                    Some(s) if s.dtype == Dtype::F32 && s.shape == [rows] => {
                        f32s(&bytes(file, &scale_name, checksums)?)
                    }
                    Some(s) => {
                        return Err(bad(format!(
                            "`{}` is {:?} {:?}, not {rows} f32 scales for `{named}`",
                            shown(&scale_name),
                            s.shape,
                            s.dtype
                        )))
                    }
                    None => {
                        return Err(bad(format!(
                            "int8 tensor `{named}` has no `{}`",
                            shown(&scale_name)
                        )))
                    }
                };
                if let Some(r) = scales.iter().position(|s| !s.is_finite() || *s < 0.0) {
                    return Err(bad(format!(
                        "`{named}`: row {r}'s scale is {}, not a finite scale of 0 or more",
                        scales[r]
                    )));
                }
                // −128 has no counterpart +128: the symmetric rule never writes it,
                // and the int8 kernels assume −127..=127.
                let values = bytes(file, &name, checksums)?;
                if let Some(i) = values.iter().position(|&q| q as i8 == i8::MIN) {
                    let cols = cols.max(1);
                    return Err(bad(format!(
                        "`{named}`: value [{}, {}] is -128, outside a symmetric scale's -127..=127",
                        i / cols,
                        i % cols
                    )));
                }
            }
            Dtype::F32 | Dtype::F64 | Dtype::F16 | Dtype::BF16 => {
                let values = bytes(file, &name, checksums)?;
                if let Some((i, v)) = first_non_finite(info.dtype, &values) {
                    return Err(bad(format!(
                        "tensor `{named}` holds {v} at element {i}: an int8 checkpoint's values are finite"
                    )));
                }
            }
            // PyTorch's batch-norm counters, as any checkpoint may hold them.
            Dtype::I64 if name.ends_with(BATCH_NORM_COUNTER) => {}
            other if from_st_dtype(other).is_none() => {
                return Err(bad(format!(
                    "tensor `{named}` is {other:?}, a dtype Kiln does not hold"
                )))
            }
            // Integers and bools are kept as the model holds them (an imported
            // model's indices); they have no values to rule out.
            _ => {}
        }
    }
    Ok(())
}

/// Tensor `name`'s bytes, verified, in place when the file is built into the program.
fn bytes(file: &Reader, name: &str, checksums: Checksums) -> Result<Vec<u8>> {
    match file.embedded_bytes(name, checksums) {
        Some(b) => b.map(<[u8]>::to_vec),
        None => file.bytes(name, checksums),
    }
}

/// Little-endian f32s.
fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// The first element of `bytes` (little-endian `dtype`, a float) that is NaN or
/// infinite, with its index.
fn first_non_finite(dtype: Dtype, bytes: &[u8]) -> Option<(usize, f64)> {
    let values: Box<dyn Iterator<Item = f64>> = match dtype {
        Dtype::F32 => Box::new(f32s(bytes).into_iter().map(f64::from)),
        Dtype::F64 => Box::new(
            bytes
                .chunks_exact(8)
                .map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes"))),
        ),
        Dtype::F16 => Box::new(
            bytes
                .chunks_exact(2)
                .map(|b| kiln_tensor::f16::from_le_bytes([b[0], b[1]]).to_f64()),
        ),
        Dtype::BF16 => Box::new(
            bytes
                .chunks_exact(2)
                .map(|b| kiln_tensor::bf16::from_le_bytes([b[0], b[1]]).to_f64()),
        ),
        _ => return None,
    };
    values.enumerate().find(|(_, v)| !v.is_finite())
}
