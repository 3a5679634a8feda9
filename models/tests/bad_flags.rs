//! `kiln-train` refuses nonsense before it works: one line naming the flag or the path,
//! a non-zero exit status, no backtrace, and nothing saved.

#[path = "support/output.rs"]
mod output;
use output::{assert_refused, run};

const TRAIN: &str = env!("CARGO_BIN_EXE_kiln-train");
const INFER: &str = env!("CARGO_BIN_EXE_kiln-infer");
const BENCH: &str = env!("CARGO_BIN_EXE_kiln-bench");
const CLASSIFY: &str = env!("CARGO_BIN_EXE_kiln-classify");
const GENERATE: &str = env!("CARGO_BIN_EXE_kiln-generate");

#[test]
fn nonsense_flags_and_paths_are_refused_in_one_line() {
    let dir = std::env::temp_dir().join(format!("kiln-bad-flags-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("model.safetensors");
    let out = out.to_str().unwrap();
    let folder = dir.to_str().unwrap();
    // A --state that is a link to where --out will be written: one file for both.
    let linked = dir.join("linked.state.safetensors");
    let _ = std::fs::remove_file(&linked);
    std::os::unix::fs::symlink(out, &linked).unwrap();
    let linked = linked.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["--epochs", "0"], "--epochs 0 trains nothing"),
        (&["--lr", "0"], "--lr must be a positive number, got 0"),
        (&["--lr", "-1"], "--lr must be a positive number, got -1"),
        (&["--lr", "nan"], "--lr must be a positive number, got NaN"),
        (&["--momentum", "5"], "--momentum must be in [0, 1), got 5"),
        (
            &["--weight-decay", "-0.5"],
            "--weight-decay must be a number >= 0, got -0.5",
        ),
        (
            &["--limit", "10"],
            "10 training examples make no full batch of 64",
        ),
        (
            &["--batch-size", "0"],
            "--batch-size 0 takes no examples a step",
        ),
        (
            &["--out", "/proc/kiln-nowhere/model.safetensors"],
            "cannot write the checkpoint /proc/kiln-nowhere/model.safetensors",
        ),
        (&["--out", folder], "is a folder"),
        (
            &["--out", "/dev/null"],
            "the checkpoint path `/dev/null` is a character device, not a regular file",
        ),
        (&["--state", linked], "--state and --out both name"),
        (
            &["--lr", "1e30", "--limit", "1024"],
            "the loss became NaN at step 2 (anomaly mode, KILN_ANOMALY=1, finds the op",
        ),
        (
            &["--lr", "1e30", "--limit", "1024", "--detect-anomaly"],
            "anomaly: `matmul` is the first op whose output is not finite",
        ),
        (&["--state", folder], "the training state path"),
        (
            &["--model", "gpt-tiny", "--limit", "100"],
            "--limit 100 leaves less than one step",
        ),
        (
            &["--precision", "bf16"],
            "--precision bf16 and f16 are built for the GPT (--model gpt, gpt-tiny or gpt-w3)",
        ),
        (
            &["--model", "gpt-tiny", "--batch-size", "100000"],
            "the training text makes 26443 windows of 32 bytes, no full step of 100000",
        ),
        (
            &["--model", "gpt-tiny", "--resume"],
            "there is no training state at",
        ),
    ];
    for (args, want) in cases {
        let mut all = args.to_vec();
        if !all.contains(&"--out") {
            all.extend(["--out", out]);
        }
        assert_refused(TRAIN, &all, want);
        assert!(
            !std::path::Path::new(out).exists(),
            "kiln-train {all:?} saved a model"
        );
    }
    // Data folders: one that does not exist, and one whose IDX header declares dims
    // that multiply past usize (a crafted file), for training and for evaluation.
    let crafted = dir.join("crafted");
    std::fs::create_dir_all(crafted.join("mnist")).unwrap();
    let mut header = vec![0u8, 0, 8, 3];
    for _ in 0..3 {
        header.extend(u32::MAX.to_be_bytes());
    }
    for name in ["train-images-idx3-ubyte", "t10k-images-idx3-ubyte"] {
        use std::io::Write;
        let file = std::fs::File::create(crafted.join("mnist").join(format!("{name}.gz"))).unwrap();
        let mut gz = flate2::write::GzEncoder::new(file, flate2::Compression::fast());
        gz.write_all(&header).unwrap();
        gz.finish().unwrap();
    }
    let crafted = crafted.to_str().unwrap();
    let checkpoint = dir.join("mlp.safetensors");
    let mlp = kiln_models::mlp::Mlp::<kiln::cpu::Cpu>::init(&kiln::cpu::CpuDevice, 1).unwrap();
    kiln::train::checkpoint::save(&mlp, &checkpoint).unwrap();
    let checkpoint = checkpoint.to_str().unwrap();
    for (bin, args, want) in [
        (
            TRAIN,
            vec!["--data", "/kiln-nowhere"],
            "the data folder /kiln-nowhere does not exist",
        ),
        (
            TRAIN,
            vec!["--data", crafted],
            "more than the 2147483648 bytes an IDX file may hold",
        ),
        (
            INFER,
            vec!["--data", crafted, "--checkpoint", checkpoint],
            "more than the 2147483648 bytes an IDX file may hold",
        ),
        // kiln-bench's W3 reads its text where `--data` says, not the build folder.
        (
            BENCH,
            vec!["--workloads", "w3", "--data", "/kiln-nowhere"],
            "the data folder /kiln-nowhere does not exist",
        ),
        (
            BENCH,
            vec!["--workloads", "w3", "--data", crafted],
            "shakespeare_7plays.txt",
        ),
        (
            BENCH,
            vec!["--workloads", "w1", "--variants", "infer,int8"],
            "unknown W1 variant \"int8\" (known: static, static-unfused, dynamic, infer, infer-int8)",
        ),
        // TF32 is CUDA's: asked for on the CPU, the configuration is refused, not run as
        // plain f32 under its name.
        (
            BENCH,
            vec!["--workloads", "w3", "--w3-configs", "w3-tf32"],
            "w3-tf32 runs W3's f32 products on CUDA's TF32 tensor cores, which the device cpu does not have",
        ),
    ] {
        let mut all = args.clone();
        if bin == TRAIN {
            all.extend(["--out", out]);
        }
        assert_refused(bin, &all, want);
    }
    // What the parser refuses is one line too, with its usage hint (exit status 2).
    let (code, _, err) = run(TRAIN, &["--warmup", "-5"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("invalid value '-5' for '--warmup"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `kiln-infer` checks what a checkpoint records (model, data set) against the command
/// line before it evaluates.
#[test]
fn kiln_infer_refuses_a_checkpoint_of_another_model_or_data_set() {
    use kiln::cpu::{Cpu, CpuDevice};
    use std::collections::BTreeMap;
    let dir = std::env::temp_dir().join(format!("kiln-infer-meta-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("mlp.safetensors");
    let model = kiln_models::mlp::Mlp::<Cpu>::init(&CpuDevice, 1).unwrap();
    let meta = BTreeMap::from([
        ("model".to_string(), "mlp".to_string()),
        ("dataset".to_string(), "mnist".to_string()),
    ]);
    kiln::train::checkpoint::save_with_metadata(&model, &path, &meta).unwrap();
    let path = path.to_str().unwrap();
    for (args, want) in [
        (
            vec!["--dataset", "fashion"],
            "was trained as dataset mnist, not fashion: pass --dataset mnist",
        ),
        (
            vec!["--model", "cnn"],
            "was trained as model mlp, not cnn: pass --model mlp",
        ),
    ] {
        let mut all = args;
        all.extend(["--checkpoint", path]);
        assert_refused(INFER, &all, want);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Files that load but cannot answer anything are refused in one line: a test set of
/// no images (no accuracy of 0% on 0 images), a checkpoint whose weights are NaN with
/// valid checksums (no `9 (NaN%)`), and an image model's checkpoint given to
/// kiln-generate (one line naming the model it holds, not a list of tensors).
#[test]
fn files_that_cannot_answer_are_refused_in_one_line() {
    use kiln::cpu::{Cpu, CpuDevice};
    use kiln::tensor::nn::Module;
    use kiln::tensor::RawTensor;
    use std::collections::BTreeMap;
    let dir = std::env::temp_dir().join(format!("kiln-cannot-answer-{}", std::process::id()));
    let empty = dir.join("empty").join("mnist");
    std::fs::create_dir_all(&empty).unwrap();
    for (name, header) in [
        (
            "t10k-images-idx3-ubyte",
            vec![0u8, 0, 8, 3, 0, 0, 0, 0, 0, 0, 0, 28, 0, 0, 0, 28],
        ),
        ("t10k-labels-idx1-ubyte", vec![0u8, 0, 8, 1, 0, 0, 0, 0]),
    ] {
        use std::io::Write;
        let file = std::fs::File::create(empty.join(format!("{name}.gz"))).unwrap();
        let mut gz = flate2::write::GzEncoder::new(file, flate2::Compression::fast());
        gz.write_all(&header).unwrap();
        gz.finish().unwrap();
    }
    let model = kiln_models::mlp::Mlp::<Cpu>::init(&CpuDevice, 1).unwrap();
    let meta = BTreeMap::from([
        ("model".to_string(), "mlp".to_string()),
        ("dataset".to_string(), "mnist".to_string()),
    ]);
    let good = dir.join("mlp.safetensors");
    kiln::train::checkpoint::save_with_metadata(&model, &good, &meta).unwrap();
    let good = good.to_str().unwrap();
    assert_refused(
        INFER,
        &[
            "--data",
            dir.join("empty").to_str().unwrap(),
            "--checkpoint",
            good,
        ],
        "holds no images (0 of 28×28 pixels)",
    );
    // The same tensors, fc2's weight NaN, written with valid checksums.
    let mut tensors: Vec<(String, RawTensor<Cpu>)> = Vec::new();
    model.visit_params("", &mut |s| {
        let mut t = s.value.clone();
        if s.name == "fc2.weight" {
            let n = t.numel();
            t = RawTensor::from_vec(vec![f32::NAN; n], t.dims().as_slice(), &CpuDevice).unwrap();
        }
        tensors.push((s.name.to_string(), t));
    });
    let named: Vec<(&str, &RawTensor<Cpu>)> =
        tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let nan = dir.join("nan.safetensors");
    kiln::train::checkpoint::write_tensors_with_metadata(&nan, &named, &meta).unwrap();
    let image = dir.join("seven.pgm");
    std::fs::write(
        &image,
        [b"P5 2 2 255\n".as_slice(), &[0, 255, 255, 0]].concat(),
    )
    .unwrap();
    assert_refused(
        CLASSIFY,
        &[
            "--checkpoint",
            nan.to_str().unwrap(),
            image.to_str().unwrap(),
        ],
        "holds `fc2.weight` with NaN at [0, 0]",
    );
    assert_refused(
        GENERATE,
        &["--checkpoint", good],
        "holds a model kiln-train trained as --model mlp, not a GPT",
    );
    // A file of another model without kiln-train's metadata: one line too.
    let bare = dir.join("bare.safetensors");
    kiln::train::checkpoint::save(&model, &bare).unwrap();
    assert_refused(
        GENERATE,
        &["--checkpoint", bare.to_str().unwrap()],
        "the file holds none of its",
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `kiln-infer` verifies a checkpoint's checksums: a flipped byte names its tensor; a
/// file without checksums (PyTorch's) is refused unless `--foreign` accepts it.
#[test]
fn kiln_infer_verifies_checksums_and_takes_foreign_files_on_request() {
    use kiln::cpu::{Cpu, CpuDevice};
    let dir = std::env::temp_dir().join(format!("kiln-infer-crc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("mlp.safetensors");
    let model = kiln_models::mlp::Mlp::<Cpu>::init(&CpuDevice, 1).unwrap();
    kiln::train::checkpoint::save(&model, &path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let offset = header["fc2.bias"]["data_offsets"][0].as_u64().unwrap() as usize;

    let flipped = dir.join("flipped.safetensors");
    let mut b = bytes.clone();
    b[8 + n + offset + 1] ^= 0x20;
    std::fs::write(&flipped, &b).unwrap();
    assert_refused(
        INFER,
        &["--checkpoint", flipped.to_str().unwrap()],
        "tensor `fc2.bias` does not match its checksum",
    );

    header.remove("__metadata__");
    let json = serde_json::to_vec(&header).unwrap();
    let foreign = dir.join("foreign.safetensors");
    let file = [
        &(json.len() as u64).to_le_bytes()[..],
        &json,
        &bytes[8 + n..],
    ]
    .concat();
    std::fs::write(&foreign, file).unwrap();
    let foreign = foreign.to_str().unwrap();
    assert_refused(INFER, &["--checkpoint", foreign], "has no tensor checksums");
    let (code, out, err) = run(
        INFER,
        &[
            "--checkpoint",
            foreign,
            "--foreign",
            "--latency-images",
            "0",
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("test accuracy"), "{out}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Negative numbers reach the other binaries' checks too, which name the flag.
#[test]
fn negative_numbers_get_a_message_about_their_flag() {
    for (bin, args, want) in [
        (
            env!("CARGO_BIN_EXE_kiln-train-dynamic"),
            ["--lr", "-1"],
            "--lr -1 must be a positive number",
        ),
        (
            env!("CARGO_BIN_EXE_kiln-generate"),
            ["--temperature", "-1"],
            "--temperature must be a positive number, got -1",
        ),
    ] {
        assert_refused(bin, &args, want);
    }
}

/// Each binary's `--help` opens with what it does, not the package's description.
#[test]
fn each_binary_says_what_it_does_first() {
    for (bin, first) in [
        (TRAIN, "Train a model of the zoo"),
        (INFER, "Evaluate an image classifier's checkpoint"),
        (CLASSIFY, "Classify image files"),
        (GENERATE, "Sample text from a trained GPT"),
        (BENCH, "Run Kiln's benchmark workloads"),
        (
            env!("CARGO_BIN_EXE_kiln-train-dynamic"),
            "Train the character-level GPT on the dynamic path",
        ),
    ] {
        let (code, help, err) = output::run(bin, &["--help"]);
        assert_eq!(code, Some(0), "{bin}: {err}");
        assert!(help.starts_with(first), "{bin}: {help}");
    }
}

/// The GPT configurations save to their own default files: `--model gpt-tiny` leaves
/// the small GPT's checkpoint alone. Piped, the run's progress is plain lines.
#[test]
fn gpt_configurations_save_to_their_own_files() {
    let dir = std::env::temp_dir().join(format!("kiln-gpt-paths-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let out = std::process::Command::new(TRAIN)
        .args(["--model", "gpt-tiny", "--limit", "4096", "--epochs", "1"])
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Its output went to a pipe, not a terminal: progress came as plain lines.
    let log = String::from_utf8_lossy(&out.stdout);
    assert!(
        log.lines()
            .any(|l| l.starts_with("step ") && l.contains("(100%) loss")),
        "{log}"
    );
    assert!(dir.join("runs/gpt-tiny-shakespeare.safetensors").exists());
    assert!(!dir.join("runs/gpt-shakespeare.safetensors").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}
