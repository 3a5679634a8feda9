//! `--device` on every binary: a nonsense device is refused by the argument parser with
//! the forms it takes; a backend the build lacks is refused with the build line that
//! adds it (one line, exit status 1, before any work); `--device cpu` is the default.

#[path = "support/output.rs"]
mod output;
#[cfg(feature = "wgpu")]
use output::number_after;
use output::run;

/// Every binary that takes `--device`, with arguments that make a run short.
const BINARIES: [(&str, &str); 4] = [
    ("kiln-train", env!("CARGO_BIN_EXE_kiln-train")),
    ("kiln-infer", env!("CARGO_BIN_EXE_kiln-infer")),
    ("kiln-generate", env!("CARGO_BIN_EXE_kiln-generate")),
    (
        "kiln-train-dynamic",
        env!("CARGO_BIN_EXE_kiln-train-dynamic"),
    ),
];

#[test]
fn a_nonsense_device_is_refused_with_the_forms_it_takes() {
    for (name, path) in BINARIES {
        for bad in ["gpu", "cuda:x", "cpu:1", "vulkan"] {
            let (code, _, err) = run(path, &["--device", bad]);
            assert_eq!(code, Some(2), "{name} --device {bad}: {err}");
            assert!(
                err.contains(
                    "use cpu, wgpu, wgpu:N (the N-th adapter, GPUs first), cuda or cuda:N"
                ),
                "{name} --device {bad}: {err}"
            );
        }
    }
}

#[test]
fn a_backend_this_build_lacks_is_refused_with_the_build_line() {
    for (feature, built) in [
        ("wgpu", cfg!(feature = "wgpu")),
        ("cuda", cfg!(feature = "cuda")),
    ] {
        if built {
            continue;
        }
        for (name, path) in BINARIES {
            let (code, out, err) = run(path, &["--device", feature]);
            assert_eq!(code, Some(1), "{name} --device {feature}: {out}{err}");
            let want = format!(
                "error: invalid argument to `device`: this program was built without the `{feature}` backend"
            );
            assert!(err.starts_with(&want), "{name}: {err}");
            assert!(
                err.contains(&format!("--features {feature}")),
                "{name}: {err}"
            );
            assert_eq!(err.lines().count(), 1, "{name}: one line: {err}");
            assert!(!out.contains("training"), "{name} did no work: {out}");
        }
    }
}

/// The MLP learns on wgpu's first adapter (lavapipe in CI) through the whole training
/// stack (data loader, build-time gradients, SGD, the schedule, the binary), and the
/// checkpoint it saves evaluates there too (CI: `cargo test -p kiln-models --features
/// wgpu --test devices`). 32 steps reach about 85% on the CPU; the bar leaves room for
/// other rounding. The 95% recipe runs on the CPU (`mnist_short`): lavapipe takes about
/// 8 minutes for it on 2 cores, and wgpu's values are held to the op-by-op path and the
/// CPU by kiln-gpu-system's tests.
#[cfg(feature = "wgpu")]
#[test]
fn the_mlp_trains_and_evaluates_on_wgpu() {
    let dir = std::env::temp_dir().join(format!("kiln-devices-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ckpt = dir.join("mlp.safetensors");
    let ckpt = ckpt.to_str().unwrap();
    let (code, out, err) = run(
        BINARIES[0].1,
        &[
            "--device", "wgpu", "--limit", "2048", "--epochs", "1", "--out", ckpt,
        ],
    );
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.starts_with("device: "), "{out}");
    let png = std::fs::read(dir.join("mlp.png")).expect("the curve beside the checkpoint");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    // Ten classes: a guess scores 10%; 16 steps reach about 69%.
    let acc = number_after(&out[out.rfind("test accuracy").unwrap()..], "test accuracy");
    assert!(acc > 75.0, "test accuracy {acc}%: {out}");
    let (code, out, err) = run(
        BINARIES[1].1,
        &[
            "--device",
            "wgpu",
            "--checkpoint",
            ckpt,
            "--latency-images",
            "20",
        ],
    );
    assert_eq!(code, Some(0), "{out}{err}");
    // The checkpoint evaluates to the accuracy the training run reported.
    let evaluated = number_after(&out, "test accuracy");
    assert!(
        (evaluated - acc).abs() < 0.011,
        "{evaluated} vs {acc}: {out}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An adapter that is not there is one line naming what was found and what to install.
#[cfg(feature = "wgpu")]
#[test]
fn a_missing_adapter_is_one_line_saying_what_to_install() {
    for (name, path) in BINARIES {
        let (code, out, err) = run(path, &["--device", "wgpu:9"]);
        assert_eq!(code, Some(1), "{name}: {out}{err}");
        let err: Vec<&str> = err
            .lines()
            .filter(|l| !l.contains("XDG_RUNTIME_DIR"))
            .collect();
        assert_eq!(err.len(), 1, "{name}: {err:?}");
        assert!(
            err[0].starts_with("error: device error: no wgpu adapter 9 (found ")
                && err[0].contains("install"),
            "{name}: {err:?}"
        );
    }
}
