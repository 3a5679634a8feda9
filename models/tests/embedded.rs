//! Inference binaries with their weights built in (`kiln::embed!`), built by
//! scripts/test.sh from checkpoints it trains into models/weights/ (hence the feature,
//! which a plain `cargo test` leaves off): the embedded weights are the checkpoint's,
//! bit for bit, the example binaries classify image files as `kiln-classify` does with
//! the checkpoint, and the GPT's continues a prompt as `kiln-generate` does.

#![cfg(feature = "embedded-weights")]

#[path = "support/bits.rs"]
mod bits;
#[path = "support/output.rs"]
mod output;
use bits::bits;

use kiln::cpu::{Cpu, CpuDevice};
use kiln::tensor::nn::Module;
use kiln::train::checkpoint;
use kiln_models::{lenet::LeNet, mlp::Mlp};
use std::path::{Path, PathBuf};

fn weights(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("weights")
        .join(file)
}

#[test]
fn embedded_weights_are_the_checkpoints() {
    let mlp = kiln::embed!(Mlp, "../weights/mlp-mnist.safetensors")
        .load::<Cpu>(&CpuDevice)
        .unwrap();
    let mut from_file = Mlp::<Cpu>::init(&CpuDevice, 7).unwrap();
    checkpoint::load(&mut from_file, weights("mlp-mnist.safetensors")).unwrap();
    assert_eq!(bits(&mlp), bits(&from_file));
    // Built in at an alignment f32 can be read from: no copies.
    let mut copied = Vec::new();
    mlp.visit_params("", &mut |s| {
        if !s.value.storage().is_static() {
            copied.push(s.name.to_string())
        }
    });
    assert!(
        copied.is_empty(),
        "copied instead of read in place: {copied:?}"
    );

    let cnn = kiln::embed!(LeNet, "../weights/cnn-fashion.safetensors")
        .load::<Cpu>(&CpuDevice)
        .unwrap();
    let mut from_file = LeNet::<Cpu>::init(&CpuDevice, 7).unwrap();
    checkpoint::load(&mut from_file, weights("cnn-fashion.safetensors")).unwrap();
    assert_eq!(bits(&cnn), bits(&from_file));
}

/// The examples, next to this test's binary (target/<profile>/examples).
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap().join("examples");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is not built: cargo build -p kiln-models --features embedded-weights --examples",
        path.display()
    );
    path
}

#[test]
fn the_embedded_binaries_classify_image_files() {
    let images = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/images");
    for (binary, prefix, classify_as) in [
        (
            "classify_mnist_embedded",
            "mnist",
            ["--model", "mlp", "--dataset", "mnist"],
        ),
        (
            "classify_fashion_embedded",
            "fashion",
            ["--model", "cnn", "--dataset", "fashion"],
        ),
    ] {
        let mut files: Vec<String> = std::fs::read_dir(&images)
            .unwrap()
            .flatten()
            .map(|e| e.path().to_string_lossy().into_owned())
            .filter(|p| p.contains(&format!("/{prefix}_")))
            .collect();
        files.sort();
        let args: Vec<&str> = files.iter().map(String::as_str).collect();
        let exe = example(binary);
        let (code, stdout, err) = output::run(exe.to_str().unwrap(), &args);
        assert_eq!(code, Some(0), "{err}");
        assert!(err.contains("ready in"), "{err}");
        // The same lines as kiln-classify with the checkpoint the weights came from.
        let ckpt = weights(&format!(
            "{}.safetensors",
            if prefix == "mnist" {
                "mlp-mnist"
            } else {
                "cnn-fashion"
            }
        ));
        let mut all = classify_as.to_vec();
        all.extend(["--checkpoint", ckpt.to_str().unwrap()]);
        all.extend(args.iter().copied());
        let (code, from_file, err) = output::run(env!("CARGO_BIN_EXE_kiln-classify"), &all);
        assert_eq!(code, Some(0), "{err}");
        assert_eq!(stdout, from_file);
        assert_eq!(stdout.lines().count(), 4, "{stdout}");

        // Nothing to classify, and a file that is not an image: one error each.
        let (code, _, err) = output::run(exe.to_str().unwrap(), &[]);
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains("name the image files"), "{err}");
        let bad = images.join("not_an_image.png");
        let (code, _, err) = output::run(exe.to_str().unwrap(), &[bad.to_str().unwrap()]);
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains("neither a PNG, a JPEG nor a PGM"), "{err}");
        // `--help` is help, not a file to open; another option is refused.
        let (code, help, err) = output::run(exe.to_str().unwrap(), &["--help"]);
        assert_eq!(code, Some(0), "{err}");
        assert!(help.contains("usage: <this program> IMAGE..."), "{help}");
        let (code, _, err) = output::run(exe.to_str().unwrap(), &["--bogus"]);
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains("unknown option --bogus"), "{err}");
    }
}

#[test]
fn the_embedded_gpt_continues_a_prompt_as_kiln_generate_does() {
    let exe = example("generate_embedded");
    let (code, stdout, err) = output::run(exe.to_str().unwrap(), &["JULIET:"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        stdout.starts_with("JULIET:") && stdout.len() > 300,
        "{stdout}"
    );
    let ckpt = weights("gpt-shakespeare.safetensors");
    let (code, from_file, err) = output::run(
        env!("CARGO_BIN_EXE_kiln-generate"),
        &[
            "--checkpoint",
            ckpt.to_str().unwrap(),
            "--prompt",
            "JULIET:",
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(stdout, from_file);
    let (code, help, err) = output::run(exe.to_str().unwrap(), &["--help"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(help.contains("usage: <this program> [PROMPT]"), "{help}");
}

#[test]
fn the_embedded_int8_checkpoint_is_kiln_quantizes_and_classifies_as_kiln_infer_does() {
    use kiln_models::mlp::MlpInt8;
    let embedded = kiln::embed!(MlpInt8, "../weights/mlp-mnist-int8.safetensors");
    let built_in: MlpInt8<Cpu> = embedded.load(&CpuDevice).unwrap();
    let from_file: MlpInt8<Cpu> =
        checkpoint::load_new(weights("mlp-mnist-int8.safetensors"), &CpuDevice, false).unwrap();
    let tensors = |m: &MlpInt8<Cpu>| {
        let mut all = Vec::new();
        m.visit_buffers("", &mut |s| {
            all.push((s.name.to_string(), s.value.to_host().unwrap()))
        });
        all
    };
    assert_eq!(tensors(&built_in), tensors(&from_file));
    // The example binary's accuracy is kiln-infer's on the same file.
    let (code, out, err) = output::run(example("mlp_int8_embedded").to_str().unwrap(), &[]);
    assert_eq!(code, Some(0), "{err}");
    let path = weights("mlp-mnist-int8.safetensors");
    let (code, infer, err) = output::run(
        env!("CARGO_BIN_EXE_kiln-infer"),
        &[
            "--checkpoint",
            path.to_str().unwrap(),
            "--latency-images",
            "1",
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    let accuracy = |s: &str| output::number_after(s, "test accuracy");
    assert_eq!(accuracy(&out), accuracy(&infer), "{out}\n{infer}");
}
