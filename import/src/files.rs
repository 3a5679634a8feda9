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
///
/// Both files are written to temporary siblings first and renamed into place only
/// when both are whole, so a failed write (a full disk, a folder that is not one)
/// leaves neither a source without its checkpoint nor a torn file. An output path
/// that exists as something other than a regular file (a device, a FIFO, a folder,
/// or a link to one) or that is the model itself is refused by name
/// (`kiln_train::checkpoint::check_output`, `check_not_input`); a link to a regular
/// file is replaced by the new file.
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
        Some(n) => n.to_string(),
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
    // Kiln's rules for every file it writes: never over a device, a FIFO or a folder
    // (a rename would replace it), never over the input.
    for (what, out) in [("source", &source), ("checkpoint", &checkpoint)] {
        kiln_train::checkpoint::check_output(what, out)
            .and_then(|()| kiln_train::checkpoint::check_not_input(what, out, onnx))
            .map_err(|e| write_error(out, &e.to_string()))?;
    }
    let staged_checkpoint = staging_path(&checkpoint);
    let staged_source = staging_path(&source);
    // Staged in the order the files are named to a user: the source, then its
    // checkpoint; an error names the file it was for, not its staging name.
    let written = std::fs::write(&staged_source, &translation.source)
        .map_err(|e| write_error(&source, &e.to_string()))
        .and_then(|()| {
            write_checkpoint(&translation, &staged_checkpoint).map_err(|e| match e {
                ImportError::Write { why, .. } => write_error(&checkpoint, &why),
                other => other,
            })
        })
        .and_then(|()| {
            std::fs::rename(&staged_checkpoint, &checkpoint)
                .map_err(|e| write_error(&checkpoint, &e.to_string()))
        })
        .and_then(|()| {
            std::fs::rename(&staged_source, &source)
                .map_err(|e| write_error(&source, &e.to_string()))
        });
    if written.is_err() {
        // Best effort: the write's own error is the one to report.
        let _ = std::fs::remove_file(&staged_checkpoint);
        let _ = std::fs::remove_file(&staged_source);
    }
    written?;
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
    kiln_train::checkpoint::write_tensors(path, &refs).map_err(|e| ImportError::Write {
        path: path.to_path_buf(),
        why: e.to_string(),
    })
}

/// An error writing `path`.
fn write_error(path: &Path, why: &str) -> ImportError {
    ImportError::Write {
        path: path.to_path_buf(),
        why: why.to_string(),
    }
}

/// The temporary sibling `path` is written to before it is renamed into place
/// (hidden, and named after this process so that two imports never share one).
fn staging_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.{}.import-tmp", std::process::id()))
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
