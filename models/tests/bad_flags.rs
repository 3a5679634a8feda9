//! `kiln-train` refuses nonsense before it works: one line naming the flag or the path,
//! a non-zero exit status, no backtrace, and nothing saved.

use std::process::Command;

const TRAIN: &str = env!("CARGO_BIN_EXE_kiln-train");

/// Runs kiln-train; its exit status and standard error.
fn run(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(TRAIN)
        .args(args)
        .output()
        .expect("kiln-train runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[test]
fn nonsense_flags_and_paths_are_refused_in_one_line() {
    let dir = std::env::temp_dir().join(format!("kiln-bad-flags-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("model.safetensors");
    let out = out.to_str().unwrap();
    let folder = dir.to_str().unwrap();
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
        (&["--batch-size", "7"], "batch size 7 is not one of"),
        (
            &["--out", "/proc/kiln-nowhere/model.safetensors"],
            "cannot write the checkpoint /proc/kiln-nowhere/model.safetensors",
        ),
        (&["--out", folder], "is a folder"),
        (
            &["--model", "gpt-tiny", "--limit", "100"],
            "--limit 100 leaves less than one step",
        ),
    ];
    for (args, want) in cases {
        let mut all = args.to_vec();
        if !all.contains(&"--out") {
            all.extend(["--out", out]);
        }
        let (code, err) = run(&all);
        assert_eq!(code, Some(1), "kiln-train {all:?}: {err}");
        assert!(err.contains(want), "kiln-train {all:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "kiln-train {all:?}: {err}");
        assert!(!err.contains("panicked"), "kiln-train {all:?}: {err}");
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
            env!("CARGO_BIN_EXE_kiln-infer"),
            vec!["--data", crafted, "--checkpoint", checkpoint],
            "more than the 2147483648 bytes an IDX file may hold",
        ),
    ] {
        let mut all = args.clone();
        if bin == TRAIN {
            all.extend(["--out", out]);
        }
        let o = Command::new(bin)
            .args(&all)
            .output()
            .expect("the binary runs");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{all:?}: {err}");
        assert!(err.contains(want), "{all:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{all:?}: {err}");
    }
    // What the parser refuses is one line too, with its usage hint (exit status 2).
    let (code, err) = run(&["--warmup", "-5"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("invalid value '-5' for '--warmup"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `kiln-infer` checks what a checkpoint records (model, data set) against the command
/// line before it evaluates.
#[test]
fn kiln_infer_refuses_a_checkpoint_of_another_model_or_data_set() {
    use kiln::cpu::{Cpu, CpuDevice};
    use kiln::tensor::nn::Module;
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
        let out = Command::new(env!("CARGO_BIN_EXE_kiln-infer"))
            .args(&args)
            .args(["--checkpoint", path])
            .output()
            .expect("kiln-infer runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    }
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
        let o = Command::new(bin)
            .args(args)
            .output()
            .expect("the binary runs");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    }
}
