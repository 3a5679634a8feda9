//! Training state: everything a run needs to go on after a crash, in one safetensors
//! file written atomically. A resumed run takes the steps the interrupted one would
//! have taken, bit for bit on the same backend.
//!
//! The file holds the model's tensors under their checkpoint names (batch-norm
//! counters included), the optimizer's under `optimizer/<slot>/<parameter>`
//! (`optimizer/exp_avg/fc1.weight`), and in its metadata: the steps taken, the model's
//! step-seed counter (its dropout masks), a loss-scaled model's loss scale, the
//! optimizer's kind and counters, and the settings of the run that wrote it
//! (`kiln.state.run.<key>`), which a resume must repeat. What else a loop needs is a
//! function of those: a [`Schedule`] is a function of the step, and a loop's data
//! order a function of its seed and the step.
//! Every tensor's checksum is verified on load, and so is one over that metadata: the
//! counts in it decide the steps a resume takes as much as the tensors do.
//!
//! [`Schedule`]: crate::schedule::Schedule

use crate::checkpoint::{self, Checksums, Encoded, ReadTensor, Reader, Tensors};
use crate::optim::{Optimizer, OptimizerState};
use kiln_tensor::nn::{LossScaleState, Module};
use kiln_tensor::{Backend, Error, Result};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// The metadata key that marks a training state, with its format's version.
const VERSION_KEY: &str = "kiln.state.version";
/// Version 2 checksums the metadata ([`METADATA_CHECKSUM_KEY`]); version 1 did not.
const VERSION: &str = "2";
/// The key of the checksum over every other `kiln.state.` entry of the metadata.
const METADATA_CHECKSUM_KEY: &str = "kiln.state.checksum";
/// The prefix of the metadata a state's checksum covers.
const STATE_PREFIX: &str = "kiln.state.";
const STEP_KEY: &str = "kiln.state.step";
const SEEDS_KEY: &str = "kiln.state.seed_steps";
/// A loss-scaled model's scale, its good steps in a row and the steps it skipped.
const LOSS_SCALE_KEY: &str = "kiln.state.loss_scale";
const SCALE_GOOD_KEY: &str = "kiln.state.loss_scale_good_steps";
const SCALE_SKIPPED_KEY: &str = "kiln.state.loss_scale_skipped";
const OPTIMIZER_KEY: &str = "kiln.state.optimizer";
const COUNTER_KEY: &str = "kiln.state.counter.";
const RUN_KEY: &str = "kiln.state.run.";
/// The tensor-name prefix of the optimizer's state.
const OPTIMIZER_TENSOR: &str = "optimizer/";

/// Writes `model`, `opt`'s state, the `step`s taken and the settings of the `run` (its
/// flags, say, and a fingerprint of its data) to the training state at `path`,
/// atomically: a crash leaves the previous state or this one.
pub fn save<B: Backend, M: Module<B>, O: Optimizer<B>>(
    path: impl AsRef<Path>,
    model: &M,
    opt: &O,
    step: u64,
    run: &BTreeMap<String, String>,
) -> Result<()> {
    save_state(path.as_ref(), model, opt, step, run)
}

/// [`save`] of any model and optimizer.
#[inline(never)]
pub(crate) fn save_state<B: Backend>(
    path: &Path,
    model: &dyn Tensors<B>,
    opt: &dyn Optimizer<B>,
    step: u64,
    run: &BTreeMap<String, String>,
) -> Result<()> {
    let mut entries = checkpoint::model_entries(model)?;
    let opt_state = opt.state();
    for ((slot, name), t) in &opt_state.tensors {
        entries.push((format!("{OPTIMIZER_TENSOR}{slot}/{name}"), Encoded::of(t)?));
    }
    let mut meta = BTreeMap::from([
        (VERSION_KEY.to_string(), VERSION.to_string()),
        (STEP_KEY.to_string(), step.to_string()),
        (OPTIMIZER_KEY.to_string(), opt_state.kind.clone()),
    ]);
    if let Some(seeds) = model.step_seeds() {
        meta.insert(SEEDS_KEY.to_string(), seeds.steps().to_string());
    }
    if let Some(scale) = model.loss_scale() {
        let s = scale.state();
        meta.insert(LOSS_SCALE_KEY.to_string(), s.scale.to_string());
        meta.insert(SCALE_GOOD_KEY.to_string(), s.good_steps.to_string());
        meta.insert(SCALE_SKIPPED_KEY.to_string(), s.skipped.to_string());
    }
    for ((slot, name), n) in &opt_state.counters {
        meta.insert(format!("{COUNTER_KEY}{slot}/{name}"), n.to_string());
    }
    for (k, v) in run {
        meta.insert(format!("{RUN_KEY}{k}"), v.clone());
    }
    meta.insert(METADATA_CHECKSUM_KEY.to_string(), metadata_checksum(&meta));
    checkpoint::write_file(path, entries, &meta)
}

/// The checksum of a state's metadata: every `kiln.state.` entry but the checksum's
/// own, in key order, each key and value with its length (so no two sets of entries
/// encode alike).
fn metadata_checksum(meta: &BTreeMap<String, String>) -> String {
    let mut text = String::new();
    for (k, v) in meta
        .iter()
        .filter(|(k, _)| k.starts_with(STATE_PREFIX) && *k != METADATA_CHECKSUM_KEY)
    {
        text += &format!("{}:{k}={}:{v}\n", k.len(), v.len());
    }
    kiln_safetensors::checksum(text.as_bytes())
}

/// Whether `meta`, a file's metadata, is a training state's (any version's):
/// quantising refuses one by it, its optimizer's moments being no weights.
pub(crate) fn is_training_state(meta: &BTreeMap<String, String>) -> bool {
    meta.keys().any(|k| k.starts_with(STATE_PREFIX))
}

/// Refuses a version-1 or foreign state, and one whose metadata does not match its
/// checksum (an edited step count, counter or setting).
fn check_metadata(path: &Path, meta: &BTreeMap<String, String>) -> Result<()> {
    let bad = |why: String| Error::Format(format!("`{}` {why}", path.display()));
    match meta.get(VERSION_KEY).map(String::as_str) {
        Some(VERSION) => {}
        Some("1") => return Err(bad("is a training state of version 1, whose step counts and settings carry no checksum; this Kiln resumes only from states it can verify (start the run again, or resume with the Kiln that wrote it)".into())),
        Some(v) => return Err(bad(format!("is a training state of version {v}, which this Kiln does not read"))),
        None => return Err(bad("is not a training state (a checkpoint holds parameters only; resume from the state file a training run writes)".into())),
    }
    match meta.get(METADATA_CHECKSUM_KEY) {
        Some(c) if *c == metadata_checksum(meta) => Ok(()),
        Some(_) => Err(bad("has metadata (its step count, counters or run settings) that does not match its checksum: the file was edited or damaged".into())),
        None => Err(bad(format!("lacks `{METADATA_CHECKSUM_KEY}`, the checksum of its metadata"))),
    }
}

/// Restores `model` and `opt` from the training state at `path` and returns the steps
/// it had taken, once the state proves to be what `run` would have written: its
/// settings the same (each difference is named, with both values), its optimizer of
/// `opt`'s kind, every tensor present, of the model's shape and dtype, and matching
/// its checksum. On an error, the model and the optimizer are left unchanged.
pub fn load<B: Backend, M: Module<B>, O: Optimizer<B>>(
    path: impl AsRef<Path>,
    model: &mut M,
    opt: &mut O,
    run: &BTreeMap<String, String>,
) -> Result<u64> {
    load_state(path.as_ref(), model, opt, run)
}

/// [`load`] into any model and optimizer.
#[inline(never)]
pub(crate) fn load_state<B: Backend>(
    path: &Path,
    model: &mut dyn Tensors<B>,
    opt: &mut dyn Optimizer<B>,
    run: &BTreeMap<String, String>,
) -> Result<u64> {
    let file = Reader::open(path)?;
    let meta = file.metadata();
    let bad = |why: String| Error::Format(format!("`{}` {why}", path.display()));
    check_metadata(path, meta)?;
    check_run(path, meta, run)?;
    let number = |key: &str| -> Result<u64> {
        let v = meta.get(key).ok_or_else(|| bad(format!("lacks `{key}`")))?;
        v.parse()
            .map_err(|_| bad(format!("has `{key}` = {v:?}, not a count")))
    };
    let step = number(STEP_KEY)?;
    let seed_steps = match model.step_seeds() {
        Some(_) => Some(number(SEEDS_KEY)?),
        None => None,
    };
    let loss_scale = match model.loss_scale() {
        Some(_) => {
            let v = meta.get(LOSS_SCALE_KEY).ok_or_else(|| {
                bad(format!(
                    "lacks `{LOSS_SCALE_KEY}`: it was not written by a loss-scaled (f16) run"
                ))
            })?;
            let scale: f32 = v
                .parse()
                .map_err(|_| bad(format!("has `{LOSS_SCALE_KEY}` = {v:?}, not a number")))?;
            let state = LossScaleState {
                scale,
                good_steps: number(SCALE_GOOD_KEY)?,
                skipped: number(SCALE_SKIPPED_KEY)?,
            };
            // Checked before anything changes, so that an error leaves the model as it was.
            state
                .check()
                .map_err(|e| bad(format!("holds a loss scale that does not fit: {e}")))?;
            Some(state)
        }
        None => None,
    };
    let kind = meta.get(OPTIMIZER_KEY).map_or("", String::as_str);
    let expected_kind = opt.state().kind;
    if kind != expected_kind {
        return Err(bad(format!(
            "holds the state of optimizer `{kind}`, not `{expected_kind}`"
        )));
    }

    let prepared = checkpoint::prepare_load(model, &file, Checksums::Required, &|n| {
        n.starts_with(OPTIMIZER_TENSOR)
    })?;
    let mut params = HashMap::new();
    model.visit_params("", &mut |s| {
        params.insert(s.name.to_string(), s.value.clone());
    });
    let mut opt_state = OptimizerState::empty(kind);
    for name in file.names() {
        let Some(rest) = name.strip_prefix(OPTIMIZER_TENSOR) else {
            continue;
        };
        let (slot, param) = rest.split_once('/').ok_or_else(|| {
            bad(format!(
                "has `{name}`, which names no optimizer slot and parameter"
            ))
        })?;
        let p = params.get(param).ok_or_else(|| {
            bad(format!(
                "has optimizer state `{name}` for `{param}`, which the model lacks"
            ))
        })?;
        let shape = &file.info(&name).expect("a name the file lists").shape;
        if shape != p.dims().as_slice() {
            return Err(bad(format!(
                "has optimizer state `{name}` of dims {shape:?} for a parameter of dims {:?}",
                p.dims().as_slice()
            )));
        }
        let t = file.tensor(&name, Checksums::Required, p.device())?;
        opt_state
            .tensors
            .insert((slot.to_string(), param.to_string()), t);
    }
    for (key, rest) in meta
        .keys()
        .filter_map(|k| Some((k, k.strip_prefix(COUNTER_KEY)?)))
    {
        let (slot, param) = rest.split_once('/').ok_or_else(|| {
            bad(format!(
                "has counter `{key}`, which names no slot and parameter"
            ))
        })?;
        if !params.contains_key(param) {
            return Err(bad(format!(
                "has optimizer counter `{key}` for `{param}`, which the model lacks"
            )));
        }
        opt_state
            .counters
            .insert((slot.to_string(), param.to_string()), number(key)?);
    }
    opt.load_state(opt_state)
        .map_err(|e| bad(format!("holds an optimizer state that does not fit: {e}")))?;
    checkpoint::apply_load(model, path, prepared)?;
    if let (Some(seeds), Some(n)) = (model.step_seeds(), seed_steps) {
        seeds.set_steps(n);
    }
    if let (Some(scale), Some(state)) = (model.loss_scale(), loss_scale) {
        scale.load_state(state)?;
    }
    Ok(step)
}

/// Checks that the file at `path` is a complete training state, every tensor matching
/// its checksum, and returns the steps it records (what a resume would start from).
pub fn verify(path: impl AsRef<Path>) -> Result<u64> {
    let path = path.as_ref();
    let file = Reader::open(path)?;
    let meta = file.metadata();
    check_metadata(path, meta)?;
    file.require(Checksums::Required)?;
    for name in file.names() {
        file.bytes(&name, Checksums::Required)?;
    }
    let step = meta.get(STEP_KEY).and_then(|v| v.parse().ok());
    step.ok_or_else(|| Error::Format(format!("`{}` records no step count", path.display())))
}

/// An error naming every setting of `run` that differs from the one recorded in
/// `meta`.
fn check_run(
    path: &Path,
    meta: &BTreeMap<String, String>,
    run: &BTreeMap<String, String>,
) -> Result<()> {
    let recorded: BTreeMap<&str, &str> = meta
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix(RUN_KEY)?, v.as_str())))
        .collect();
    let mut keys: Vec<&str> = recorded.keys().copied().collect();
    keys.extend(run.keys().map(String::as_str));
    keys.sort_unstable();
    keys.dedup();
    let differences: Vec<String> = keys
        .into_iter()
        .filter_map(|k| {
            let (was, now) = (recorded.get(k).copied(), run.get(k).map(String::as_str));
            (was != now).then(|| {
                format!(
                    "{k}: {} there, {} here",
                    was.unwrap_or("(not set)"),
                    now.unwrap_or("(not set)")
                )
            })
        })
        .collect();
    if differences.is_empty() {
        return Ok(());
    }
    Err(Error::invalid(
        "resume",
        format!(
            "`{}` was written by a run with other settings ({}): resume with the same settings, or start afresh",
            path.display(),
            differences.join("; ")
        ),
    ))
}
