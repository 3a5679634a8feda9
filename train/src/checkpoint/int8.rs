//! Int8 checkpoints: weight-only quantisation of an f32 checkpoint. Each tensor
//! `kiln_safetensors::int8_quantizes` picks (an f32 matrix named `weight` or `*.weight`:
//! a linear layer's `[out, in]`, an embedding's table; one in f64, f16 or bf16 is read
//! as f32 first) is stored as int8 values of the same dims beside `*.weight_scale`, one
//! f32 scale per row (per output channel; `kiln_cpu::quant::Int8Matrix`'s symmetric
//! rule); every other tensor is kept as it is. The format's rules live in
//! `kiln_safetensors::check_int8`, which reading a file here and loading one into an
//! int8 instance both apply. The file carries `kiln.quantization = int8-per-row`
//! and a checksum for every tensor, as any checkpoint Kiln writes.

use super::{check_not_input, check_output, write_file, Encoded};
use crate::state::is_training_state;
use kiln_cpu::quant::Int8Matrix;
use kiln_safetensors::{check_int8, int8_quantizes, shown, st_dtype_name, Checksums, Reader};
use kiln_tensor::{bf16, f16, DType, Error, Result};
use safetensors::Dtype;
use std::collections::BTreeMap;
use std::path::Path;

pub use kiln_safetensors::{INT8_PER_ROW, QUANTIZATION_KEY, SCALE_SUFFIX};

/// What [`quantize_int8`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuantizeReport {
    /// The weights stored as int8, with their scales.
    pub quantized: Vec<String>,
    /// The tensors kept as they were.
    pub kept: Vec<String>,
    /// The input file's tensor bytes.
    pub bytes_before: usize,
    /// The output file's tensor bytes.
    pub bytes_after: usize,
}

/// Writes `output`, the int8 checkpoint of the f32 checkpoint `input` (which Kiln
/// wrote: its checksums are verified). Refused, naming the file or the tensor: an
/// `output` that is `input` (symbolic and hard links followed) or a special file (a
/// device, a FIFO, a folder), a file already quantised, a training state (its
/// optimizer moments are no weights: quantise the checkpoint), a weight whose scale
/// name is taken, and a weight of a dtype that has no int8 form (integers, bools). A
/// weight in f64, f16 or bf16 is quantised from its values as f32.
pub fn quantize_int8(input: &Path, output: &Path) -> Result<QuantizeReport> {
    quantize_int8_from(input, output, Checksums::Required)
}

/// [`quantize_int8`] of a file another tool wrote (PyTorch's `save_file`), which has no
/// checksums to verify (those it has are verified); the output has Kiln's.
pub fn quantize_int8_foreign(input: &Path, output: &Path) -> Result<QuantizeReport> {
    quantize_int8_from(input, output, Checksums::IfPresent)
}

fn quantize_int8_from(input: &Path, output: &Path, checksums: Checksums) -> Result<QuantizeReport> {
    // Both before any reading: the atomic rename would replace the input (through a
    // link to it) or a device node with the int8 file.
    check_not_input("int8 checkpoint", output, input)?;
    check_output("int8 checkpoint", output)?;
    let file = Reader::open(input)?;
    file.require(checksums)?;
    if let Some(q) = file.metadata().get(QUANTIZATION_KEY) {
        return Err(Error::invalid(
            "quantize",
            format!("`{}` is quantised already ({})", input.display(), shown(q)),
        ));
    }
    if is_training_state(file.metadata()) {
        return Err(Error::invalid(
            "quantize",
            format!(
                "`{}` is a training state (the model with its optimizer's moments and step counts), not a checkpoint: pass the checkpoint the run wrote (kiln-train's --out)",
                input.display()
            ),
        ));
    }
    let names = file.names();
    let mut report = QuantizeReport {
        quantized: Vec::new(),
        kept: Vec::new(),
        bytes_before: 0,
        bytes_after: 0,
    };
    let mut entries = Vec::new();
    for name in &names {
        let Some(info) = file.info(name) else {
            continue;
        };
        let (dtype, shape) = (info.dtype, info.shape.clone());
        let bytes = file.bytes(name, checksums)?;
        report.bytes_before += bytes.len();
        // What an int8 instance holds as int8: a matrix named like a weight, which
        // must then be read as f32 values or refused, never kept as it is.
        if !int8_quantizes(name, &shape, Some(DType::F32)) {
            report.kept.push(name.clone());
            entries.push((name.clone(), Encoded::raw(dtype, shape, bytes)));
            continue;
        }
        let values = float_values(dtype, &bytes).ok_or_else(|| {
            Error::invalid(
                "quantize",
                format!(
                    "`{}` in `{}` is a weight of dtype {}, which has no int8 form: int8 weights are quantised from floats (f32, f64, f16, bf16)",
                    shown(name),
                    input.display(),
                    st_dtype_name(dtype)
                ),
            )
        })?;
        let scale_name = format!("{name}{SCALE_SUFFIX}");
        if names.contains(&scale_name) {
            return Err(Error::invalid(
                "quantize",
                format!(
                    "`{}` holds `{}` already, the name `{}`'s scales would take",
                    input.display(),
                    shown(&scale_name),
                    shown(name)
                ),
            ));
        }
        let m = Int8Matrix::quantize(&values, shape[0], shape[1])
            .map_err(|e| Error::invalid("quantize", format!("`{}`: {e}", shown(name))))?;
        let q: Vec<u8> = (0..m.rows())
            .flat_map(|r| m.row(r).iter().map(|&v| v as u8))
            .collect();
        let s: Vec<u8> = m.scales().iter().flat_map(|v| v.to_le_bytes()).collect();
        report.quantized.push(name.clone());
        entries.push((name.clone(), Encoded::raw(Dtype::I8, shape.clone(), q)));
        entries.push((scale_name, Encoded::raw(Dtype::F32, vec![shape[0]], s)));
    }
    report.bytes_after = entries.iter().map(|(_, e)| e.len()).sum();
    let mut metadata: BTreeMap<String, String> = file
        .metadata()
        .iter()
        .filter(|(k, _)| !k.starts_with(super::RESERVED_KEY))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    metadata.insert(QUANTIZATION_KEY.into(), INT8_PER_ROW.into());
    write_file(output, entries, &metadata)?;
    Ok(report)
}

/// A float tensor's little-endian `bytes` of file dtype `dtype` as f32 values (f64
/// rounded to nearest, f16 and bf16 exactly); `None` for a dtype that is no float.
fn float_values(dtype: Dtype, bytes: &[u8]) -> Option<Vec<f32>> {
    Some(match dtype {
        Dtype::F32 => f32s(bytes),
        Dtype::F64 => bytes
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes(b.try_into().expect("chunks of 8")) as f32)
            .collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        _ => return None,
    })
}

/// The quantisation of the checkpoint at `path` (`Some("int8-per-row")`), `None` for
/// an f32 checkpoint; reads the header only.
pub fn quantization(path: &Path) -> Result<Option<String>> {
    Ok(Reader::open(path)?
        .metadata()
        .get(QUANTIZATION_KEY)
        .cloned())
}

/// An int8 checkpoint read back: its quantised weights and its f32 tensors.
#[derive(Clone, Debug)]
pub struct Int8Checkpoint {
    /// Each quantised weight by name (`fc1.weight`).
    pub weights: BTreeMap<String, Int8Matrix>,
    /// Each other f32 tensor by name: its dims and values.
    pub tensors: BTreeMap<String, (Vec<usize>, Vec<f32>)>,
}

impl Int8Checkpoint {
    /// The quantised weight `name`, or an error naming it.
    pub fn weight(&self, name: &str) -> Result<&Int8Matrix> {
        self.weights
            .get(name)
            .ok_or_else(|| Error::invalid("int8 checkpoint", format!("no int8 weight `{name}`")))
    }

    /// The f32 tensor `name`'s values, or an error naming it.
    pub fn values(&self, name: &str) -> Result<&[f32]> {
        self.tensors
            .get(name)
            .map(|(_, v)| v.as_slice())
            .ok_or_else(|| Error::invalid("int8 checkpoint", format!("no f32 tensor `{name}`")))
    }
}

/// Reads an int8 checkpoint [`quantize_int8`] wrote, every tensor checked against its
/// checksum and the file by the int8 format's rules (`kiln_safetensors::check_int8`,
/// which every load into an int8 instance applies too: its label, one finite,
/// non-negative scale per row, values in −127..=127, finite f32 tensors). Its tensors
/// besides the int8 weights must be f32, which [`Int8Checkpoint`] holds.
pub fn read_int8(path: &Path) -> Result<Int8Checkpoint> {
    read_from(&Reader::open(path)?, path)
}

fn read_from(file: &Reader, path: &Path) -> Result<Int8Checkpoint> {
    file.require(Checksums::Required)?;
    check_int8(file, Checksums::Required)?;
    let bad = |why: String| Error::Format(format!("`{}`: {why}", path.display()));
    let mut out = Int8Checkpoint {
        weights: BTreeMap::new(),
        tensors: BTreeMap::new(),
    };
    for name in &file.names() {
        let Some(info) = file.info(name) else {
            continue;
        };
        let shape = info.shape.clone();
        match info.dtype {
            Dtype::I8 => {
                // `check_int8` found a matrix with its scales.
                let (rows, cols) = (shape[0], shape[1]);
                let scales =
                    f32s(&file.bytes(&format!("{name}{SCALE_SUFFIX}"), Checksums::Required)?);
                let q: Vec<i8> = file
                    .bytes(name, Checksums::Required)?
                    .into_iter()
                    .map(|b| b as i8)
                    .collect();
                let m = Int8Matrix::from_parts(rows, cols, &q, &scales)
                    .map_err(|e| bad(format!("`{}`: {e}", shown(name))))?;
                out.weights.insert(name.clone(), m);
            }
            Dtype::F32 => {
                if name
                    .strip_suffix(SCALE_SUFFIX)
                    .is_some_and(|w| file.info(w).is_some_and(|i| i.dtype == Dtype::I8))
                {
                    continue;
                }
                let values = f32s(&file.bytes(name, Checksums::Required)?);
                out.tensors.insert(name.clone(), (shape, values));
            }
            other => {
                return Err(bad(format!(
                    "tensor `{}` is {other:?}; `read_int8` reads int8 weights and f32 tensors",
                    shown(name)
                )))
            }
        }
    }
    Ok(out)
}

/// Little-endian f32s.
fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}
