//! The classifiers from their int8 checkpoints (`kiln-quantize`, then the int8
//! instances `MlpInt8` and `LeNetInt8` on the CPU's int8 products): the MLP's logits
//! are the f32 model's to within the quantisation's error and pick the same classes;
//! `kiln-infer` evaluates such files; and the binaries refuse what they cannot do in
//! one line (a file quantised twice, an output over its input, flags that contradict
//! the file, tensors of other shapes).

#[path = "support/output.rs"]
mod output;
use kiln::cpu::{Cpu, CpuDevice};
use kiln::prelude::*;
use kiln::train::checkpoint::{
    int8::quantize_int8, load_new, save, save_with_metadata, write_tensors,
};
use kiln_models::lenet::LeNet;
use kiln_models::mlp::{Mlp, MlpInt8};
use output::{assert_refused, run};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const QUANTIZE: &str = env!("CARGO_BIN_EXE_kiln-quantize");
const INFER: &str = env!("CARGO_BIN_EXE_kiln-infer");

fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-int8-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn int8_logits_are_the_f32_models_to_within_quantisation() {
    let dir = scratch("logits");
    let model = Mlp::<Cpu>::init(&CpuDevice, 3).unwrap();
    let (f32_file, int8_file) = (
        dir.join("mlp.safetensors"),
        dir.join("mlp-int8.safetensors"),
    );
    save(&model, &f32_file).unwrap();
    quantize_int8(&f32_file, &int8_file).unwrap();
    let int8: MlpInt8<Cpu> = load_new(&int8_file, &CpuDevice, false).unwrap();
    let x = Tensor::<Cpu, Rank2<16, 784>>::normal(0.0, 1.0, 4, &CpuDevice).unwrap();
    let want = model.forward(&x).unwrap().to_vec().unwrap();
    let got = int8.forward(&x).unwrap().to_vec().unwrap();
    let spread = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let mut same_class = 0;
    for (g, w) in got.chunks(10).zip(want.chunks(10)) {
        for (a, b) in g.iter().zip(w) {
            assert!(
                (a - b).abs() <= 0.02 * spread,
                "int8 {a} against f32 {b} (logits up to {spread})"
            );
        }
        let top = |r: &[f32]| (0..10).max_by(|&i, &j| r[i].total_cmp(&r[j]));
        same_class += usize::from(top(g) == top(w));
    }
    assert!(
        same_class >= 15,
        "{same_class} of 16 rows pick the f32 model's class"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn kiln_quantize_writes_a_quarter_and_refuses_nonsense_in_one_line() {
    let dir = scratch("cli");
    let f32_file = dir.join("mlp.safetensors");
    let meta = BTreeMap::from([
        ("model".to_string(), "mlp".to_string()),
        ("dataset".to_string(), "mnist".to_string()),
    ]);
    save_with_metadata(&Mlp::<Cpu>::init(&CpuDevice, 1).unwrap(), &f32_file, &meta).unwrap();
    let int8_file = dir.join("mlp-int8.safetensors");
    let (f, i) = (f32_file.to_str().unwrap(), int8_file.to_str().unwrap());
    let (code, out, err) = run(QUANTIZE, &[f, i]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("3 weights as int8 (fc1.weight, fc2.weight, fc3.weight), 3 tensors kept; 1.88 MB of tensors, was 7.45 MB"),
        "{out}"
    );
    assert_refused(
        QUANTIZE,
        &[i, dir.join("again.safetensors").to_str().unwrap()],
        "is quantised already",
    );
    assert_refused(
        QUANTIZE,
        &["/nowhere/mlp.safetensors", i],
        "cannot read `/nowhere/mlp.safetensors`",
    );
    let (code, _, err) = run(QUANTIZE, &[f, f]);
    assert_eq!(code, Some(2));
    assert!(err.contains("would overwrite its input"), "{err}");

    // kiln-infer runs the int8 file through the MLP's int8 instance.
    let (code, out, err) = run(INFER, &["--checkpoint", i, "--latency-images", "3"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("int8 products on"), "{out}");
    assert!(
        out.contains("test accuracy") && out.contains("on 10000 images"),
        "{out}"
    );
    assert!(
        out.contains("latency per image (batch 1, 3 images)"),
        "{out}"
    );
    assert_refused(
        INFER,
        &["--checkpoint", i, "--model", "cnn"],
        "was trained as model mlp, not cnn",
    );
    // And the CNN's, whose linear layers are int8 and convolutions f32.
    let cnn_file = dir.join("cnn.safetensors");
    let cnn_meta = BTreeMap::from([
        ("model".to_string(), "cnn".to_string()),
        ("dataset".to_string(), "mnist".to_string()),
    ]);
    save_with_metadata(
        &LeNet::<Cpu>::init(&CpuDevice, 1).unwrap(),
        &cnn_file,
        &cnn_meta,
    )
    .unwrap();
    let cnn_int8 = dir.join("cnn-int8.safetensors");
    let (c, ci) = (cnn_file.to_str().unwrap(), cnn_int8.to_str().unwrap());
    let (code, out, err) = run(QUANTIZE, &[c, ci]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("2 weights as int8 (fc1.weight, fc2.weight)"),
        "{out}"
    );
    let (code, out, err) = run(
        INFER,
        &[
            "--checkpoint",
            ci,
            "--model",
            "cnn",
            "--latency-images",
            "2",
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("test accuracy") && out.contains("int8 products on"),
        "{out}"
    );
    assert_refused(
        INFER,
        &["--checkpoint", i, "--dataset", "fashion"],
        "was trained as dataset mnist, not fashion",
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn tensors_of_other_shapes_are_refused_by_name() {
    let dir = scratch("shapes");
    let t = |dims: &[usize]| {
        RawTensor::<Cpu>::from_vec(vec![0.5f32; dims.iter().product()], dims, &CpuDevice).unwrap()
    };
    let tensors = [
        ("fc1.weight", t(&[1024, 784])),
        ("fc1.bias", t(&[1024])),
        ("fc2.weight", t(&[1024, 512])),
        ("fc2.bias", t(&[1024])),
        ("fc3.weight", t(&[10, 1024])),
        ("fc3.bias", t(&[10])),
    ];
    let refs: Vec<_> = tensors.iter().map(|(n, t)| (*n, t)).collect();
    let (f32_file, int8_file) = (
        dir.join("bad.safetensors"),
        dir.join("bad-int8.safetensors"),
    );
    write_tensors(&f32_file, &refs).unwrap();
    quantize_int8(&f32_file, &int8_file).unwrap();
    let e = load_new::<Cpu, MlpInt8<Cpu>>(&int8_file, &CpuDevice, false)
        .err()
        .expect("fc2 is not the model's")
        .to_string();
    assert!(e.contains("fc2.weight") && e.contains("[1024, 512]"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

/// `file` with the first bytes of tensor `name` replaced by `first`, its checksum
/// made to match (as a broken or hostile tool would write it), written to `out`; with
/// `label`, the quantisation label replaced by another of the same length.
fn patched(file: &Path, name: &str, first: &[u8], label: Option<&str>, out: &Path) {
    let mut bytes = std::fs::read(file).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let at = |i: usize| 8 + n + header[name]["data_offsets"][i].as_u64().unwrap() as usize;
    let (start, end) = (at(0), at(1));
    let old = format!(
        "\"kiln.crc32.{name}\":\"{:08x}\"",
        crc32fast::hash(&bytes[start..end])
    );
    bytes[start..start + first.len()].copy_from_slice(first);
    let new = format!(
        "\"kiln.crc32.{name}\":\"{:08x}\"",
        crc32fast::hash(&bytes[start..end])
    );
    let mut text = String::from_utf8(bytes[8..8 + n].to_vec()).unwrap();
    assert!(text.contains(&old), "{name}'s checksum in the header");
    // Eight hex digits for eight: the header keeps its length, so no offset moves.
    text = text.replacen(&old, &new, 1);
    if let Some(label) = label {
        assert_eq!(label.len(), "int8-per-row".len());
        text = text.replacen("\"int8-per-row\"", &format!("\"{label}\""), 1);
    }
    assert_eq!(text.len(), n);
    bytes[8..8 + n].copy_from_slice(text.as_bytes());
    std::fs::write(out, bytes).unwrap();
}

/// Issue 63's int8 cases: an int8 file that breaks the format's rules (a NaN,
/// negative or infinite scale, a NaN bias, a -128, another quantisation's label) is
/// refused by `kiln-infer` and by `MlpInt8`'s loaders, from a file and from embedded
/// bytes, naming the tensor or the label; `kiln-quantize` refuses an output that is
/// its input through a link, a device as its output, and a training state, and leaves
/// them as they were.
#[test]
fn hostile_int8_files_and_outputs_are_refused_in_one_line() {
    use kiln::train::checkpoint::load_bytes;
    use std::os::unix::fs::FileTypeExt;
    let dir = scratch("hostile");
    let f32_file = dir.join("mlp.safetensors");
    let meta = BTreeMap::from([
        ("model".to_string(), "mlp".to_string()),
        ("dataset".to_string(), "mnist".to_string()),
    ]);
    let mlp = Mlp::<Cpu>::init(&CpuDevice, 1).unwrap();
    save_with_metadata(&mlp, &f32_file, &meta).unwrap();
    let int8_file = dir.join("mlp-int8.safetensors");
    quantize_int8(&f32_file, &int8_file).unwrap();
    let nan = f32::NAN.to_le_bytes();
    let cases: [(&str, &[u8], Option<&str>, &str); 6] = [
        ("fc1.weight_scale", &nan, None, "row 0's scale is NaN"),
        (
            "fc2.weight_scale",
            &(-1f32).to_le_bytes(),
            None,
            "row 0's scale is -1",
        ),
        (
            "fc3.weight_scale",
            &f32::INFINITY.to_le_bytes(),
            None,
            "row 0's scale is inf",
        ),
        (
            "fc1.bias",
            &nan,
            None,
            "tensor `fc1.bias` holds NaN at element 0",
        ),
        ("fc2.weight", &[0x80], None, "value [0, 0] is -128"),
        (
            "fc1.bias",
            &0.5f32.to_le_bytes(),
            Some("int4-per-row"),
            "its quantisation is `int4-per-row`",
        ),
    ];
    let bad = dir.join("bad-int8.safetensors");
    for (name, first, label, want) in cases {
        patched(&int8_file, name, first, label, &bad);
        let b = bad.to_str().unwrap();
        assert_refused(INFER, &["--checkpoint", b, "--latency-images", "1"], want);
        let e = load_new::<Cpu, MlpInt8<Cpu>>(&bad, &CpuDevice, false)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains(want), "{name}: {e}");
        // `kiln::embed!`'s load, on bytes built into the program.
        let bytes: &'static [u8] = Vec::leak(std::fs::read(&bad).unwrap());
        let mut model = MlpInt8::<Cpu>::init(&CpuDevice, 0).unwrap();
        let e = load_bytes(&mut model, "mlp-int8.safetensors", bytes)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains(want), "{name}, embedded: {e}");
    }

    let (f, before) = (
        f32_file.to_str().unwrap(),
        std::fs::read(&f32_file).unwrap(),
    );
    let link = dir.join("link.safetensors");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&f32_file, &link).unwrap();
    let (code, _, err) = run(QUANTIZE, &[f, link.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("would overwrite its input"), "{err}");
    let (code, _, err) = run(QUANTIZE, &[f, "/dev/null"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("`/dev/null` is a character device"), "{err}");
    assert_eq!(std::fs::read(&f32_file).unwrap(), before);
    assert!(std::fs::metadata("/dev/null")
        .unwrap()
        .file_type()
        .is_char_device());

    let state = dir.join("mlp.state.safetensors");
    let opt = kiln::train::optim::Sgd::new(kiln::train::optim::SgdConfig::default()).unwrap();
    kiln::train::state::save(&state, &mlp, &opt, 5, &BTreeMap::new()).unwrap();
    assert_refused(
        QUANTIZE,
        &[
            state.to_str().unwrap(),
            dir.join("state-int8.safetensors").to_str().unwrap(),
        ],
        "is a training state",
    );
    std::fs::remove_dir_all(&dir).ok();
}
