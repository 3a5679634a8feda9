//! Reading safetensors files without trusting them ([`Reader`]: the header validated
//! against the file before any tensor data is read, tensors streamed one at a time and
//! verified against their checksums), the checksum Kiln records for each tensor, and
//! the fit of a file to the tensors a model declares ([`fit_problems`]), which
//! `kiln::embed!` checks at build time and a load checks at run time, and the int8
//! format's rules ([`check_int8`]), which the same two check. Turning bytes
//! into tensors on a device is kiln-train's (`checkpoint`).

mod int8;
mod reader;

pub use int8::{check_int8, check_int8_label, shown};
pub use reader::{checked_dtype, checksum, from_st_dtype, io_error, st_dtype_name, Reader};

use kiln_tensor::{DType, Result};
use safetensors::Dtype;
use std::collections::{BTreeSet, HashMap};
use std::path::Path;

/// The suffix of PyTorch's batch-norm step counter.
pub const BATCH_NORM_COUNTER: &str = "num_batches_tracked";

/// The metadata key prefix of a tensor's checksum.
pub const CHECKSUM_KEY: &str = "kiln.crc32.";

/// Whether a load insists on checksums.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Checksums {
    /// Every tensor read must have a checksum that matches (files Kiln wrote).
    Required,
    /// Tensors with a checksum are verified; a file without any loads (foreign files).
    IfPresent,
}

/// A tensor as a model declares it or a file holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorEntry {
    /// Its checkpoint name (`fc1.weight`).
    pub name: String,
    /// Its dims.
    pub dims: Vec<usize>,
    /// Its dtype, `None` for a file dtype Kiln has no counterpart of.
    pub dtype: Option<DType>,
    /// Its dtype in words (`f32`, `i64 (not a kiln dtype)`).
    pub dtype_name: String,
}

impl TensorEntry {
    /// A tensor of Kiln's `dtype`.
    pub fn new(name: &str, dims: &[usize], dtype: DType) -> Self {
        TensorEntry {
            name: name.to_string(),
            dims: dims.to_vec(),
            dtype: Some(dtype),
            dtype_name: dtype.name().to_string(),
        }
    }
}

/// The metadata key naming a checkpoint's quantisation.
pub const QUANTIZATION_KEY: &str = "kiln.quantization";

/// [`QUANTIZATION_KEY`]'s value for int8 weights with one scale per row.
pub const INT8_PER_ROW: &str = "int8-per-row";

/// What follows a quantised weight's name in its scales' name (`fc1.weight_scale`).
pub const SCALE_SUFFIX: &str = kiln_tensor::INT8_SCALE_SUFFIX;

/// Whether an int8 checkpoint holds tensor `name` of `dims` as int8 with per-row
/// scales: [`kiln_tensor::Precision::quantizes`] under int8 (an f32 matrix named
/// `weight` or `*.weight`), the rule the int8 layers hold their weights by, seen
/// from a file's entries.
pub fn int8_quantizes(name: &str, dims: &[usize], dtype: Option<DType>) -> bool {
    dtype.is_some_and(|d| kiln_tensor::Precision::Int8.quantizes(name, dims, d))
}

/// What keeps the tensors a file `held` from loading into a model that `wanted`
/// them, one line each: a tensor missing, extra, or of other dims or dtype, and a name
/// the model has twice. PyTorch's batch-norm counters beside a model's running
/// statistics are not extra. Empty when the file fits. The rules of `load`, which
/// `kiln::embed!` applies at build time.
pub fn fit_problems(wanted: &[TensorEntry], held: &[TensorEntry]) -> Vec<String> {
    let by_name: HashMap<&str, &TensorEntry> = held.iter().map(|t| (t.name.as_str(), t)).collect();
    let mut problems = Vec::new();
    let mut seen = BTreeSet::new();
    for w in wanted {
        let name = &w.name;
        if !seen.insert(name.as_str()) {
            problems.push(format!("the model has two tensors named `{name}`"));
            continue;
        }
        match by_name.get(name.as_str()) {
            None => problems.push(format!(
                "missing tensor `{name}`: the model has {:?} {}, the file has no such tensor",
                w.dims, w.dtype_name
            )),
            Some(h) if h.dims != w.dims || h.dtype != w.dtype || h.dtype_name != w.dtype_name => {
                problems.push(format!(
                    "tensor `{name}`: the model has {:?} {}, the file has {:?} {}",
                    w.dims, w.dtype_name, h.dims, h.dtype_name
                ))
            }
            Some(_) => {}
        }
    }
    let mut extra: Vec<&TensorEntry> = held
        .iter()
        .filter(|h| !seen.contains(h.name.as_str()) && !is_batch_norm_counter(h, &seen))
        .collect();
    extra.sort_by(|a, b| a.name.cmp(&b.name));
    for h in extra {
        problems.push(format!(
            "extra tensor `{}` ({:?} {}): the file has it, the model does not",
            h.name, h.dims, h.dtype_name
        ));
    }
    problems
}

/// The tensors of the safetensors file at `path`, read from its header alone (which
/// is validated against the file first), sorted by name.
pub fn header_entries(path: impl AsRef<Path>) -> Result<Vec<TensorEntry>> {
    let file = Reader::open(path.as_ref())?;
    Ok(file.names().iter().map(|n| file.entry(n)).collect())
}

/// Whether `t` is PyTorch's batch-norm step counter of a layer the model has:
/// `<layer>.num_batches_tracked`, one int64, beside the model's `<layer>.running_mean`.
pub fn is_batch_norm_counter(t: &TensorEntry, model: &BTreeSet<&str>) -> bool {
    let Some(layer) = t.name.strip_suffix(BATCH_NORM_COUNTER) else {
        return false;
    };
    let running_mean = format!("{layer}running_mean");
    let layer_ok = layer.is_empty() || layer.ends_with('.');
    layer_ok
        && model.contains(running_mean.as_str())
        && t.dtype_name == st_dtype_name(Dtype::I64)
        && t.dims.iter().product::<usize>() == 1
}
