//! Checkpoints: safetensors files in PyTorch's naming and layout (`fc1.weight` as
//! `[out, in]`, exactly what a [`Module`] visits), so a `state_dict` saved with
//! `safetensors.torch.save_file` loads here and ours load there.
//!
//! This module owns the mapping between kiln's dtypes and safetensors' (`F32`, `F64`,
//! `F16`, `BF16`, `I32`, `U32`, `BOOL`; other file dtypes are refused by name), the
//! byte encoding (little-endian, as the format says), atomic writes, and the checks
//! that make a load all-or-nothing: every mismatch between a file and a model is found
//! before the model is touched, and reported in one error that names each tensor with
//! both shapes and dtypes.
//!
//! Every file Kiln writes carries a CRC-32 of each tensor's bytes in its metadata
//! (`kiln.crc32.<name>`), and [`load`] verifies them: a flipped byte is an error naming
//! the tensor. Files written elsewhere (PyTorch's `save_file`) have none; they load
//! through [`load_foreign`], the explicit opt-out, which still verifies any checksum a
//! file has.
//!
//! PyTorch's batch-norm step counters (`<layer>.num_batches_tracked`, one int64) are
//! read into the model's training-step counter and written from it.
//!
//! Files are read header first: a length field past the end, a header that does not
//! describe its tensors, or tensor data declared longer or shorter than the file holds
//! is refused before any data is read; then tensors are streamed one at a time
//! (its `read` module).

pub mod int8;
mod read;

use kiln_safetensors::{
    check_int8, check_int8_label, checksum, io_error, is_batch_norm_counter, BATCH_NORM_COUNTER,
    CHECKSUM_KEY, QUANTIZATION_KEY,
};
pub use kiln_safetensors::{fit_problems, header_entries, TensorEntry};
pub(crate) use kiln_safetensors::{Checksums, Reader};
pub(crate) use read::ReadTensor;

use kiln_tensor::nn::{LoadFn, LossScale, Module, Slot, StepSeeds};
use kiln_tensor::{Backend, DType, Error, HostData, RawTensor, Result};
use safetensors::Dtype;
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// What checkpoints and training states need of a model: its tensors by name, visited
/// and loaded, and its step counter. Object safe, so the code that saves and loads
/// models takes `&dyn Tensors<B>` and is compiled once per backend, not once per model
/// (the CPU's copy in this crate, `instances.rs`); every [`Module`] is one.
pub(crate) trait Tensors<B: Backend> {
    /// [`Module::visit_params`].
    fn visit_params(&self, prefix: &str, f: &mut dyn FnMut(Slot<'_, B>));
    /// [`Module::visit_buffers`].
    fn visit_buffers(&self, prefix: &str, f: &mut dyn FnMut(Slot<'_, B>));
    /// [`Module::load_named`].
    fn load_named(&mut self, prefix: &str, get: &mut LoadFn<'_, B>) -> Result<()>;
    /// [`Module::step_seeds`].
    fn step_seeds(&self) -> Option<&StepSeeds<B>>;
    /// [`Module::loss_scale`].
    fn loss_scale(&self) -> Option<&LossScale<B>>;
}

impl<B: Backend, M: Module<B>> Tensors<B> for M {
    fn visit_params(&self, prefix: &str, f: &mut dyn FnMut(Slot<'_, B>)) {
        Module::visit_params(self, prefix, f)
    }
    fn visit_buffers(&self, prefix: &str, f: &mut dyn FnMut(Slot<'_, B>)) {
        Module::visit_buffers(self, prefix, f)
    }
    fn load_named(&mut self, prefix: &str, get: &mut LoadFn<'_, B>) -> Result<()> {
        Module::load_named(self, prefix, get)
    }
    fn step_seeds(&self) -> Option<&StepSeeds<B>> {
        Module::step_seeds(self)
    }
    fn loss_scale(&self) -> Option<&LossScale<B>> {
        Module::loss_scale(self)
    }
}

/// Saves `model`'s parameters and buffers to a safetensors file at `path`, atomically.
pub fn save<B: Backend, M: Module<B>>(model: &M, path: impl AsRef<Path>) -> Result<()> {
    save_with_metadata(model, path, &BTreeMap::new())
}

/// [`save`], with string metadata in the file's `__metadata__` header entry (keys
/// starting with `kiln.` are reserved).
pub fn save_with_metadata<B: Backend, M: Module<B>>(
    model: &M,
    path: impl AsRef<Path>,
    metadata: &BTreeMap<String, String>,
) -> Result<()> {
    save_tensors(model, path.as_ref(), metadata)
}

/// [`save_with_metadata`] of any model.
#[inline(never)]
pub(crate) fn save_tensors<B: Backend>(
    model: &dyn Tensors<B>,
    path: &Path,
    metadata: &BTreeMap<String, String>,
) -> Result<()> {
    check_user_metadata(metadata)?;
    write_file(path, model_entries(model)?, metadata)
}

/// A model's tensors as a file holds them: parameters, buffers, and for each batch-norm
/// layer PyTorch's `num_batches_tracked`, the model's training steps as its step
/// counter counts them (0 for a module without one).
pub(crate) fn model_entries<B: Backend>(model: &dyn Tensors<B>) -> Result<Vec<(String, Encoded)>> {
    let tensors = module_tensors(model);
    let names: BTreeSet<&str> = tensors.iter().map(|(n, _)| n.as_str()).collect();
    let steps = model.step_seeds().map_or(0, |s| s.taken());
    let counters: Vec<String> = names
        .iter()
        .filter_map(|n| n.strip_suffix("running_mean"))
        .filter(|layer| names.contains(format!("{layer}running_var").as_str()))
        .map(|layer| format!("{layer}{BATCH_NORM_COUNTER}"))
        .filter(|c| !names.contains(c.as_str()))
        .collect();
    let mut entries = Vec::with_capacity(tensors.len() + counters.len());
    for (name, t) in &tensors {
        entries.push((name.clone(), Encoded::of(t)?));
    }
    for name in counters {
        entries.push((
            name,
            Encoded {
                dtype: Dtype::I64,
                shape: vec![],
                data: (steps as i64).to_le_bytes().to_vec(),
            },
        ));
    }
    Ok(entries)
}

/// Replaces every parameter and buffer of `model` with the tensor of the same name in
/// the safetensors file at `path`, which Kiln wrote: each tensor's checksum is
/// verified (a file without checksums, such as PyTorch's, loads through
/// [`load_foreign`]).
///
/// The file must hold exactly the model's tensors, each with the model's shape and
/// dtype (no conversion), besides PyTorch's batch-norm counters (one int64 per layer,
/// read into the model's training-step counter); otherwise this returns an
/// [`Error::Format`] listing every missing, extra or mismatched tensor, and the model
/// is left unchanged.
pub fn load<B: Backend, M: Module<B>>(model: &mut M, path: impl AsRef<Path>) -> Result<()> {
    load_checked(model, path.as_ref(), Checksums::Required)
}

/// A new `M` on `device` holding the checkpoint at `path` ([`load`]'s checks; `foreign`:
/// [`load_foreign`]'s), built without drawing initial values it would replace.
pub fn load_new<B: Backend, M: Module<B>>(
    path: impl AsRef<Path>,
    device: &B::Device,
    foreign: bool,
) -> Result<M> {
    let mut model = kiln_tensor::nn::zero_initialised(|| M::init(device, 0))?;
    let checksums = if foreign {
        Checksums::IfPresent
    } else {
        Checksums::Required
    };
    load_checked(&mut model, path.as_ref(), checksums)?;
    Ok(model)
}

/// [`load`] for a file written by another tool (PyTorch's `save_file`), which carries
/// no checksums: the tensors that have one are verified, the others load unverified.
pub fn load_foreign<B: Backend, M: Module<B>>(model: &mut M, path: impl AsRef<Path>) -> Result<()> {
    load_checked(model, path.as_ref(), Checksums::IfPresent)
}

/// Bytes built into the program at an alignment every dtype can be read in place
/// from, so [`load_bytes`] can hand the CPU backend views of them instead of copies:
/// `static W: &AlignedBytes<[u8]> = &AlignedBytes(*include_bytes!("w.safetensors"));`
/// (what `kiln::embed!` writes).
#[repr(C, align(64))]
pub struct AlignedBytes<T: ?Sized>(pub T);

/// [`load`] from a checkpoint built into the program (the bytes `kiln::embed!`
/// includes, named `name` in errors): its checksums are verified as a file's are. On
/// the CPU, tensors whose bytes are aligned for their dtype (all of them, when the
/// bytes are an [`AlignedBytes`] and the file aligns its data as safetensors writers
/// do) are read in place, not copied, until something writes to them.
pub fn load_bytes<B: Backend, M: Module<B>>(
    model: &mut M,
    name: &str,
    bytes: &'static [u8],
) -> Result<()> {
    load_bytes_checked(model, name, bytes, Checksums::Required)
}

/// [`load_bytes`] for a checkpoint another tool wrote (`kiln::embed!(.., foreign)`):
/// tensors without checksums load unverified, as [`load_foreign`] loads them.
pub fn load_bytes_foreign<B: Backend, M: Module<B>>(
    model: &mut M,
    name: &str,
    bytes: &'static [u8],
) -> Result<()> {
    load_bytes_checked(model, name, bytes, Checksums::IfPresent)
}

#[inline(never)]
pub(crate) fn load_bytes_checked<B: Backend>(
    model: &mut dyn Tensors<B>,
    name: &str,
    bytes: &'static [u8],
    checksums: Checksums,
) -> Result<()> {
    let file = Reader::from_bytes(name, bytes)?;
    let prepared = prepare_load(model, &file, checksums, &|_| false)?;
    apply_load(model, Path::new(name), prepared)
}

/// [`load`] or [`load_foreign`] of any model.
#[inline(never)]
pub(crate) fn load_checked<B: Backend>(
    model: &mut dyn Tensors<B>,
    path: &Path,
    checksums: Checksums,
) -> Result<()> {
    let file = Reader::open(path)?;
    let prepared = prepare_load(model, &file, checksums, &|_| false)?;
    apply_load(model, path, prepared)
}

/// What [`prepare_load`] decoded, for [`apply_load`] to put into the model.
pub(crate) struct PreparedLoad<B: Backend> {
    decoded: HashMap<String, RawTensor<B>>,
    /// The batch-norm counters' value, when the file has them.
    steps: Option<u64>,
}

/// Checks that `file` holds exactly `model`'s tensors (names for which `others` is true
/// aside: they belong to someone else) with matching checksums, and decodes them,
/// touching nothing: every mismatch is reported in one error.
pub(crate) fn prepare_load<B: Backend>(
    model: &dyn Tensors<B>,
    file: &Reader,
    checksums: Checksums,
    others: &dyn Fn(&str) -> bool,
) -> Result<PreparedLoad<B>> {
    let path = file.path();
    let mut expected: Vec<(String, Vec<usize>, DType, B::Device)> = Vec::new();
    let mut push = |s: kiln_tensor::nn::Slot<'_, B>| {
        let v = s.value;
        expected.push((
            s.name.to_string(),
            v.dims().to_vec(),
            v.dtype(),
            v.device().clone(),
        ))
    };
    model.visit_params("", &mut push);
    model.visit_buffers("", &mut push);

    // An int8 instance, or a file that says it is quantised: the int8 format's rules
    // apply, checked by the one function `int8::read_int8` checks them with; a label
    // this Kiln does not read is refused first, so such a file is never read as int8.
    let labelled = file.metadata().contains_key(QUANTIZATION_KEY);
    if labelled {
        check_int8_label(file)?;
    }
    let int8 = labelled || expected.iter().any(|(_, _, dtype, _)| *dtype == DType::I8);
    let wanted: Vec<TensorEntry> = expected
        .iter()
        .map(|(name, dims, dtype, _)| TensorEntry::new(name, dims, *dtype))
        .collect();
    let held: Vec<TensorEntry> = file
        .names()
        .into_iter()
        .filter(|n| !others(n))
        .map(|n| file.entry(&n))
        .collect();
    let problems = fit_problems(&wanted, &held);
    let names: BTreeSet<&str> = wanted.iter().map(|t| t.name.as_str()).collect();
    let counters: Vec<String> = held
        .iter()
        .filter(|t| !names.contains(t.name.as_str()) && is_batch_norm_counter(t, &names))
        .map(|t| t.name.clone())
        .collect();
    if !problems.is_empty() {
        let shared = held
            .iter()
            .filter(|t| names.contains(t.name.as_str()))
            .count();
        if shared == 0 && !held.is_empty() {
            // Nothing in common: another model's file, said in one line.
            let some: Vec<String> = held
                .iter()
                .take(3)
                .map(|t| format!("`{}`", t.name))
                .collect();
            return Err(Error::Format(format!(
                "cannot load `{}` into the model: the file holds none of its {} tensors but {} others ({}{}), a checkpoint of another model",
                path.display(),
                names.len(),
                held.len(),
                some.join(", "),
                if held.len() > 3 { ", ..." } else { "" }
            )));
        }
        return Err(Error::Format(format!(
            "cannot load `{}` into the model:\n  - {}",
            path.display(),
            problems.join("\n  - ")
        )));
    }
    file.require(checksums)?;
    if int8 {
        check_int8(file, checksums)?;
    }

    // Read, verify and decode everything before replacing anything, so a tensor that
    // fails (a flipped byte, a bool byte that is not 0 or 1) cannot leave the model
    // half loaded.
    let mut decoded = HashMap::with_capacity(expected.len());
    for (name, _, _, device) in &expected {
        decoded.insert(name.clone(), file.tensor(name, checksums, device)?);
    }
    let mut steps = None;
    for name in counters {
        let bytes = file.bytes(&name, checksums)?;
        let value = i64::from_le_bytes(bytes.as_slice().try_into().map_err(|_| {
            Error::Format(format!(
                "`{}`: tensor `{name}` is not one int64",
                path.display()
            ))
        })?);
        let value = u64::try_from(value).map_err(|_| {
            Error::Format(format!(
                "`{}`: tensor `{name}` counts {value} batches, fewer than none",
                path.display()
            ))
        })?;
        steps = Some(steps.map_or(value, |s: u64| s.max(value)));
    }
    Ok(PreparedLoad { decoded, steps })
}

/// Puts what [`prepare_load`] decoded into `model`; the batch-norm counters (their
/// largest, should layers disagree) become its training-step counter.
pub(crate) fn apply_load<B: Backend>(
    model: &mut dyn Tensors<B>,
    path: &Path,
    prepared: PreparedLoad<B>,
) -> Result<()> {
    let PreparedLoad { mut decoded, steps } = prepared;
    model.load_named("", &mut |name, _old| {
        decoded.remove(name).ok_or_else(|| {
            Error::Format(format!(
                "the model asked for `{name}` while loading `{}`, which it did not visit",
                path.display()
            ))
        })
    })?;
    if let (Some(n), Some(seeds)) = (steps, model.step_seeds()) {
        seeds.set_taken(n);
    }
    Ok(())
}

/// Every tensor in the safetensors file at `path`, sorted by name, on `device`,
/// besides batch-norm counters (int64, a dtype Kiln lacks). Tensors with a checksum
/// are verified.
pub fn read_tensors<B: Backend>(
    path: impl AsRef<Path>,
    device: &B::Device,
) -> Result<Vec<(String, RawTensor<B>)>> {
    let file = Reader::open(path.as_ref())?;
    let mut out = Vec::new();
    for name in file.names() {
        let info = file.info(&name).expect("a name the file lists");
        if name.ends_with(BATCH_NORM_COUNTER) && info.dtype == Dtype::I64 {
            continue;
        }
        let t = file.tensor(&name, Checksums::IfPresent, device)?;
        out.push((name, t));
    }
    Ok(out)
}

/// The string metadata (`__metadata__`) of the safetensors file at `path` (empty if
/// it has none), without Kiln's own entries (keys starting with `kiln.`: checksums,
/// training state).
pub fn read_metadata(path: impl AsRef<Path>) -> Result<BTreeMap<String, String>> {
    let mut meta = Reader::open(path.as_ref())?.metadata().clone();
    meta.retain(|k, _| !k.starts_with(RESERVED_KEY));
    Ok(meta)
}

/// The metadata key prefix Kiln keeps for itself.
const RESERVED_KEY: &str = "kiln.";

/// Refuses metadata keys Kiln keeps for itself.
fn check_user_metadata(metadata: &BTreeMap<String, String>) -> Result<()> {
    match metadata.keys().find(|k| k.starts_with(RESERVED_KEY)) {
        Some(k) => Err(Error::invalid(
            "save",
            format!("the metadata key `{k}` is reserved: keys starting with `{RESERVED_KEY}` are Kiln's"),
        )),
        None => Ok(()),
    }
}

/// Writes named tensors to a safetensors file at `path`, atomically.
pub fn write_tensors<B: Backend, N: AsRef<str>>(
    path: impl AsRef<Path>,
    tensors: &[(N, &RawTensor<B>)],
) -> Result<()> {
    write_tensors_with_metadata(path, tensors, &BTreeMap::new())
}

/// [`write_tensors`], with string metadata in the file's `__metadata__` header entry
/// (keys starting with `kiln.` are reserved).
///
/// The file is written to a temporary file in the same folder, flushed to disk, and
/// renamed over `path` (then the folder is flushed), so a crash leaves either the old
/// file or the new one, never a torn one.
pub fn write_tensors_with_metadata<B: Backend, N: AsRef<str>>(
    path: impl AsRef<Path>,
    tensors: &[(N, &RawTensor<B>)],
    metadata: &BTreeMap<String, String>,
) -> Result<()> {
    check_user_metadata(metadata)?;
    let mut entries = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        entries.push((name.as_ref().to_string(), Encoded::of(t)?));
    }
    write_file(path.as_ref(), entries, metadata)
}

/// Writes encoded tensors with `metadata` and each tensor's checksum to `path`,
/// atomically.
pub(crate) fn write_file(
    path: &Path,
    entries: Vec<(String, Encoded)>,
    metadata: &BTreeMap<String, String>,
) -> Result<()> {
    let mut names = BTreeSet::new();
    let mut metadata = metadata.clone();
    for (name, encoded) in &entries {
        if name == "__metadata__" {
            return Err(Error::invalid(
                "write_tensors",
                "`__metadata__` is reserved by safetensors, not a tensor name",
            ));
        }
        if !names.insert(name.as_str()) {
            return Err(Error::invalid(
                "write_tensors",
                format!("two tensors are named `{name}`"),
            ));
        }
        metadata.insert(format!("{CHECKSUM_KEY}{name}"), checksum(&encoded.data));
    }
    let bytes = safetensors::serialize(entries, None)
        .map_err(|e| Error::Format(format!("cannot serialise `{}`: {e}", path.display())))?;
    write_atomically(path, &with_metadata(bytes, &metadata)?)
}

/// `bytes`, a serialised safetensors file, with `metadata` in its header, its keys in
/// sorted order: identical runs write identical files (the safetensors crate writes a
/// metadata map in hash order).
fn with_metadata(bytes: Vec<u8>, metadata: &BTreeMap<String, String>) -> Result<Vec<u8>> {
    if metadata.is_empty() {
        return Ok(bytes);
    }
    let broken =
        |what: &str| Error::Format(format!("the serialised header {what} (a broken invariant)"));
    let n = bytes
        .get(..8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")) as usize)
        .filter(|&n| bytes.len() >= 8 + n)
        .ok_or_else(|| broken("is cut short"))?;
    let mut header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&bytes[8..8 + n]).map_err(|_| broken("is not a JSON object"))?;
    let entries = metadata
        .iter()
        .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
        .collect();
    header.insert("__metadata__".into(), serde_json::Value::Object(entries));
    let mut json = serde_json::to_vec(&header).map_err(|_| broken("cannot be written"))?;
    // The format pads the header with spaces to a multiple of 8 bytes.
    json.resize(json.len().next_multiple_of(8), b' ');
    let mut out = Vec::with_capacity(8 + json.len() + bytes.len() - 8 - n);
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(&json);
    out.extend_from_slice(&bytes[8 + n..]);
    Ok(out)
}

/// Parameters then buffers of `model`, with their names.
fn module_tensors<B: Backend>(model: &dyn Tensors<B>) -> Vec<(String, RawTensor<B>)> {
    let mut out = Vec::new();
    let mut push =
        |s: kiln_tensor::nn::Slot<'_, B>| out.push((s.name.to_string(), s.value.clone()));
    model.visit_params("", &mut push);
    model.visit_buffers("", &mut push);
    out
}

/// A tensor's encoded bytes, as `safetensors::serialize` takes them.
pub(crate) struct Encoded {
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl Encoded {
    /// Bytes already encoded as `dtype` of `shape` (a file's tensor, or int8 values).
    pub(crate) fn raw(dtype: Dtype, shape: Vec<usize>, data: Vec<u8>) -> Self {
        Encoded { dtype, shape, data }
    }

    /// Its data's length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.data.len()
    }

    /// `t`'s values, read to the host and encoded.
    pub(crate) fn of<B: Backend>(t: &RawTensor<B>) -> Result<Self> {
        Ok(Encoded {
            dtype: to_st_dtype(t.dtype()),
            shape: t.dims().to_vec(),
            data: encode(&t.to_host()?),
        })
    }
}

impl safetensors::View for Encoded {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

fn to_st_dtype(d: DType) -> Dtype {
    match d {
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::I32 => Dtype::I32,
        DType::U32 => Dtype::U32,
        DType::Bool => Dtype::BOOL,
        DType::I8 => Dtype::I8,
    }
}

/// Little-endian bytes of host values, as safetensors stores them.
fn encode(h: &HostData) -> Vec<u8> {
    match h {
        HostData::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        HostData::F64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        HostData::F16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        HostData::BF16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        HostData::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        HostData::U32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        HostData::Bool(v) => v.iter().map(|&x| x as u8).collect(),
        HostData::I8(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
    }
}

/// Writes `bytes` to `path` through a temporary sibling, fsync and rename. A symbolic
/// link at `path` is followed: the file it names is replaced and the link stays.
/// Temporary files that earlier saves to the same path left behind when their process
/// was killed are removed first. A special file at `path` (a device, a FIFO, a
/// socket, a folder) is refused, naming it, before anything is written: the rename
/// would replace it (`/dev/null`, saving as root). Every file Kiln writes goes through
/// here: checkpoints, training states, int8 checkpoints, imports' checkpoints.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    check_output("file", path)?;
    let path = &follow_links(path)?;
    let file_name = path.file_name().ok_or_else(|| {
        Error::invalid("save", format!("`{}` does not name a file", path.display()))
    })?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    // Unique per process and call, so concurrent saves never share a temporary file;
    // the `.safetensors.tmp` suffix is what the repository's .gitignore expects.
    let tmp_name = format!(
        ".{}.{}-{}.safetensors.tmp",
        file_name.to_string_lossy(),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    remove_stale_temps(&dir, &file_name.to_string_lossy());
    let tmp = dir.join(tmp_name);
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .map_err(|e| io_error(&tmp, "create", e))?;
    if let Err(e) = fill_and_rename(file, &tmp, path, bytes) {
        // Best effort: the error being reported matters more than a stray temp file.
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    sync_dir(&dir)
}

/// `path` with its symbolic links followed (at most 40, as the kernel's limit), to the
/// file they name, which need not exist yet.
fn follow_links(path: &Path) -> Result<PathBuf> {
    let mut p = path.to_path_buf();
    for _ in 0..40 {
        match fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                let target = fs::read_link(&p).map_err(|e| io_error(&p, "read the link", e))?;
                p = match p.parent() {
                    Some(dir) => dir.join(target),
                    None => target,
                };
            }
            _ => return Ok(p),
        }
    }
    Err(Error::invalid(
        "save",
        format!("`{}`: too many levels of symbolic links", path.display()),
    ))
}

/// What the special file at `path` is (`a character device`, `a FIFO`), `None` for a
/// regular file or a path where nothing is. Links are followed twice over: as the
/// kernel follows them, and as [`write_atomically`] does, whose rename replaces the
/// file the last link names.
fn special_file(path: &Path) -> Option<&'static str> {
    let kind = |m: fs::Metadata| -> Option<&'static str> {
        let t = m.file_type();
        if t.is_file() || t.is_symlink() {
            return None;
        }
        if t.is_dir() {
            return Some("a folder");
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::FileTypeExt;
            if t.is_char_device() {
                return Some("a character device");
            }
            if t.is_block_device() {
                return Some("a block device");
            }
            if t.is_fifo() {
                return Some("a FIFO (named pipe)");
            }
            if t.is_socket() {
                return Some("a socket");
            }
        }
        Some("a special file")
    };
    fs::metadata(path).ok().and_then(kind).or_else(|| {
        follow_links(path)
            .ok()
            .and_then(|p| fs::symlink_metadata(p).ok())
            .and_then(kind)
    })
}

/// Refuses `path` as where the `what` (`checkpoint`, `int8 checkpoint`) is written
/// unless it is a regular file or a new path (links followed): Kiln never writes over
/// a device, a FIFO, a socket or a folder, which its atomic rename would replace
/// (`--out /dev/null` as root would replace `/dev/null`). Every write checks it; tools
/// call it before their work, so that a run is not lost to it.
pub fn check_output(what: &str, path: impl AsRef<Path>) -> Result<()> {
    let path = path.as_ref();
    match special_file(path) {
        Some(kind) => Err(Error::invalid(
            "save",
            format!(
                "the {what} path `{}` is {kind}, not a regular file: Kiln writes only to regular files or new paths; name a file",
                path.display()
            ),
        )),
        None => Ok(()),
    }
}

/// Whether `a` and `b` name one file once symbolic links are followed: the same
/// device and inode where both exist (a hard link is the same file), otherwise the
/// same path once links and the folders above are resolved (a link to where the other
/// will be written).
pub fn same_file(a: impl AsRef<Path>, b: impl AsRef<Path>) -> bool {
    let (a, b) = (a.as_ref(), b.as_ref());
    #[cfg(unix)]
    if let (Ok(x), Ok(y)) = (fs::metadata(a), fs::metadata(b)) {
        use std::os::unix::fs::MetadataExt;
        return x.dev() == y.dev() && x.ino() == y.ino();
    }
    match (resolved(a), resolved(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// `path` with its links followed and its folder made absolute and canonical (the
/// file itself need not exist); `None` when its folder does not exist.
fn resolved(path: &Path) -> Option<PathBuf> {
    let p = follow_links(path).ok()?;
    if let Ok(c) = p.canonicalize() {
        return Some(c);
    }
    let dir = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    Some(dir.canonicalize().ok()?.join(p.file_name()?))
}

/// Refuses an `output` (the `what`: `int8 checkpoint`) that is the `input` a tool
/// reads ([`same_file`]: links followed), naming both: writing it would replace the
/// input before, or while, it is read.
pub fn check_not_input(
    what: &str,
    output: impl AsRef<Path>,
    input: impl AsRef<Path>,
) -> Result<()> {
    let (output, input) = (output.as_ref(), input.as_ref());
    if same_file(output, input) {
        return Err(Error::invalid(
            "save",
            format!(
                "the {what} `{}` would overwrite its input `{}` (the same file once links are followed); name another file",
                output.display(),
                input.display()
            ),
        ));
    }
    Ok(())
}

/// Removes the temporary files of saves to `file_name` in `dir` whose process no
/// longer runs (killed mid-save). Best effort: a file that cannot be removed stays.
/// Only where a process can be looked up (Linux's /proc); elsewhere they stay.
fn remove_stale_temps(dir: &Path, file_name: &str) {
    let prefix = format!(".{file_name}.");
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name
            .to_str()
            .and_then(|n| n.strip_prefix(&prefix))
            .and_then(|n| n.strip_suffix(".safetensors.tmp"))
        else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid != std::process::id() && !process_runs(pid) {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// Whether process `pid` runs (true where that cannot be told).
fn process_runs(pid: u32) -> bool {
    if cfg!(target_os = "linux") {
        Path::new("/proc").join(pid.to_string()).exists()
    } else {
        true
    }
}

/// Writes and flushes the temporary file, then renames it over `path`.
fn fill_and_rename(mut file: File, tmp: &Path, path: &Path, bytes: &[u8]) -> Result<()> {
    file.write_all(bytes)
        .map_err(|e| io_error(tmp, "write", e))?;
    file.sync_all().map_err(|e| io_error(tmp, "flush", e))?;
    drop(file);
    fs::rename(tmp, path).map_err(|e| io_error(path, "replace", e))
}

/// Flushes a folder's entries, so a rename into it survives a crash.
#[cfg(unix)]
fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_error(dir, "flush the folder", e))
}

/// Windows cannot open a folder to flush it; there the rename's durability is left to
/// the file system's journal.
#[cfg(not(unix))]
fn sync_dir(_dir: &Path) -> Result<()> {
    Ok(())
}

/// Creates `path`'s folder and checks that a file can be written there, so that a run
/// is not lost to a path it cannot save to: an error naming `what` (`checkpoint`,
/// `training state`) and the path when the folder cannot be made or written, or when
/// `path` is a folder or another special file ([`check_output`]).
pub fn check_writable(what: &str, path: impl AsRef<Path>) -> Result<()> {
    writable(what, path.as_ref())
}

/// [`check_writable`] of a path.
fn writable(what: &str, path: &Path) -> Result<()> {
    let cannot = |e: std::io::Error| {
        Error::invalid(
            "check_writable",
            format!("cannot write the {what} {}: {e}", path.display()),
        )
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(dir).map_err(cannot)?;
    if path.is_dir() {
        return Err(Error::invalid(
            "check_writable",
            format!("the {what} path {} is a folder", path.display()),
        ));
    }
    check_output(what, path)?;
    // A name of its own per call: two checks in one process (two Learners on two
    // threads, tests side by side) must not remove each other's probe.
    static PROBES: AtomicU64 = AtomicU64::new(0);
    let n = PROBES.fetch_add(1, Ordering::Relaxed);
    let probe = dir.join(format!(".kiln-probe-{}-{n}", std::process::id()));
    std::fs::File::create(&probe).map_err(cannot)?;
    std::fs::remove_file(&probe).map_err(cannot)
}
