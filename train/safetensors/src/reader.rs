//! Reading safetensors files without trusting them: the header is read first and
//! validated against the file (its length bounded, every tensor's offsets contiguous
//! and sized by its dtype and shape, the data it declares exactly what the file holds)
//! before any tensor data is read; then tensors are streamed one at a time, each
//! verified against its checksum, so a load holds one tensor's bytes at once, never
//! the whole file.

use crate::{Checksums, TensorEntry, CHECKSUM_KEY};
use kiln_tensor::{DType, Error, Result};
use safetensors::tensor::{Metadata, TensorInfo};
use safetensors::Dtype;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// The longest header read (the safetensors crate's own bound).
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// Where a [`Reader`] reads from: a file, or bytes built into the program.
trait Source: Read + Seek {}
impl<T: Read + Seek> Source for T {}

/// A safetensors file whose header has been read and validated; its tensors are read
/// when asked.
pub struct Reader {
    path: PathBuf,
    file: RefCell<Box<dyn Source>>,
    /// The whole file, when it is built into the program: its tensors are read in
    /// place where the backend can.
    embedded: Option<&'static [u8]>,
    /// Where tensor data starts in the file.
    data_start: u64,
    header: Metadata,
    metadata: BTreeMap<String, String>,
}

impl Reader {
    /// Opens the file at `path` and validates its header against its length.
    pub fn open(path: &Path) -> Result<Self> {
        let io = |e| io_error(path, "read", e);
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        Self::new(path, Box::new(file), len)
    }

    /// Reads `bytes` (a file built into the program, named `name` in errors) as a
    /// safetensors file.
    pub fn from_bytes(name: &str, bytes: &'static [u8]) -> Result<Self> {
        let len = bytes.len() as u64;
        let mut reader = Self::new(Path::new(name), Box::new(io::Cursor::new(bytes)), len)?;
        reader.embedded = Some(bytes);
        Ok(reader)
    }

    fn new(path: &Path, mut file: Box<dyn Source>, len: u64) -> Result<Self> {
        let io = |e| io_error(path, "read", e);
        let invalid = |why: String| invalid_file(path, why);
        if len < 8 {
            return Err(invalid(format!("{len} bytes hold no header length")));
        }
        let mut field = [0u8; 8];
        file.read_exact(&mut field).map_err(io)?;
        let n = u64::from_le_bytes(field);
        if n > len - 8 {
            return Err(invalid(format!(
                "the header length {n} runs past the file's {len} bytes"
            )));
        }
        if n > MAX_HEADER_BYTES {
            return Err(invalid(format!(
                "the header length {n} is over the {MAX_HEADER_BYTES} bytes a header may take"
            )));
        }
        let mut text = Vec::with_capacity(n as usize);
        Read::by_ref(&mut file)
            .take(n)
            .read_to_end(&mut text)
            .map_err(io)?;
        let header: Metadata = serde_json::from_slice(&text).map_err(|e| {
            // Parsed again only to word the error.
            let object =
                serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&text);
            match object {
                Err(e) => invalid(format!("the header is not a JSON object: {e}")),
                Ok(_) => invalid(format!("the header does not describe tensors: {e}")),
            }
        })?;
        let declared = header.data_len() as u64;
        let held = len - 8 - n;
        if declared != held {
            return Err(invalid(format!(
                "the header declares {declared} bytes of tensor data but the file holds {held}"
            )));
        }
        let metadata = header
            .metadata()
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        Ok(Reader {
            path: path.to_path_buf(),
            file: RefCell::new(file),
            embedded: None,
            data_start: 8 + n,
            header,
            metadata,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The tensors' names, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names = self.header.offset_keys();
        names.sort_unstable();
        names
    }

    /// Tensor `name`'s dtype and shape, if the file has it.
    pub fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.header.info(name)
    }

    /// Tensor `name` as the header describes it (the caller knows the file has it).
    pub fn entry(&self, name: &str) -> TensorEntry {
        let info = self.info(name).expect("a tensor the file lists");
        TensorEntry {
            name: name.to_string(),
            dims: info.shape.clone(),
            dtype: from_st_dtype(info.dtype),
            dtype_name: st_dtype_name(info.dtype),
        }
    }

    /// The string metadata (`__metadata__`), Kiln's entries included.
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    /// Whether the file records any tensor checksum.
    pub fn has_checksums(&self) -> bool {
        self.metadata.keys().any(|k| k.starts_with(CHECKSUM_KEY))
    }

    /// An error unless the file has checksums where `checksums` requires them.
    pub fn require(&self, checksums: Checksums) -> Result<()> {
        if checksums == Checksums::Required
            && !self.has_checksums()
            && !self.header.offset_keys().is_empty()
        {
            return Err(Error::Format(format!(
                "`{}` has no tensor checksums: Kiln did not write it (PyTorch's save_file writes none); load it with `checkpoint::load_foreign` (`--foreign` on the command line) to accept it unverified",
                self.path.display()
            )));
        }
        Ok(())
    }

    /// Tensor `name`'s bytes, read from the file and checked against its checksum
    /// (under [`Checksums::Required`], a tensor without one is an error too).
    pub fn bytes(&self, name: &str, checksums: Checksums) -> Result<Vec<u8>> {
        let info = self.info(name).ok_or_else(|| {
            Error::Format(format!("`{}` has no tensor `{name}`", self.path.display()))
        })?;
        let (start, end) = info.data_offsets;
        let mut bytes = vec![0u8; end - start];
        {
            let mut file = self.file.borrow_mut();
            file.seek(SeekFrom::Start(self.data_start + start as u64))
                .and_then(|_| file.read_exact(&mut bytes))
                .map_err(|e| io_error(&self.path, "read", e))?;
        }
        self.verify(name, &bytes, checksums)?;
        Ok(bytes)
    }

    /// Checks tensor `name`'s `bytes` against its checksum (under
    /// [`Checksums::Required`], a tensor without one is an error too).
    pub fn verify(&self, name: &str, bytes: &[u8], checksums: Checksums) -> Result<()> {
        match self.metadata.get(&format!("{CHECKSUM_KEY}{name}")) {
            Some(stored) => {
                let actual = checksum(bytes);
                if *stored != actual {
                    return Err(Error::Format(format!(
                        "`{}`: tensor `{name}` does not match its checksum (stored crc32 {stored}, the data gives {actual}): the file is corrupt",
                        self.path.display()
                    )));
                }
            }
            None if checksums == Checksums::Required => {
                return Err(Error::Format(format!(
                    "`{}`: tensor `{name}` has no checksum although the file's other tensors have: the file was altered",
                    self.path.display()
                )));
            }
            None => {}
        }
        Ok(())
    }

    /// Tensor `name`'s bytes in place, verified, when the file is built into the
    /// program (`None` for a file read from disk, or without such a tensor).
    pub fn embedded_bytes(
        &self,
        name: &str,
        checksums: Checksums,
    ) -> Option<Result<&'static [u8]>> {
        let (file, info) = (self.embedded?, self.info(name)?);
        let (start, end) = info.data_offsets;
        let at = self.data_start as usize;
        let bytes: &'static [u8] = &file[at + start..at + end];
        Some(self.verify(name, bytes, checksums).map(|()| bytes))
    }
}

/// The checksum Kiln records for a tensor's bytes: CRC-32 (IEEE) in 8 hex digits.
pub fn checksum(bytes: &[u8]) -> String {
    format!("{:08x}", crc32fast::hash(bytes))
}

/// A file that is not a valid safetensors file, and why.
fn invalid_file(path: &Path, why: String) -> Error {
    Error::Format(format!(
        "`{}` is not a valid safetensors file: {why}",
        path.display()
    ))
}

/// An I/O error that names the file it happened on.
pub fn io_error(path: &Path, what: &str, e: io::Error) -> Error {
    Error::Io(io::Error::new(
        e.kind(),
        format!("cannot {what} `{}`: {e}", path.display()),
    ))
}

/// Kiln's dtype of a file dtype, if Kiln has it.
pub fn from_st_dtype(d: Dtype) -> Option<DType> {
    Some(match d {
        Dtype::F32 => DType::F32,
        Dtype::F64 => DType::F64,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::I32 => DType::I32,
        Dtype::U32 => DType::U32,
        Dtype::BOOL => DType::Bool,
        Dtype::I8 => DType::I8,
        _ => return None,
    })
}

/// A file dtype in kiln's lower-case spelling, marked when kiln has no such dtype.
pub fn st_dtype_name(d: Dtype) -> String {
    match from_st_dtype(d) {
        Some(k) => k.name().to_string(),
        None => format!("{} (not a kiln dtype)", d.to_string().to_lowercase()),
    }
}

/// Tensor `name`'s dtype, if Kiln has it and `bytes` hold exactly its elements.
pub fn checked_dtype(path: &Path, name: &str, info: &TensorInfo, bytes: &[u8]) -> Result<DType> {
    let bad = |msg: String| Error::Format(format!("`{}`: tensor `{name}` {msg}", path.display()));
    let dtype = from_st_dtype(info.dtype)
        .ok_or_else(|| bad(format!("has dtype {}", st_dtype_name(info.dtype))))?;
    // The header's validation ties sizes to shapes; a mis-sized chunk would silently
    // drop elements, so it is checked again here.
    let numel: usize = info.shape.iter().product();
    if bytes.len() != numel * dtype.size_in_bytes() {
        return Err(bad(format!(
            "has {} bytes for shape {:?} {dtype}",
            bytes.len(),
            info.shape
        )));
    }
    Ok(dtype)
}
