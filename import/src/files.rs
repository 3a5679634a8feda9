//! Writing an import's files: the `#[model]` source and its checkpoint (a safetensors
//! file with Kiln's per-tensor checksums, written by kiln-train's writer), from a
//! command line or a build script.

use crate::error::{ImportError, Result};
use crate::model::{read, Tensor, TensorData};
use crate::translate::{model_name, translate, Translation};
use kiln_cpu::{Cpu, CpuDevice};
use kiln_tensor::{HostData, RawTensor};
use std::path::{Path, PathBuf};

/// The files an import wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Imported {
    /// The model's name in the source.
    pub name: String,
    /// The source file (`<stem>.rs`).
    pub source: PathBuf,
    /// The checkpoint (`<stem>.safetensors`).
    pub checkpoint: PathBuf,
}

/// Imports the ONNX model at `onnx` into `out_dir`: `<stem>.rs` holding the
/// `#[model]` struct (named `name`, or after the file's stem) and `<stem>.safetensors`
/// its checkpoint. For build scripts: `include!` the source from `OUT_DIR`, load or
/// `kiln::embed!` the checkpoint.
pub fn import(
    onnx: impl AsRef<Path>,
    out_dir: impl AsRef<Path>,
    name: Option<&str>,
) -> Result<Imported> {
    let (onnx, out_dir) = (onnx.as_ref(), out_dir.as_ref());
    let stem = onnx
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name = match name {
        Some(n) => valid_name(n)?,
        None => model_name(&stem),
    };
    let file = onnx
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let translation = translate(&read(onnx)?, &name, &file)?;
    let stem = if stem.is_empty() {
        "model".to_string()
    } else {
        stem
    };
    let source = out_dir.join(format!("{stem}.rs"));
    let checkpoint = out_dir.join(format!("{stem}.safetensors"));
    std::fs::write(&source, &translation.source).map_err(|e| ImportError::Io {
        path: source.clone(),
        source: e,
    })?;
    write_checkpoint(&translation, &checkpoint)?;
    Ok(Imported {
        name,
        source,
        checkpoint,
    })
}

/// Writes a translation's tensors to a checkpoint at `path`, atomically, each with
/// its checksum.
pub fn write_checkpoint(translation: &Translation, path: &Path) -> Result<()> {
    let tensors = translation
        .tensors
        .iter()
        .map(|(name, t)| Ok((name.as_str(), on_cpu(t)?)))
        .collect::<Result<Vec<_>>>()?;
    let refs: Vec<(&str, &RawTensor<Cpu>)> = tensors.iter().map(|(n, t)| (*n, t)).collect();
    kiln_train::checkpoint::write_tensors(path, &refs)
        .map_err(|e| ImportError::Invalid(format!("cannot write `{}`: {e}", path.display())))
}

/// A held tensor on the CPU backend.
fn on_cpu(t: &Tensor) -> Result<RawTensor<Cpu>> {
    let data = match &t.data {
        TensorData::F32(v) => HostData::F32(v.clone()),
        TensorData::F64(v) => HostData::F64(v.clone()),
        TensorData::I32(v) => HostData::I32(v.clone()),
        TensorData::Bool(v) => HostData::Bool(v.clone()),
        TensorData::I64(_) => {
            return Err(ImportError::Feature(
                "an i64 parameter (Kiln's checkpoints hold i32 integers)".into(),
            ))
        }
    };
    RawTensor::from_host(data, &t.dims, &CpuDevice)
        .map_err(|e| ImportError::Invalid(format!("a parameter of dims {:?}: {e}", t.dims)))
}

/// `name` if it is a Rust type name (`Mlp`, `MnistNet`).
fn valid_name(name: &str) -> Result<String> {
    let mut chars = name.chars();
    let ok = chars.next().is_some_and(|c| c.is_ascii_uppercase())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(name.to_string())
    } else {
        Err(ImportError::Feature(format!(
            "`{name}` is not a model name (a Rust type name: a capital letter, then letters, digits or _)"
        )))
    }
}
