//! Training states: a run continued from one takes bit for bit the steps the
//! uninterrupted run takes, for each optimizer; a state that does not fit the run,
//! the model or the optimizer, or that was damaged, is refused by name and leaves both
//! unchanged.

use kiln_cpu::{Cpu, CpuDevice};
use kiln_tensor::nn::{Linear, LinearGrads, Module, Slot};
use kiln_tensor::{RawTensor, Result};
use kiln_train::checkpoint::save;
use kiln_train::optim::{AdamW, AdamWConfig, Optimizer, Sgd, SgdConfig};
use kiln_train::state;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

const DEV: CpuDevice = CpuDevice;
type Net = Linear<Cpu, 3, 2>;

/// A fresh, empty folder for one test.
fn scratch(test: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("kiln-train-state")
        .join(test);
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// Step `i`'s gradients: different each step, so that state carried wrongly shows.
fn grads(i: u32) -> Result<LinearGrads<Cpu, 3, 2>> {
    let f = |k: u32| ((i * 7 + k * 3) % 11) as f32 * 0.1 - 0.5;
    LinearGrads::from_raw(vec![
        RawTensor::from_vec((0..6).map(f).collect(), &[2, 3], &DEV)?,
        RawTensor::from_vec((6..8).map(f).collect(), &[2], &DEV)?,
    ])
}

/// Every tensor of a module, by name, as bits.
fn bits<M: Module<Cpu>>(m: &M) -> Vec<(String, Vec<u32>)> {
    let mut out = Vec::new();
    m.visit_params("", &mut |s: Slot<'_, Cpu>| {
        let v = s.value.to_vec::<f32>().unwrap();
        out.push((
            s.name.to_string(),
            v.into_iter().map(f32::to_bits).collect(),
        ));
    });
    out
}

fn run_settings(lr: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("--lr".to_string(), lr.to_string()),
        ("--seed".to_string(), "1".to_string()),
    ])
}

/// Takes steps `from..to` with `opt`, setting a learning rate per step.
fn steps(model: &mut Net, opt: &mut impl Optimizer<Cpu>, from: u32, to: u32) -> Result<()> {
    for i in from..to {
        opt.set_lr(0.05 + 0.01 * i as f64)?;
        opt.step(model, &grads(i)?)?;
    }
    Ok(())
}

/// Interrupted after 3 of 7 steps and resumed from the state, `make`'s optimizer ends
/// where the uninterrupted run does, bit for bit.
fn resumes_bit_for_bit<O: Optimizer<Cpu>>(test: &str, make: impl Fn() -> O) -> Result<()> {
    let path = scratch(test).join("state.safetensors");
    let mut model = Net::init(&DEV, 4)?;
    let mut opt = make();
    steps(&mut model, &mut opt, 0, 3)?;
    state::save(&path, &model, &opt, 3, &run_settings("0.05"))?;
    steps(&mut model, &mut opt, 3, 7)?;

    let mut resumed = Net::init(&DEV, 99)?;
    let mut opt2 = make();
    assert_eq!(
        state::load(&path, &mut resumed, &mut opt2, &run_settings("0.05"))?,
        3
    );
    steps(&mut resumed, &mut opt2, 3, 7)?;
    assert_eq!(bits(&resumed), bits(&model));
    Ok(())
}

#[test]
fn sgd_with_momentum_resumes_bit_for_bit() -> Result<()> {
    resumes_bit_for_bit("sgd", || {
        Sgd::new(SgdConfig {
            momentum: 0.9,
            weight_decay: 1e-3,
            ..SgdConfig::default()
        })
        .unwrap()
    })
}

#[test]
fn adamw_resumes_bit_for_bit() -> Result<()> {
    resumes_bit_for_bit("adamw", || {
        AdamW::new(AdamWConfig {
            weight_decay: 0.1,
            ..AdamWConfig::default()
        })
        .unwrap()
    })
}

/// A state's load error, checking the model and the optimizer were left unchanged.
fn refused(path: &Path, opt: &mut impl Optimizer<Cpu>, settings: &str) -> String {
    let mut model = Net::init(&DEV, 99).unwrap();
    let (before, opt_before) = (bits(&model), opt.state().tensors.len());
    let e = match state::load(path, &mut model, opt, &run_settings(settings)) {
        Err(e) => e.to_string(),
        Ok(step) => panic!("{} loaded (step {step})", path.display()),
    };
    assert_eq!(bits(&model), before, "the model changed: {e}");
    assert_eq!(
        opt.state().tensors.len(),
        opt_before,
        "the optimizer changed: {e}"
    );
    e
}

#[test]
fn states_that_do_not_fit_are_refused_by_name() -> Result<()> {
    let dir = scratch("refused");
    let path = dir.join("state.safetensors");
    let sgd = || {
        Sgd::<Cpu>::new(SgdConfig {
            momentum: 0.9,
            ..SgdConfig::default()
        })
        .unwrap()
    };
    let mut model = Net::init(&DEV, 4)?;
    let mut opt = sgd();
    steps(&mut model, &mut opt, 0, 2)?;
    state::save(&path, &model, &opt, 2, &run_settings("0.05"))?;

    // Other settings: each difference named, with both values.
    let e = refused(&path, &mut sgd(), "0.1");
    assert!(e.contains("--lr: 0.05 there, 0.1 here"), "{e}");
    // Another optimizer.
    let e = refused(&path, &mut AdamW::new(AdamWConfig::default())?, "0.05");
    assert!(e.contains("optimizer `sgd`, not `adamw`"), "{e}");
    // A checkpoint is not a training state.
    let plain = dir.join("plain.safetensors");
    save(&model, &plain)?;
    let e = refused(&plain, &mut sgd(), "0.05");
    assert!(e.contains("is not a training state"), "{e}");
    // A flipped byte in the optimizer's momentum names that tensor.
    let bytes = fs::read(&path)?;
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let name = "optimizer/momentum_buffer/weight";
    let at = 8 + n + header[name]["data_offsets"][0].as_u64().unwrap() as usize;
    let mut b = bytes.clone();
    b[at + 2] ^= 0x04;
    let flipped = dir.join("flipped.safetensors");
    fs::write(&flipped, &b)?;
    let e = refused(&flipped, &mut sgd(), "0.05");
    assert!(
        e.contains(&format!("tensor `{name}` does not match its checksum")),
        "{e}"
    );
    // Momentum buffers for an SGD without momentum.
    let mut plain_sgd = Sgd::<Cpu>::new(SgdConfig::default())?;
    let e = refused(&path, &mut plain_sgd, "0.05");
    assert!(e.contains("this SGD has no momentum"), "{e}");
    Ok(())
}

/// `path`'s file with metadata entry `key` set to `value` (the header rewritten, the
/// tensors' bytes untouched), written beside it.
fn with_metadata(path: &Path, key: &str, value: &str) -> PathBuf {
    let bytes = fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    header["__metadata__"][key] = serde_json::Value::String(value.to_string());
    let text = serde_json::to_vec(&header).unwrap();
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend(text);
    out.extend(&bytes[8 + n..]);
    let edited = path.with_file_name(format!("edited-{}.safetensors", key.replace('/', "_")));
    fs::write(&edited, out).unwrap();
    edited
}

/// Every count and setting a resume goes on from is verified: an edited step count,
/// Adam step counter, dropout-seed counter or run setting is refused by the checksum
/// over the metadata, as is a state without one (version 1, before it existed).
#[test]
fn edited_metadata_is_refused() -> Result<()> {
    let path = scratch("edited").join("state.safetensors");
    let adamw = || AdamW::<Cpu>::new(AdamWConfig::default()).unwrap();
    let mut model = Net::init(&DEV, 4)?;
    let mut opt = adamw();
    steps(&mut model, &mut opt, 0, 5)?;
    state::save(&path, &model, &opt, 50, &run_settings("0.05"))?;
    let header = |p: &Path| -> BTreeMap<String, String> {
        let bytes = fs::read(p).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let h: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
        serde_json::from_value(h["__metadata__"].clone()).unwrap()
    };
    let meta = header(&path);
    let counter = meta
        .keys()
        .find(|k| k.starts_with("kiln.state.counter."))
        .expect("AdamW records per-parameter step counters")
        .clone();
    // The edit that checks the test: the same value written back loads.
    let same = with_metadata(&path, "kiln.state.step", "50");
    assert_eq!(
        state::load(
            &same,
            &mut Net::init(&DEV, 9)?,
            &mut adamw(),
            &run_settings("0.05")
        )?,
        50
    );
    for (key, value) in [
        ("kiln.state.step", "40"),
        (counter.as_str(), "4"),
        ("kiln.state.run.--seed", "2"),
        ("kiln.state.optimizer", "adamw "),
    ] {
        assert_ne!(meta.get(key).map(String::as_str), Some(value));
        let edited = with_metadata(&path, key, value);
        let e = refused(&edited, &mut adamw(), "0.05");
        assert!(e.contains("does not match its checksum"), "{key}: {e}");
        let e = state::verify(&edited).unwrap_err().to_string();
        assert!(e.contains("does not match its checksum"), "{key}: {e}");
    }
    let old = with_metadata(&path, "kiln.state.version", "1");
    let e = refused(&old, &mut adamw(), "0.05");
    assert!(e.contains("version 1, whose step counts"), "{e}");
    Ok(())
}
