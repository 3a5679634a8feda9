//! Int8 checkpoints (`checkpoint::int8`): an f32 checkpoint's rank-2 weights become
//! int8 values with per-row scales, the rest kept, checksums for all; reading one back
//! gives the same matrices; and every way such a file can be wrong (not quantised,
//! quantised twice, a scale missing or mis-shaped, a value of -128, a flipped byte, a
//! dtype it cannot hold) is one error naming the tensor.

use kiln_cpu::quant::Int8Matrix;
use kiln_cpu::CpuDevice;
use kiln_tensor::{RawTensor, Result};
use kiln_train::checkpoint::int8::{
    quantization, quantize_int8, read_int8, INT8_PER_ROW, SCALE_SUFFIX,
};
use kiln_train::checkpoint::{read_metadata, write_tensors_with_metadata};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn scratch(test: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("kiln-train-int8")
        .join(test);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 2001) as f32 / 1000.0 - 1.0
        })
        .collect()
}

/// An MLP-like f32 checkpoint: two layers' weights and biases, an embedding table, a
/// convolution's weight (rank 4, kept), user metadata, and an i32 counter (kept) if
/// `counter`.
fn f32_checkpoint(dir: &Path, counter: bool) -> Result<PathBuf> {
    let path = dir.join(format!("model-{counter}.safetensors"));
    let t = |v: Vec<f32>, dims: &[usize]| RawTensor::from_vec(v, dims, &CpuDevice);
    let mut tensors = vec![
        ("fc1.weight", t(values(6 * 5, 1), &[6, 5])?),
        ("fc1.bias", t(values(6, 2), &[6])?),
        ("fc2.weight", t(values(3 * 6, 3), &[3, 6])?),
        ("fc2.bias", t(values(3, 4), &[3])?),
        ("embed.weight", t(values(4 * 2, 5), &[4, 2])?),
        ("conv.weight", t(values(18, 6), &[2, 1, 3, 3])?),
    ];
    if counter {
        tensors.push(("steps", RawTensor::from_vec(vec![7i32], &[1], &CpuDevice)?));
    }
    let refs: Vec<(&str, &RawTensor<kiln_cpu::Cpu>)> =
        tensors.iter().map(|(n, t)| (*n, t)).collect();
    let meta = BTreeMap::from([("model".to_string(), "mlp".to_string())]);
    write_tensors_with_metadata(&path, &refs, &meta)?;
    Ok(path)
}

#[test]
fn weights_become_int8_with_per_row_scales_and_read_back() -> Result<()> {
    let dir = scratch("round_trip");
    let input = f32_checkpoint(&dir, true)?;
    let output = dir.join("model-int8.safetensors");
    let report = quantize_int8(&input, &output)?;
    assert_eq!(
        report.quantized,
        ["embed.weight", "fc1.weight", "fc2.weight"]
    );
    assert_eq!(
        report.kept,
        ["conv.weight", "fc1.bias", "fc2.bias", "steps"]
    );
    // Int8 weights (a quarter) and a scale per row.
    assert_eq!(report.bytes_before, 4 * (30 + 6 + 18 + 3 + 8 + 18 + 1));
    assert_eq!(
        report.bytes_after,
        (30 + 18 + 8) + 4 * (6 + 3 + 4) + 4 * (6 + 3 + 18 + 1)
    );
    assert_eq!(quantization(&output)?.as_deref(), Some(INT8_PER_ROW));
    assert_eq!(quantization(&input)?, None);
    // The user's metadata is kept.
    assert_eq!(
        read_metadata(&output)?.get("model").map(String::as_str),
        Some("mlp")
    );
    // Reading one back holds int8 weights and f32 tensors: an i32 one is refused.
    let e = read_int8(&output).unwrap_err().to_string();
    assert!(e.contains("tensor `steps` is I32"), "{e}");

    let input = f32_checkpoint(&dir, false)?;
    quantize_int8(&input, &output)?;
    let read = read_int8(&output)?;
    assert_eq!(
        read.weights["fc1.weight"],
        Int8Matrix::quantize(&values(30, 1), 6, 5)?
    );
    assert_eq!(
        read.weights["fc2.weight"],
        Int8Matrix::quantize(&values(18, 3), 3, 6)?
    );
    assert_eq!(
        read.weights["embed.weight"],
        Int8Matrix::quantize(&values(8, 5), 4, 2)?
    );
    assert_eq!(read.values("fc1.bias")?, values(6, 2).as_slice());
    assert_eq!(read.tensors["conv.weight"].0, [2, 1, 3, 3]);
    assert_eq!(
        read.tensors.len(),
        3,
        "the scales are the weights', not tensors of their own"
    );
    assert!(read.weight("fc3.weight").is_err());
    Ok(())
}

#[test]
fn files_that_are_not_int8_checkpoints_are_refused_by_name() -> Result<()> {
    let dir = scratch("refused");
    let input = f32_checkpoint(&dir, false)?;
    let e = read_int8(&input).unwrap_err().to_string();
    assert!(e.contains("it is not quantised"), "{e}");
    let output = dir.join("int8.safetensors");
    quantize_int8(&input, &output)?;
    let e = quantize_int8(&output, &dir.join("twice.safetensors"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("is quantised already (int8-per-row)"), "{e}");

    // A flipped byte of an int8 weight fails its checksum.
    let mut bytes = std::fs::read(&output).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x10;
    let corrupt = dir.join("corrupt.safetensors");
    std::fs::write(&corrupt, &bytes).unwrap();
    let e = read_int8(&corrupt).unwrap_err().to_string();
    assert!(e.contains("does not match its checksum"), "{e}");
    Ok(())
}

/// A hand-built int8 file: `tensors` as (name, safetensors dtype, dims, bytes), with
/// Kiln's checksums and the int8 metadata.
fn int8_file(dir: &Path, name: &str, tensors: &[(&str, &str, Vec<usize>, Vec<u8>)]) -> PathBuf {
    labelled_file(dir, name, &[("kiln.quantization", INT8_PER_ROW)], tensors)
}

/// A hand-built safetensors file: `tensors` as (name, safetensors dtype, dims, bytes),
/// with Kiln's checksums and the metadata `meta`.
fn labelled_file(
    dir: &Path,
    name: &str,
    meta_entries: &[(&str, &str)],
    tensors: &[(&str, &str, Vec<usize>, Vec<u8>)],
) -> PathBuf {
    let mut header = serde_json::Map::new();
    let mut meta = serde_json::Map::new();
    for (k, v) in meta_entries {
        meta.insert(k.to_string(), v.to_string().into());
    }
    let mut data = Vec::new();
    for (n, dtype, dims, bytes) in tensors {
        let start = data.len();
        data.extend_from_slice(bytes);
        header.insert(
            n.to_string(),
            serde_json::json!({"dtype": dtype, "shape": dims, "data_offsets": [start, data.len()]}),
        );
        meta.insert(
            format!("kiln.crc32.{n}"),
            format!("{:08x}", crc32fast::hash(bytes)).into(),
        );
    }
    header.insert("__metadata__".into(), serde_json::Value::Object(meta));
    let text = serde_json::to_vec(&serde_json::Value::Object(header)).unwrap();
    let mut file = (text.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(&text);
    file.extend_from_slice(&data);
    let path = dir.join(name);
    std::fs::write(&path, file).unwrap();
    path
}

#[test]
fn scales_missing_or_mis_shaped_and_values_of_minus_128_are_errors() {
    let dir = scratch("bad_scales");
    let w = vec![1u8, 2, 3, 4, 5, 6];
    let f = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let scale = format!("w{SCALE_SUFFIX}");
    for (file, tensors, wanted) in [
        (
            "missing.safetensors",
            vec![("w", "I8", vec![2, 3], w.clone())],
            "int8 tensor `w` has no `w_scale`",
        ),
        (
            "short.safetensors",
            vec![
                ("w", "I8", vec![2, 3], w.clone()),
                (scale.as_str(), "F32", vec![3], f(&[1.0, 1.0, 1.0])),
            ],
            "`w_scale` is [3] F32, not 2 f32 scales for `w`",
        ),
        (
            "negative.safetensors",
            vec![
                ("w", "I8", vec![2, 3], w.clone()),
                (scale.as_str(), "F32", vec![2], f(&[1.0, -2.0])),
            ],
            "row 1's scale is -2",
        ),
        (
            "min.safetensors",
            vec![
                ("w", "I8", vec![2, 3], vec![1, 2, 0x80, 4, 5, 6]),
                (scale.as_str(), "F32", vec![2], f(&[1.0, 2.0])),
            ],
            "value [0, 2] is -128",
        ),
        (
            "vector.safetensors",
            vec![("w", "I8", vec![6], w.clone())],
            "int8 tensor `w` has dims [6], not a matrix's",
        ),
        (
            "f64.safetensors",
            vec![("x", "F64", vec![1], 1f64.to_le_bytes().to_vec())],
            "tensor `x` is F64",
        ),
    ] {
        let path = int8_file(&dir, file, &tensors);
        let e = read_int8(&path).unwrap_err().to_string();
        assert!(e.contains(wanted), "{file}: wanted `{wanted}` in: {e}");
    }
}

#[test]
fn a_file_pytorch_wrote_is_quantised_on_request_only() -> Result<()> {
    use kiln_train::checkpoint::int8::quantize_int8_foreign;
    // `linear_3_2.safetensors`: PyTorch's `save_file` of a Linear(3, 2), no checksums.
    let torch = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/linear_3_2.safetensors");
    let dir = scratch("foreign");
    let output = dir.join("int8.safetensors");
    let e = quantize_int8(&torch, &output).unwrap_err().to_string();
    assert!(e.contains("has no tensor checksums"), "{e}");
    let report = quantize_int8_foreign(&torch, &output)?;
    assert_eq!(report.quantized, ["weight"]);
    assert_eq!(report.kept, ["bias"]);
    // Written with Kiln's checksums, which reading it back verifies.
    let read = read_int8(&output)?;
    let weights = [0.5, -1.25, 2.0, 0.125, 3.0, -0.75];
    assert_eq!(
        read.weights["weight"],
        Int8Matrix::quantize(&weights, 2, 3)?
    );
    Ok(())
}

/// Little-endian bytes of f32 values.
fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A `LinearInt8<3, 2>`'s file (`weight` [2, 3] int8, `weight_scale`, `bias`) with
/// the given values, as `kiln-quantize` labels it.
fn linear_int8_file(
    dir: &Path,
    name: &str,
    q: [u8; 6],
    scales: [f32; 2],
    bias: [f32; 2],
) -> PathBuf {
    int8_file(
        dir,
        name,
        &[
            ("bias", "F32", vec![2], f32_bytes(&bias)),
            ("weight", "I8", vec![2, 3], q.to_vec()),
            ("weight_scale", "F32", vec![2], f32_bytes(&scales)),
        ],
    )
}

/// Every way the int8 instance's loader can be reached: from a file, and from bytes
/// built into the program (what `kiln::embed!` expands to).
fn load_errors(path: &Path) -> [String; 2] {
    use kiln_tensor::nn::{LinearInt8, Module};
    use kiln_train::checkpoint::{load, load_bytes};
    let mut model = LinearInt8::<kiln_cpu::Cpu, 3, 2>::init(&CpuDevice, 0).unwrap();
    let from_file = load(&mut model, path).err().map(|e| e.to_string());
    let bytes: &'static [u8] = Vec::leak(std::fs::read(path).unwrap());
    let embedded = load_bytes(&mut model, "embedded.safetensors", bytes)
        .err()
        .map(|e| e.to_string());
    [
        from_file.unwrap_or_else(|| "loaded".into()),
        embedded.unwrap_or_else(|| "loaded".into()),
    ]
}

#[test]
fn an_int8_instance_loads_by_the_rules_the_reader_checks() {
    let dir = scratch("instance_rules");
    let good = linear_int8_file(
        &dir,
        "good.safetensors",
        [1, 2, 3, 4, 5, 6],
        [0.5, 0.25],
        [0.1, -0.1],
    );
    assert!(read_int8(&good).is_ok());
    assert_eq!(load_errors(&good), ["loaded", "loaded"]);
    let q = [1, 2, 3, 4, 5, 6];
    for (file, values, scales, bias, wanted) in [
        (
            "nan_scale",
            q,
            [f32::NAN, 0.25],
            [0.1, 0.1],
            "row 0's scale is NaN",
        ),
        (
            "negative_scale",
            q,
            [0.5, -0.25],
            [0.1, 0.1],
            "row 1's scale is -0.25",
        ),
        (
            "infinite_scale",
            q,
            [f32::INFINITY, 0.25],
            [0.1, 0.1],
            "row 0's scale is inf",
        ),
        (
            "nan_bias",
            q,
            [0.5, 0.25],
            [0.1, f32::NAN],
            "tensor `bias` holds NaN at element 1",
        ),
        (
            "minus_128",
            [1, 2, 3, 4, 0x80, 6],
            [0.5, 0.25],
            [0.1, 0.1],
            "value [1, 1] is -128",
        ),
    ] {
        let path = linear_int8_file(&dir, &format!("{file}.safetensors"), values, scales, bias);
        let read = read_int8(&path).unwrap_err().to_string();
        assert!(read.contains(wanted), "{file}: the reader: {read}");
        for e in load_errors(&path) {
            assert!(e.contains(wanted), "{file}: the instance's loader: {e}");
        }
    }
}

#[test]
fn a_quantisation_label_other_than_int8_per_row_is_refused_naming_it() {
    let dir = scratch("labels");
    let tensors = [
        ("bias", "F32", vec![2], f32_bytes(&[0.1, 0.2])),
        ("weight", "I8", vec![2, 3], vec![1, 2, 3, 4, 5, 6]),
        ("weight_scale", "F32", vec![2], f32_bytes(&[0.5, 0.25])),
    ];
    for label in ["int4-per-row", "int8-per-tensor", "int4\u{1b}[31m\nred"] {
        let path = labelled_file(
            &dir,
            "labelled.safetensors",
            &[("kiln.quantization", label)],
            &tensors,
        );
        let shown = label.escape_debug().to_string();
        let mut errors = load_errors(&path).to_vec();
        errors.push(read_int8(&path).unwrap_err().to_string());
        for e in errors {
            assert!(
                e.contains(&format!(
                    "its quantisation is `{shown}`, not `int8-per-row`"
                )),
                "{label:?}: {e}"
            );
            assert!(!e.contains('\u{1b}') && !e.contains('\n'), "unescaped: {e}");
        }
    }
    // Without a label, the int8 tensors are not taken for an int8 checkpoint either.
    let path = labelled_file(&dir, "unlabelled.safetensors", &[], &tensors);
    for e in load_errors(&path) {
        assert!(e.contains("it is not quantised"), "{e}");
    }
}

#[test]
fn an_output_that_is_the_input_is_refused_by_name_and_the_input_kept() -> Result<()> {
    use kiln_train::checkpoint::same_file;
    let dir = scratch("same_file");
    let input = f32_checkpoint(&dir, false)?;
    let before = std::fs::read(&input).unwrap();
    let link = dir.join("link.safetensors");
    std::os::unix::fs::symlink(&input, &link).unwrap();
    let hard = dir.join("hard.safetensors");
    std::fs::hard_link(&input, &hard).unwrap();
    let dotted = dir.join(".").join(input.file_name().unwrap());
    for output in [&input, &link, &hard, &dotted] {
        let e = quantize_int8(&input, output).unwrap_err().to_string();
        assert!(
            e.contains(&format!("`{}` would overwrite its input", output.display())),
            "{e}"
        );
    }
    assert_eq!(std::fs::read(&input).unwrap(), before);
    // A link to where a file will be written is that file too.
    let later = dir.join("later.safetensors");
    let to_later = dir.join("to-later.safetensors");
    std::os::unix::fs::symlink(&later, &to_later).unwrap();
    assert!(same_file(&later, &to_later));
    assert!(!same_file(&input, &later));
    // Another file is written.
    quantize_int8(&input, &later)?;
    assert_eq!(std::fs::read(&input).unwrap(), before);
    Ok(())
}

#[test]
fn a_training_state_and_weights_with_no_int8_form_are_refused_by_name() -> Result<()> {
    use kiln_tensor::nn::{Linear, Module};
    use kiln_train::optim::{AdamW, AdamWConfig};
    let dir = scratch("not_checkpoints");
    let output = dir.join("out.safetensors");
    // A training state: the model and its optimizer's moments.
    let state = dir.join("run.state.safetensors");
    let model = Linear::<kiln_cpu::Cpu, 3, 2>::init(&CpuDevice, 1)?;
    let opt = AdamW::new(AdamWConfig::default())?;
    kiln_train::state::save(&state, &model, &opt, 3, &BTreeMap::new())?;
    let e = quantize_int8(&state, &output).unwrap_err().to_string();
    assert!(
        e.contains("is a training state") && e.contains("pass the checkpoint"),
        "{e}"
    );
    // A weight of integers has no int8 form: refused by name, not kept as it is.
    let ints = labelled_file(
        &dir,
        "ints.safetensors",
        &[],
        &[("fc.weight", "I32", vec![2, 3], vec![0; 24])],
    );
    let e = kiln_train::checkpoint::int8::quantize_int8_foreign(&ints, &output)
        .unwrap_err()
        .to_string();
    assert!(e.contains("`fc.weight`") && e.contains("dtype i32"), "{e}");
    // A bf16 or f64 weight is quantised from its values.
    let w = [0.5f32, -1.0, 2.0, 0.25, 1.5, -0.75];
    let bf16: Vec<u8> = w
        .iter()
        .flat_map(|v| kiln_tensor::bf16::from_f32(*v).to_le_bytes())
        .collect();
    let f64s: Vec<u8> = w.iter().flat_map(|v| f64::from(*v).to_le_bytes()).collect();
    let floats = labelled_file(
        &dir,
        "floats.safetensors",
        &[],
        &[
            ("a.weight", "BF16", vec![2, 3], bf16),
            ("b.weight", "F64", vec![2, 3], f64s),
        ],
    );
    let report = kiln_train::checkpoint::int8::quantize_int8_foreign(&floats, &output)?;
    assert_eq!(report.quantized, ["a.weight", "b.weight"]);
    let read = read_int8(&output)?;
    let want = Int8Matrix::quantize(&w, 2, 3)?;
    assert_eq!(read.weights["a.weight"], want);
    assert_eq!(read.weights["b.weight"], want);
    Ok(())
}
