//! Int8 checkpoints: weight-only quantisation of an f32 checkpoint. Each tensor
//! `kiln_safetensors::int8_quantizes` picks (an f32 matrix named `weight` or `*.weight`:
//! a linear layer's `[out, in]`, an embedding's table) is stored as int8 values of the same dims beside `*.weight_scale`, one f32 scale per
//! row (per output channel; `kiln_cpu::quant::Int8Matrix`'s symmetric rule); every
//! other tensor is kept as it is. The file carries `kiln.quantization = int8-per-row`
//! and a checksum for every tensor, as any checkpoint Kiln writes.

use super::{write_file, Encoded};
use kiln_cpu::quant::Int8Matrix;
use kiln_safetensors::{from_st_dtype, int8_quantizes, Checksums, Reader};
use kiln_tensor::{Error, Result};
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
/// wrote: its checksums are verified). A file already quantised, or one whose
/// quantised weights' scale names are taken, is refused.
pub fn quantize_int8(input: &Path, output: &Path) -> Result<QuantizeReport> {
    quantize_int8_from(input, output, Checksums::Required)
}

/// [`quantize_int8`] of a file another tool wrote (PyTorch's `save_file`), which has no
/// checksums to verify (those it has are verified); the output has Kiln's.
pub fn quantize_int8_foreign(input: &Path, output: &Path) -> Result<QuantizeReport> {
    quantize_int8_from(input, output, Checksums::IfPresent)
}

fn quantize_int8_from(input: &Path, output: &Path, checksums: Checksums) -> Result<QuantizeReport> {
    let file = Reader::open(input)?;
    file.require(checksums)?;
    if let Some(q) = file.metadata().get(QUANTIZATION_KEY) {
        return Err(Error::invalid(
            "quantize",
            format!("`{}` is quantised already ({q})", input.display()),
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
        let info = file.info(name).expect("a name the file listed");
        let (dtype, shape) = (info.dtype, info.shape.clone());
        let bytes = file.bytes(name, checksums)?;
        report.bytes_before += bytes.len();
        if !int8_quantizes(name, &shape, from_st_dtype(dtype)) {
            report.kept.push(name.clone());
            entries.push((name.clone(), Encoded::raw(dtype, shape, bytes)));
            continue;
        }
        let scale_name = format!("{name}{SCALE_SUFFIX}");
        if names.contains(&scale_name) {
            return Err(Error::invalid(
                "quantize",
                format!(
                    "`{}` holds `{scale_name}` already, the name `{name}`'s scales would take",
                    input.display()
                ),
            ));
        }
        let values: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let m = Int8Matrix::quantize(&values, shape[0], shape[1])
            .map_err(|e| Error::invalid("quantize", format!("`{name}`: {e}")))?;
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
/// checksum and every weight against its scales (one finite, non-negative scale per
/// row; values in −127..=127).
pub fn read_int8(path: &Path) -> Result<Int8Checkpoint> {
    read_from(&Reader::open(path)?, path)
}

fn read_from(file: &Reader, path: &Path) -> Result<Int8Checkpoint> {
    file.require(Checksums::Required)?;
    let bad = |why: String| Error::Format(format!("`{}`: {why}", path.display()));
    match file.metadata().get(QUANTIZATION_KEY).map(String::as_str) {
        Some(INT8_PER_ROW) => {}
        Some(other) => {
            return Err(bad(format!(
                "its quantisation is `{other}`, not `{INT8_PER_ROW}`"
            )))
        }
        None => {
            return Err(bad(
                "it is not quantised (kiln-quantize writes int8 checkpoints)".into(),
            ))
        }
    }
    let mut out = Int8Checkpoint {
        weights: BTreeMap::new(),
        tensors: BTreeMap::new(),
    };
    let names = file.names();
    for name in &names {
        let info = file.info(name).expect("a name the file listed");
        let shape = info.shape.clone();
        match info.dtype {
            Dtype::I8 => {
                let [rows, cols] = shape[..] else {
                    return Err(bad(format!("int8 tensor `{name}` has dims {shape:?}, not a matrix's")));
                };
                let scale_name = format!("{name}{SCALE_SUFFIX}");
                let scales = match file.info(&scale_name) {
                    Some(s) if s.dtype == Dtype::F32 && s.shape == [rows] => {
                        f32s(&file.bytes(&scale_name, Checksums::Required)?)
                    }
                    Some(s) => {
                        return Err(bad(format!(
                            "`{scale_name}` is {:?} {:?}, not {rows} f32 scales for `{name}`",
                            s.shape, s.dtype
                        )))
                    }
                    None => return Err(bad(format!("int8 tensor `{name}` has no `{scale_name}`"))),
                };
                let q: Vec<i8> = file
                    .bytes(name, Checksums::Required)?
                    .into_iter()
                    .map(|b| b as i8)
                    .collect();
                let m = Int8Matrix::from_parts(rows, cols, &q, &scales)
                    .map_err(|e| bad(format!("`{name}`: {e}")))?;
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
                    "tensor `{name}` is {other:?}; an int8 checkpoint holds int8 weights and f32 tensors"
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
