//! Safetensors checkpoints: bit-exact round trips (parameters and buffers, every
//! dtype), atomic writes, every way a file can fail to fit a model, and a file written
//! by PyTorch.

use kiln_cpu::{Cpu, CpuDevice};
use kiln_tensor::nn::{
    join, BatchNorm2d, BatchNorm2dGrads, Linear, LinearGrads, LoadFn, Module, Slot, StepSeeds,
    UpdateFn,
};
use kiln_tensor::{bf16, f16, DType, Error, HostData, RawTensor, Result, Tensor};
use kiln_train::checkpoint::{
    load, load_foreign, read_metadata, read_tensors, save, save_with_metadata, write_tensors,
    write_tensors_with_metadata,
};
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

const DEV: CpuDevice = CpuDevice;

/// A fresh, empty folder for one test.
fn scratch(test: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("kiln-train-checkpoint")
        .join(test);
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// A small model with nested names, buffers and a training-step counter, as
/// `#[model]` would generate it.
struct Net {
    fc1: Linear<Cpu, 3, 4>,
    norm: BatchNorm2d<Cpu, 4>,
    fc2: Linear<Cpu, 4, 2>,
    seeds: StepSeeds<Cpu>,
}

impl Module<Cpu> for Net {
    type Grads = (
        LinearGrads<Cpu, 3, 4>,
        BatchNorm2dGrads<Cpu, 4>,
        LinearGrads<Cpu, 4, 2>,
    );

    fn init_named(device: &CpuDevice, seed: u64, prefix: &str) -> Result<Self> {
        Ok(Net {
            fc1: Module::init_named(device, seed, &join(prefix, "fc1"))?,
            norm: Module::init_named(device, seed, &join(prefix, "norm"))?,
            fc2: Module::init_named(device, seed, &join(prefix, "fc2"))?,
            seeds: StepSeeds::new(seed),
        })
    }

    fn step_seeds(&self) -> Option<&StepSeeds<Cpu>> {
        Some(&self.seeds)
    }

    fn visit_params(&self, prefix: &str, f: &mut dyn FnMut(Slot<'_, Cpu>)) {
        self.fc1.visit_params(&join(prefix, "fc1"), f);
        self.norm.visit_params(&join(prefix, "norm"), f);
        self.fc2.visit_params(&join(prefix, "fc2"), f);
    }

    fn visit_buffers(&self, prefix: &str, f: &mut dyn FnMut(Slot<'_, Cpu>)) {
        self.fc1.visit_buffers(&join(prefix, "fc1"), f);
        self.norm.visit_buffers(&join(prefix, "norm"), f);
        self.fc2.visit_buffers(&join(prefix, "fc2"), f);
    }

    fn update_params(
        &mut self,
        grads: &Self::Grads,
        prefix: &str,
        f: &mut UpdateFn<'_, Cpu>,
    ) -> Result<()> {
        self.fc1.update_params(&grads.0, &join(prefix, "fc1"), f)?;
        self.norm
            .update_params(&grads.1, &join(prefix, "norm"), f)?;
        self.fc2.update_params(&grads.2, &join(prefix, "fc2"), f)
    }

    fn load_named(&mut self, prefix: &str, get: &mut LoadFn<'_, Cpu>) -> Result<()> {
        self.fc1.load_named(&join(prefix, "fc1"), get)?;
        self.norm.load_named(&join(prefix, "norm"), get)?;
        self.fc2.load_named(&join(prefix, "fc2"), get)
    }
}

/// A net whose buffers hold something other than their initial values.
fn net(seed: u64) -> Result<Net> {
    let n = Net::init(&DEV, seed)?;
    let s = seed as f32;
    n.norm.running_mean.set(Tensor::from_vec(
        vec![0.5 * s, -1.0, 2.0, 1e-30],
        &[4],
        &DEV,
    )?);
    n.norm.running_var.set(Tensor::from_vec(
        vec![3.0, s, 0.25, f32::MIN_POSITIVE / 4.0],
        &[4],
        &DEV,
    )?);
    Ok(n)
}

/// Every tensor of a module, by name, as bits (so -0.0, NaN payloads and subnormals
/// count).
fn contents<M: Module<Cpu>>(m: &M) -> Vec<(String, Vec<usize>, Vec<u32>)> {
    let mut out = Vec::new();
    let mut push = |s: Slot<'_, Cpu>| {
        let bits = s
            .value
            .to_vec::<f32>()
            .unwrap()
            .into_iter()
            .map(f32::to_bits)
            .collect();
        out.push((s.name.to_string(), s.value.dims().to_vec(), bits));
    };
    m.visit_params("", &mut push);
    m.visit_buffers("", &mut push);
    out
}

#[test]
fn round_trip_is_bit_exact_with_buffers() -> Result<()> {
    let dir = scratch("round_trip");
    let path = dir.join("net.safetensors");
    let a = net(1)?;
    save(&a, &path)?;
    let mut b = net(2)?;
    assert_ne!(contents(&a), contents(&b));
    load(&mut b, &path)?;
    assert_eq!(contents(&a), contents(&b));

    let names: Vec<String> = read_tensors::<Cpu>(&path, &DEV)?
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    let want = [
        "fc1.bias",
        "fc1.weight",
        "fc2.bias",
        "fc2.weight",
        "norm.bias",
        "norm.running_mean",
        "norm.running_var",
        "norm.weight",
    ];
    assert_eq!(names, want);
    Ok(())
}

#[test]
fn every_dtype_round_trips_bit_exactly() -> Result<()> {
    let dir = scratch("dtypes");
    let path = dir.join("all.safetensors");
    let nan_payload = f32::from_bits(0x7fc0_1234);
    let tensors: Vec<(&str, RawTensor<Cpu>)> = vec![
        (
            "f32",
            RawTensor::from_vec(
                vec![1.5f32, -0.0, f32::INFINITY, nan_payload, 1e-45, f32::MAX],
                &[2, 3],
                &DEV,
            )?,
        ),
        (
            "f64",
            RawTensor::from_vec(vec![std::f64::consts::PI, -1e-310, f64::MIN], &[3], &DEV)?,
        ),
        (
            "f16",
            RawTensor::from_vec(
                vec![f16::from_f64(0.1), f16::MAX, f16::from_bits(1)],
                &[3, 1],
                &DEV,
            )?,
        ),
        (
            "bf16",
            RawTensor::from_vec(
                vec![bf16::from_f64(-3.25), bf16::from_bits(0x7f7f)],
                &[1, 2],
                &DEV,
            )?,
        ),
        (
            "i32",
            RawTensor::from_vec(vec![i32::MIN, -1, 0, i32::MAX], &[2, 2], &DEV)?,
        ),
        (
            "u32",
            RawTensor::from_vec(vec![0u32, 7, u32::MAX], &[3], &DEV)?,
        ),
        (
            "bool",
            RawTensor::from_vec(vec![true, false, false, true, true], &[5], &DEV)?,
        ),
        ("scalar", RawTensor::from_vec(vec![42.0f32], &[], &DEV)?),
        (
            "rank6",
            RawTensor::from_vec(
                (0..64).map(|i| i as f32).collect(),
                &[2, 2, 2, 2, 2, 2],
                &DEV,
            )?,
        ),
    ];
    let refs: Vec<(&str, &RawTensor<Cpu>)> = tensors.iter().map(|(n, t)| (*n, t)).collect();
    let meta = BTreeMap::from([
        ("epoch".to_string(), "3".to_string()),
        ("model".to_string(), "net".to_string()),
    ]);
    write_tensors_with_metadata(&path, &refs, &meta)?;

    let back = read_tensors::<Cpu>(&path, &DEV)?;
    let mut want = tensors.clone();
    want.sort_by_key(|(n, _)| *n);
    assert_eq!(back.len(), want.len());
    for ((name, got), (want_name, want)) in back.iter().zip(&want) {
        assert_eq!(name, want_name);
        assert_eq!(got.dims(), want.dims(), "{name}");
        assert_eq!(got.dtype(), want.dtype(), "{name}");
        assert_eq!(bits(&got.to_host()?), bits(&want.to_host()?), "{name}");
    }
    assert_eq!(read_metadata(&path)?, meta);
    Ok(())
}

/// Host values as bit patterns.
fn bits(h: &HostData) -> Vec<u64> {
    match h {
        HostData::F32(v) => v.iter().map(|x| x.to_bits() as u64).collect(),
        HostData::F64(v) => v.iter().map(|x| x.to_bits()).collect(),
        HostData::F16(v) => v.iter().map(|x| x.to_bits() as u64).collect(),
        HostData::BF16(v) => v.iter().map(|x| x.to_bits() as u64).collect(),
        HostData::I32(v) => v.iter().map(|&x| x as u32 as u64).collect(),
        HostData::U32(v) => v.iter().map(|&x| x as u64).collect(),
        HostData::Bool(v) => v.iter().map(|&x| x as u64).collect(),
        HostData::I8(v) => v.iter().map(|&x| x as u8 as u64).collect(),
    }
}

#[test]
fn strided_views_are_written_in_logical_order() -> Result<()> {
    let dir = scratch("strided");
    let path = dir.join("t.safetensors");
    let t = RawTensor::<Cpu>::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], &DEV)?
        .transpose(0, 1)?;
    write_tensors(&path, &[("t", &t)])?;
    let back = read_tensors::<Cpu>(&path, &DEV)?;
    assert_eq!(back[0].1.dims().as_slice(), &[3, 2]);
    assert_eq!(
        back[0].1.to_vec::<f32>()?,
        vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]
    );
    Ok(())
}

#[test]
fn saving_replaces_atomically_and_leaves_no_temporary_file() -> Result<()> {
    let dir = scratch("atomic");
    let path = dir.join("net.safetensors");
    save(&net(1)?, &path)?;
    let second = net(2)?;
    save_with_metadata(
        &second,
        &path,
        &BTreeMap::from([("step".to_string(), "200".to_string())]),
    )?;
    let entries: Vec<_> = fs::read_dir(&dir)?
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(entries, vec![std::ffi::OsString::from("net.safetensors")]);
    let mut loaded = net(3)?;
    load(&mut loaded, &path)?;
    assert_eq!(contents(&loaded), contents(&second));
    assert_eq!(
        read_metadata(&path)?.get("step").map(String::as_str),
        Some("200")
    );

    // A folder that does not exist: an I/O error naming the path, nothing created.
    let missing = dir.join("no-such-folder").join("net.safetensors");
    match save(&second, &missing) {
        Err(Error::Io(e)) => assert!(e.to_string().contains("no-such-folder"), "{e}"),
        other => panic!("expected an I/O error, got {other:?}"),
    }
    assert!(!dir.join("no-such-folder").exists());
    Ok(())
}

#[test]
fn write_tensors_refuses_duplicate_and_reserved_names() -> Result<()> {
    let dir = scratch("names");
    let t = RawTensor::<Cpu>::zeros(&[2], DType::F32, &DEV)?;
    let e = write_tensors(dir.join("a.safetensors"), &[("w", &t), ("w", &t)]).unwrap_err();
    assert!(e.to_string().contains("`w`"), "{e}");
    assert!(write_tensors(dir.join("b.safetensors"), &[("__metadata__", &t)]).is_err());
    assert_eq!(
        fs::read_dir(&dir)?.count(),
        0,
        "a refused write must create nothing"
    );
    Ok(())
}

/// Loads `path` into a fresh `Linear<3, 2>`, expecting a format error; checks the
/// model is unchanged and returns the message.
fn load_error(path: &Path) -> String {
    let mut model = Linear::<Cpu, 3, 2>::init(&DEV, 9).unwrap();
    let before = contents(&model);
    let e = match load(&mut model, path) {
        Err(e @ Error::Format(_)) => e.to_string(),
        Err(e) => panic!("expected a format error, got {e:?}"),
        Ok(()) => panic!("loading {} should fail", path.display()),
    };
    assert_eq!(
        contents(&model),
        before,
        "a failed load must leave the model as it was"
    );
    e
}

fn f32s(dims: &[usize]) -> RawTensor<Cpu> {
    let n = dims.iter().product::<usize>();
    RawTensor::from_vec((0..n).map(|i| i as f32 * 0.5).collect(), dims, &DEV).unwrap()
}

fn write(path: &Path, tensors: &[(&str, RawTensor<Cpu>)]) {
    let refs: Vec<(&str, &RawTensor<Cpu>)> = tensors.iter().map(|(n, t)| (*n, t)).collect();
    write_tensors(path, &refs).unwrap();
}

#[test]
fn mismatched_files_name_the_tensor_and_both_sides() -> Result<()> {
    let dir = scratch("mismatch");

    let p = dir.join("wrong_shape.safetensors");
    write(&p, &[("weight", f32s(&[3, 2])), ("bias", f32s(&[2]))]);
    let e = load_error(&p);
    assert!(
        e.contains("tensor `weight`: the model has [2, 3] f32, the file has [3, 2] f32"),
        "{e}"
    );

    let p = dir.join("wrong_dtype.safetensors");
    write(
        &p,
        &[
            ("weight", f32s(&[2, 3]).cast(DType::F64)?),
            ("bias", f32s(&[2])),
        ],
    );
    let e = load_error(&p);
    assert!(
        e.contains("tensor `weight`: the model has [2, 3] f32, the file has [2, 3] f64"),
        "{e}"
    );

    let p = dir.join("missing.safetensors");
    write(&p, &[("weight", f32s(&[2, 3]))]);
    let e = load_error(&p);
    assert!(
        e.contains("missing tensor `bias`: the model has [2] f32"),
        "{e}"
    );

    let p = dir.join("extra.safetensors");
    write(
        &p,
        &[
            ("weight", f32s(&[2, 3])),
            ("bias", f32s(&[2])),
            ("fc9.weight", f32s(&[1, 2])),
        ],
    );
    let e = load_error(&p);
    assert!(e.contains("extra tensor `fc9.weight` ([1, 2] f32)"), "{e}");
    assert!(
        e.contains(&p.display().to_string()),
        "the message names the file: {e}"
    );

    // Several problems at once are all reported.
    let p = dir.join("several.safetensors");
    write(&p, &[("weight", f32s(&[2, 2])), ("other", f32s(&[1]))]);
    let e = load_error(&p);
    assert!(
        e.contains("`weight`") && e.contains("`bias`") && e.contains("`other`"),
        "{e}"
    );

    // The good file loads.
    let p = dir.join("good.safetensors");
    write(&p, &[("weight", f32s(&[2, 3])), ("bias", f32s(&[2]))]);
    let mut model = Linear::<Cpu, 3, 2>::init(&DEV, 9)?;
    load(&mut model, &p)?;
    assert_eq!(model.weight.to_vec()?, vec![0.0, 0.5, 1.0, 1.5, 2.0, 2.5]);
    Ok(())
}

/// A safetensors file from a header written by hand.
fn raw_file(path: &Path, header: &str, data: &[u8]) {
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(data);
    fs::write(path, bytes).unwrap();
}

#[test]
fn dtypes_kiln_lacks_and_invalid_bools_are_errors() {
    let dir = scratch("foreign_dtypes");
    let p = dir.join("i64.safetensors");
    raw_file(
        &p,
        r#"{"weight":{"dtype":"I64","shape":[2,3],"data_offsets":[0,48]},"bias":{"dtype":"F32","shape":[2],"data_offsets":[48,56]}}"#,
        &[0; 56],
    );
    let e = load_error(&p);
    assert!(
        e.contains("the file has [2, 3] i64 (not a kiln dtype)"),
        "{e}"
    );
    let e = read_tensors::<Cpu>(&p, &DEV).unwrap_err().to_string();
    assert!(e.contains("`weight`") && e.contains("i64"), "{e}");

    let p = dir.join("bool.safetensors");
    raw_file(
        &p,
        r#"{"mask":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}}"#,
        &[1, 0, 2],
    );
    let e = read_tensors::<Cpu>(&p, &DEV).unwrap_err().to_string();
    assert!(e.contains("`mask`") && e.contains("byte 2"), "{e}");
}

#[test]
fn corrupt_files_are_errors() -> Result<()> {
    let dir = scratch("corrupt");
    let good = dir.join("good.safetensors");
    write(&good, &[("weight", f32s(&[2, 3])), ("bias", f32s(&[2]))]);
    let bytes = fs::read(&good)?;
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;

    let mut cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", vec![]),
        ("shorter than the length field", bytes[..5].to_vec()),
        (
            "cut inside the header",
            bytes[..8 + header_len / 2].to_vec(),
        ),
        ("cut inside the data", bytes[..bytes.len() - 3].to_vec()),
        ("one byte too long", [bytes.as_slice(), &[0]].concat()),
        (
            "not safetensors",
            b"PK\x03\x04 this is a zip file, not a checkpoint".to_vec(),
        ),
    ];
    let mut flip = |what, at: usize, xor: u8| {
        let mut b = bytes.clone();
        b[at] ^= xor;
        cases.push((what, b));
    };
    flip("header length's high byte", 7, 0x40);
    flip("header length's low byte", 0, 0x01);
    flip("header's opening brace", 8, 0x01);
    let header = String::from_utf8_lossy(&bytes[8..8 + header_len]).into_owned();
    let offsets = 8 + header.find("data_offsets").unwrap() + "data_offsets\":[".len();
    flip("a data offset", offsets, 0x02);
    let dtype = 8 + header.find("F32").unwrap() + 1;
    flip("a dtype's name", dtype, 0x20);

    for (what, b) in cases {
        let p = dir.join("bad.safetensors");
        fs::write(&p, &b)?;
        let e = load_error(&p);
        assert!(e.contains("not a valid safetensors file"), "{what}: {e}");
        assert!(read_tensors::<Cpu>(&p, &DEV).is_err(), "{what}");
    }

    match load(
        &mut Linear::<Cpu, 3, 2>::init(&DEV, 0)?,
        dir.join("absent.safetensors"),
    ) {
        Err(Error::Io(e)) => assert!(e.to_string().contains("absent.safetensors"), "{e}"),
        other => panic!("expected an I/O error, got {other:?}"),
    }
    Ok(())
}

#[test]
fn pytorch_fixture_loads_into_linear() -> Result<()> {
    // Written by `tests/fixtures/make_linear_3_2.py` with `safetensors.torch.save_file`.
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/linear_3_2.safetensors"
    );
    let mut model = Linear::<Cpu, 3, 2>::init(&DEV, 0)?;
    // It has no checksums: `load` refuses it and names the opt-out.
    let e = load(&mut model, path).unwrap_err().to_string();
    assert!(
        e.contains("has no tensor checksums") && e.contains("load_foreign"),
        "{e}"
    );
    load_foreign(&mut model, path)?;
    assert_eq!(
        model.weight.to_vec()?,
        vec![0.5, -1.25, 2.0, 0.125, 3.0, -0.75]
    );
    assert_eq!(model.bias.to_vec()?, vec![0.25, -0.5]);
    assert_eq!(
        read_metadata(path)?.get("format").map(String::as_str),
        Some("pt")
    );
    // The layout is PyTorch's [out, in]: y = W x + b for x = [1, 2, 3].
    let x = Tensor::<Cpu, kiln_tensor::Rank2<1, 3>>::from_vec(vec![1.0, 2.0, 3.0], &[1, 3], &DEV)?;
    assert_eq!(
        model.forward(&x)?.to_vec()?,
        vec![0.5 - 2.5 + 6.0 + 0.25, 0.125 + 6.0 - 2.25 - 0.5]
    );
    Ok(())
}

/// A module with a bool buffer, which no built-in layer has.
struct Masked {
    weight: RawTensor<Cpu>,
    mask: RawTensor<Cpu>,
}

impl Module<Cpu> for Masked {
    type Grads = RawTensor<Cpu>;

    fn init_named(device: &CpuDevice, _seed: u64, _prefix: &str) -> Result<Self> {
        Ok(Masked {
            weight: RawTensor::from_vec(vec![1.0f32, 2.0], &[2], device)?,
            mask: RawTensor::from_vec(vec![true, false], &[2], device)?,
        })
    }

    fn visit_params(&self, prefix: &str, f: &mut dyn FnMut(Slot<'_, Cpu>)) {
        f(Slot {
            name: &join(prefix, "weight"),
            value: &self.weight,
        });
    }

    fn visit_buffers(&self, prefix: &str, f: &mut dyn FnMut(Slot<'_, Cpu>)) {
        f(Slot {
            name: &join(prefix, "mask"),
            value: &self.mask,
        });
    }

    fn update_params(
        &mut self,
        grads: &RawTensor<Cpu>,
        prefix: &str,
        f: &mut UpdateFn<'_, Cpu>,
    ) -> Result<()> {
        f(&join(prefix, "weight"), &mut self.weight, grads)?;
        Ok(())
    }

    fn load_named(&mut self, prefix: &str, get: &mut LoadFn<'_, Cpu>) -> Result<()> {
        self.weight = get(&join(prefix, "weight"), &self.weight)?;
        self.mask = get(&join(prefix, "mask"), &self.mask)?;
        Ok(())
    }
}

#[test]
fn a_tensor_that_fails_to_decode_leaves_the_model_unchanged() -> Result<()> {
    let dir = scratch("decode_failure");
    // `weight` (visited first) is fine; `mask` holds a byte that is not a bool.
    let p = dir.join("masked.safetensors");
    raw_file(
        &p,
        r#"{"mask":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]},"weight":{"dtype":"F32","shape":[2],"data_offsets":[2,10]}}"#,
        &[
            [1u8, 7].as_slice(),
            &5.0f32.to_le_bytes(),
            &6.0f32.to_le_bytes(),
        ]
        .concat(),
    );
    let mut m = Masked::init(&DEV, 0)?;
    let e = load_foreign(&mut m, &p).unwrap_err().to_string();
    assert!(e.contains("`mask`") && e.contains("byte 7"), "{e}");
    assert_eq!(m.weight.to_vec::<f32>()?, vec![1.0, 2.0]);

    // With a valid mask both load, the bool buffer included.
    raw_file(
        &p,
        r#"{"mask":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]},"weight":{"dtype":"F32","shape":[2],"data_offsets":[2,10]}}"#,
        &[
            [0u8, 1].as_slice(),
            &5.0f32.to_le_bytes(),
            &6.0f32.to_le_bytes(),
        ]
        .concat(),
    );
    load_foreign(&mut m, &p)?;
    assert_eq!(m.weight.to_vec::<f32>()?, vec![5.0, 6.0]);
    assert_eq!(m.mask.to_vec::<bool>()?, vec![false, true]);
    Ok(())
}

#[test]
fn identical_saves_write_identical_bytes() -> Result<()> {
    let dir = scratch("identical");
    let meta: BTreeMap<String, String> = (0..12)
        .map(|i| (format!("key{i}"), format!("value {i}")))
        .collect();
    let (a, b) = (dir.join("a.safetensors"), dir.join("b.safetensors"));
    save_with_metadata(&net(3)?, &a, &meta)?;
    save_with_metadata(&net(3)?, &b, &meta)?;
    assert_eq!(fs::read(&a).unwrap(), fs::read(&b).unwrap());
    assert_eq!(read_metadata(&a)?, meta);
    let mut back = net(9)?;
    load(&mut back, &a)?;
    assert_eq!(contents(&back), contents(&net(3)?));
    Ok(())
}

#[test]
fn a_save_removes_the_temporary_files_of_killed_saves() -> Result<()> {
    let dir = scratch("stale");
    let path = dir.join("model.safetensors");
    // A killed process's leftover (no process has a pid this large on Linux), one of
    // this process's own (a save that may still be running), and another file's.
    let dead = dir.join(".model.safetensors.4294967295-0.safetensors.tmp");
    let own = dir.join(format!(
        ".model.safetensors.{}-999.safetensors.tmp",
        std::process::id()
    ));
    let other = dir.join(".other.safetensors.4294967295-0.safetensors.tmp");
    for f in [&dead, &own, &other] {
        fs::write(f, b"partial").unwrap();
    }
    save(&net(1)?, &path)?;
    assert_eq!(dead.exists(), !cfg!(target_os = "linux"));
    assert!(own.exists() && other.exists());
    Ok(())
}

#[cfg(unix)]
#[test]
fn saving_through_a_symlink_replaces_its_target_and_keeps_the_link() -> Result<()> {
    let dir = scratch("symlink");
    let target = dir.join("real.safetensors");
    let link = dir.join("link.safetensors");
    save(&net(1)?, &target)?;
    std::os::unix::fs::symlink("real.safetensors", &link).unwrap();
    save(&net(2)?, &link)?;
    assert!(fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    let mut back = net(9)?;
    load(&mut back, &target)?;
    assert_eq!(contents(&back), contents(&net(2)?));
    Ok(())
}

/// A 3 GB file of zeros (sparse: it takes no disk) is refused from its first bytes:
/// its header length is 0, so its header is no JSON object, and nothing else is read.
#[test]
fn a_huge_file_with_a_bad_header_is_refused_before_its_data_is_read() -> Result<()> {
    let dir = scratch("huge");
    let p = dir.join("zeros.safetensors");
    fs::File::create(&p)?.set_len(3 << 30)?;
    let peak_before = peak_memory_kib();
    let e = load_error(&p);
    assert!(
        e.contains("not a valid safetensors file") && e.contains("not a JSON object"),
        "{e}"
    );
    // Read whole, the file would have raised the process's peak memory by 3 GB.
    if let (Some(before), Some(after)) = (peak_before, peak_memory_kib()) {
        assert!(
            after - before < 256 << 10,
            "peak memory rose by {} KiB",
            after - before
        );
    }
    // A header declaring more data than the file holds is refused the same way.
    let good = dir.join("good.safetensors");
    write(&good, &[("weight", f32s(&[2, 3]))]);
    let mut bytes = fs::read(&good)?;
    bytes.truncate(bytes.len() - 4);
    fs::write(&p, &bytes)?;
    let e = load_error(&p);
    assert!(
        e.contains("declares 24 bytes of tensor data but the file holds 20"),
        "{e}"
    );
    Ok(())
}

/// The process's peak resident memory in KiB (Linux's `VmHWM`), where it can be read.
fn peak_memory_kib() -> Option<u64> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// `path`'s file without its metadata (as PyTorch writes them: no checksums) and with
/// `extra` (name, safetensors dtype, shape, bytes) appended, as PyTorch's state dicts
/// add their batch-norm counters.
fn foreign_with_extra(path: &Path, out: &Path, extra: (&str, &str, &[usize], &[u8])) {
    let bytes = fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    header.remove("__metadata__");
    let mut data = bytes[8 + n..].to_vec();
    let (name, dtype, shape, value) = extra;
    header.insert(
        name.to_string(),
        serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [data.len(), data.len() + value.len()]}),
    );
    data.extend_from_slice(value);
    raw_file(out, &serde_json::to_string(&header).unwrap(), &data);
}

/// The header of the safetensors file at `path`.
fn header(path: &Path) -> serde_json::Map<String, serde_json::Value> {
    let bytes = fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    serde_json::from_slice(&bytes[8..8 + n]).unwrap()
}

#[test]
fn batch_norm_counters_are_written_and_read_as_pytorch_has_them() -> Result<()> {
    let dir = scratch("bn_counter");
    let saved = dir.join("net.safetensors");
    let trained = net(4)?;
    trained.seeds.set_taken(12);
    save(&trained, &saved)?;
    // Written: one int64 per batch-norm layer, the model's training steps.
    let entry = &header(&saved)["norm.num_batches_tracked"];
    assert_eq!(entry["dtype"], "I64");
    assert_eq!(entry["shape"], serde_json::json!([]));
    let mut back = net(9)?;
    load(&mut back, &saved)?;
    assert_eq!(contents(&back), contents(&net(4)?));
    assert_eq!(back.seeds.taken(), 12);
    // Skipped by `read_tensors` (int64 is no kiln dtype).
    let names: Vec<String> = read_tensors::<Cpu>(&saved, &DEV)?
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert!(
        !names.iter().any(|n| n.contains("num_batches")),
        "{names:?}"
    );

    // PyTorch's: no checksums, a counter of 7.
    let bare = dir.join("bare.safetensors");
    let mut tensors = Vec::new();
    let mut push = |s: Slot<'_, Cpu>| tensors.push((s.name.to_string(), s.value.clone()));
    trained.visit_params("", &mut push);
    trained.visit_buffers("", &mut push);
    let refs: Vec<(&str, &RawTensor<Cpu>)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    write_tensors(&bare, &refs)?;
    let p = dir.join("torch.safetensors");
    foreign_with_extra(
        &bare,
        &p,
        ("norm.num_batches_tracked", "I64", &[], &7i64.to_le_bytes()),
    );
    let mut back = net(9)?;
    load_foreign(&mut back, &p)?;
    assert_eq!(contents(&back), contents(&net(4)?));
    assert_eq!(back.seeds.taken(), 7);

    // Not a batch-norm layer of the model, or not one int64: still an extra tensor.
    for (name, dtype, shape, value) in [
        (
            "fc1.num_batches_tracked",
            "I64",
            &[][..],
            &7i64.to_le_bytes()[..],
        ),
        (
            "norm.num_batches_tracked",
            "F32",
            &[][..],
            &1f32.to_le_bytes()[..],
        ),
        ("norm.num_batches_tracked", "I64", &[2][..], &[0u8; 16][..]),
    ] {
        foreign_with_extra(&bare, &p, (name, dtype, shape, value));
        let e = match load_foreign(&mut net(9)?, &p) {
            Err(e) => e.to_string(),
            Ok(()) => panic!("{name} {dtype} {shape:?} was accepted"),
        };
        assert!(e.contains(&format!("extra tensor `{name}`")), "{e}");
    }
    // A negative count is refused, naming the tensor.
    foreign_with_extra(
        &bare,
        &p,
        (
            "norm.num_batches_tracked",
            "I64",
            &[],
            &(-3i64).to_le_bytes(),
        ),
    );
    let mut back = net(9)?;
    let e = load_foreign(&mut back, &p).unwrap_err().to_string();
    assert!(
        e.contains("`norm.num_batches_tracked` counts -3 batches"),
        "{e}"
    );
    assert_eq!(contents(&back), contents(&net(9)?));
    Ok(())
}

/// The byte range of tensor `name`'s data in the file at `path`.
fn data_range(path: &Path, name: &str) -> std::ops::Range<usize> {
    let bytes = fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let offsets = &header(path)[name]["data_offsets"];
    let at = |i: usize| 8 + n + offsets[i].as_u64().unwrap() as usize;
    at(0)..at(1)
}

#[test]
fn a_flipped_byte_is_an_error_naming_the_tensor() -> Result<()> {
    let dir = scratch("checksums");
    let good = dir.join("good.safetensors");
    save(&net(3)?, &good)?;
    let bytes = fs::read(&good)?;
    for name in ["fc1.weight", "fc2.bias", "norm.running_var"] {
        let r = data_range(&good, name);
        let mut b = bytes.clone();
        b[r.start + (r.end - r.start) / 2] ^= 0x10;
        let p = dir.join("flipped.safetensors");
        fs::write(&p, &b)?;
        for foreign in [false, true] {
            let mut back = net(9)?;
            let e = if foreign {
                load_foreign(&mut back, &p)
            } else {
                load(&mut back, &p)
            }
            .unwrap_err()
            .to_string();
            assert!(
                e.contains(&format!("tensor `{name}` does not match its checksum")),
                "{e}"
            );
            assert_eq!(contents(&back), contents(&net(9)?), "the model changed");
        }
        let e = read_tensors::<Cpu>(&p, &DEV).unwrap_err().to_string();
        assert!(e.contains(&format!("`{name}` does not match")), "{e}");
    }

    // One checksum removed: the tensor is named; the file's others still verify.
    let mut h = header(&good);
    h["__metadata__"]
        .as_object_mut()
        .unwrap()
        .remove("kiln.crc32.fc2.weight");
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let p = dir.join("stripped.safetensors");
    raw_file(&p, &serde_json::to_string(&h).unwrap(), &bytes[8 + n..]);
    let e = load(&mut net(9)?, &p).unwrap_err().to_string();
    assert!(e.contains("tensor `fc2.weight` has no checksum"), "{e}");
    load_foreign(&mut net(9)?, &p)?;

    // Checksums are Kiln's: user metadata cannot write them, nor read them back.
    let meta = BTreeMap::from([("kiln.crc32.fc1.weight".to_string(), "0".to_string())]);
    let e = save_with_metadata(&net(3)?, dir.join("x.safetensors"), &meta)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("the metadata key `kiln.crc32.fc1.weight` is reserved"),
        "{e}"
    );
    assert!(read_metadata(&good)?.is_empty());
    Ok(())
}

/// Tensors are streamed one at a time: reading a 128 MiB file of 16 tensors holds the
/// decoded tensors and one tensor's bytes at once, not the file besides.
#[test]
fn loads_stream_tensor_by_tensor() -> Result<()> {
    let dir = scratch("stream");
    let path = dir.join("big.safetensors");
    let n = 2 << 20; // 8 MiB of f32 per tensor
                     // Written by hand, a chunk at a time, so that writing raises no memory peak.
    let mut header = serde_json::Map::new();
    for i in 0..16 {
        let at = i * n * 4;
        header.insert(
            format!("t{i:02}"),
            serde_json::json!({"dtype": "F32", "shape": [n], "data_offsets": [at, at + n * 4]}),
        );
    }
    let json = serde_json::to_vec(&header).unwrap();
    {
        use std::io::Write;
        let mut f = std::io::BufWriter::new(fs::File::create(&path)?);
        f.write_all(&(json.len() as u64).to_le_bytes())?;
        f.write_all(&json)?;
        for i in 0..16 {
            let chunk: Vec<u8> = (0..4096).flat_map(|_| (i as f32).to_le_bytes()).collect();
            for _ in 0..n / 4096 {
                f.write_all(&chunk)?;
            }
        }
    }
    let before = peak_memory_kib();
    let back = read_tensors::<Cpu>(&path, &DEV)?;
    assert_eq!(back.len(), 16);
    assert_eq!(back[15].1.to_vec::<f32>()?[n - 1], 15.0);
    if let (Some(before), Some(after)) = (before, peak_memory_kib()) {
        // The tensors themselves take 128 MiB; reading the file whole would add 128.
        assert!(
            after.saturating_sub(before) < 200 << 10,
            "peak memory rose by {} KiB",
            after - before
        );
    }
    Ok(())
}

/// `load_new` builds the model without drawing values it replaces, and ends as
/// `init` + `load` does; outside `zero_initialised`, `init` draws again.
#[test]
fn load_new_is_init_and_load_without_the_draws() -> Result<()> {
    let dir = scratch("load_new");
    let path = dir.join("net.safetensors");
    let saved = net(5)?;
    save(&saved, &path)?;
    let fresh: Net = kiln_train::checkpoint::load_new(&path, &DEV, false)?;
    assert_eq!(contents(&fresh), contents(&saved));
    let zeros: Net = kiln_tensor::nn::zero_initialised(|| Net::init(&DEV, 5))?;
    assert!(zeros.fc1.weight.to_vec()?.iter().all(|&v| v == 0.0));
    let drawn = Net::init(&DEV, 5)?;
    assert!(drawn.fc1.weight.to_vec()?.iter().any(|&v| v != 0.0));
    Ok(())
}

/// `bytes` copied to a program-long buffer starting `skew` bytes past a 64-byte
/// boundary, as a checkpoint built into a binary is.
fn program_bytes(bytes: &[u8], skew: usize) -> &'static [u8] {
    let words = (bytes.len() + skew).div_ceil(64) + 1;
    let buffer: &'static mut [kiln_train::checkpoint::AlignedBytes<[u8; 64]>] = Vec::leak(
        (0..words)
            .map(|_| kiln_train::checkpoint::AlignedBytes([0; 64]))
            .collect(),
    );
    // SAFETY: the blocks are contiguous bytes (64-byte arrays at their own alignment).
    let flat: &'static mut [u8] =
        unsafe { std::slice::from_raw_parts_mut(buffer.as_mut_ptr().cast(), words * 64) };
    flat[skew..skew + bytes.len()].copy_from_slice(bytes);
    &flat[skew..skew + bytes.len()]
}

/// Each parameter and buffer of `m` with whether its buffer is read in place.
fn in_place<M: Module<Cpu>>(m: &M) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    let mut push = |s: Slot<'_, Cpu>| out.push((s.name.to_string(), s.value.storage().is_static()));
    m.visit_params("", &mut push);
    m.visit_buffers("", &mut push);
    out
}

#[test]
fn built_in_bytes_are_read_in_place_where_aligned() -> Result<()> {
    let dir = scratch("built_in_bytes");
    let path = dir.join("net.safetensors");
    let saved = net(5)?;
    save(&saved, &path)?;
    let file = fs::read(&path).unwrap();

    // Aligned (as kiln::embed! aligns them): every tensor is a view of the bytes.
    let mut aligned = net(9)?;
    kiln_train::checkpoint::load_bytes(&mut aligned, "net", program_bytes(&file, 0))?;
    assert_eq!(contents(&aligned), contents(&saved));
    assert!(
        in_place(&aligned).iter().all(|(_, s)| *s),
        "{:?}",
        in_place(&aligned)
    );

    // One byte off: the same values, copied.
    let mut skewed = net(9)?;
    kiln_train::checkpoint::load_bytes(&mut skewed, "net", program_bytes(&file, 1))?;
    assert_eq!(contents(&skewed), contents(&saved));
    assert!(
        in_place(&skewed).iter().all(|(_, s)| !*s),
        "{:?}",
        in_place(&skewed)
    );

    // A flipped byte is still found before anything is read in place.
    let mut damaged = file.clone();
    let at = data_range(&path, "fc1.weight").start;
    damaged[at] ^= 1;
    let mut model = net(9)?;
    let err = kiln_train::checkpoint::load_bytes(&mut model, "net", program_bytes(&damaged, 0))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`fc1.weight` does not match its checksum"),
        "{err}"
    );
    Ok(())
}

/// A device, a FIFO (named or reached through a link), a socket and a folder named as
/// where a file goes are refused by name before anything is written, by every writer
/// (checkpoints, training states' writer, the early check and the training curve), and
/// are left as they were: the atomic rename would have replaced them (`/dev/null`, as
/// root).
#[cfg(unix)]
#[test]
fn special_files_as_outputs_are_refused_by_name_and_left_alone() -> Result<()> {
    use kiln_train::checkpoint::{check_output, check_writable};
    use kiln_train::curve::Curve;
    use std::os::unix::fs::FileTypeExt;
    let dir = scratch("special_files");
    let fifo = dir.join("fifo.safetensors");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo runs");
    assert!(made.success());
    let to_fifo = dir.join("to-fifo.safetensors");
    std::os::unix::fs::symlink(&fifo, &to_fifo).unwrap();
    let socket = dir.join("socket");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let folder = dir.join("folder");
    fs::create_dir(&folder).unwrap();
    let t = RawTensor::<Cpu>::from_vec(vec![1f32, 2.0], &[2], &DEV)?;
    let mut curve = Curve::new("accuracy");
    curve.loss.push((1, 0.5));
    let cases = [
        (Path::new("/dev/null"), "a character device"),
        (&fifo, "a FIFO"),
        (&to_fifo, "a FIFO"),
        (&socket, "a socket"),
        (&folder, "a folder"),
    ];
    for (path, kind) in cases {
        let want = format!("`{}` is {kind}", path.display());
        let errors = [
            write_tensors(path, &[("x", &t)]).err(),
            save(&net(1)?, path).err(),
            check_output("checkpoint", path).err(),
            curve.write_png(path, "run").err(),
        ];
        for e in errors {
            let e = e.map(|e| e.to_string()).unwrap_or_default();
            assert!(e.contains(&want), "{}: {e}", path.display());
        }
        // The early check says so too (a folder in its own words).
        let e = check_writable("checkpoint", path).unwrap_err().to_string();
        assert!(e.contains(kind), "{e}");
    }
    assert!(fs::metadata("/dev/null")
        .unwrap()
        .file_type()
        .is_char_device());
    assert!(fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
    assert!(fs::symlink_metadata(&to_fifo)
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(fs::symlink_metadata(&socket)
        .unwrap()
        .file_type()
        .is_socket());
    // A regular file and a new path are written as ever.
    let file = dir.join("model.safetensors");
    save(&net(1)?, &file)?;
    save(&net(2)?, &file)?;
    Ok(())
}
