//! The GPT's binaries as a user runs them: `kiln-train --model gpt` on a slice of the
//! text writes a checkpoint that `kiln-generate` samples from; nonsense flags are one
//! clear error line and a failing exit status.

#[path = "support/output.rs"]
mod output;

/// Runs `bin` with `args`: whether it succeeded, its standard output and error.
fn run(bin: &str, args: &[&str]) -> (bool, String, String) {
    let (code, out, err) = output::run(bin, args);
    (code == Some(0), out, err)
}

#[test]
fn train_then_generate() {
    let dir = std::env::temp_dir().join(format!("kiln-gpt-bins-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ckpt = dir.join("gpt.safetensors");
    let ckpt = ckpt.to_str().unwrap();
    let train = env!("CARGO_BIN_EXE_kiln-train");
    let generate = env!("CARGO_BIN_EXE_kiln-generate");

    let (ok, out, err) = run(
        train,
        &[
            "--model",
            "gpt-tiny",
            "--optimizer",
            "adamw",
            "--lr",
            "0.01",
            "--batch-size",
            "16",
            "--limit",
            "20000",
            "--out",
            ckpt,
        ],
    );
    assert!(ok, "kiln-train failed: {err}");
    assert!(out.contains("held-out loss"), "{out}");
    // The training curve beside the checkpoint.
    let png = std::fs::read(dir.join("gpt.png")).expect("the curve was written");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    assert!(out.contains("training curve"), "{out}");

    let (ok, out, err) = run(
        generate,
        &[
            "--checkpoint",
            ckpt,
            "--prompt",
            "KING:",
            "--bytes",
            "40",
            "--seed",
            "3",
        ],
    );
    assert!(ok, "kiln-generate failed: {err}");
    assert!(
        out.starts_with("KING:") && out.len() >= "KING:".len() + 40,
        "{out:?}"
    );
    // Seeded: the same draw again.
    let (_, again, _) = run(
        generate,
        &[
            "--checkpoint",
            ckpt,
            "--prompt",
            "KING:",
            "--bytes",
            "40",
            "--seed",
            "3",
        ],
    );
    assert_eq!(out, again);

    // The small configuration: two steps, then a few bytes from its checkpoint (the
    // metadata names the configuration, so kiln-generate builds the right model).
    let small = dir.join("small.safetensors");
    let small = small.to_str().unwrap();
    let (ok, out, err) = run(
        train,
        &[
            "--model",
            "gpt",
            "--optimizer",
            "adamw",
            "--batch-size",
            "16",
            "--epochs",
            "1",
            "--limit",
            "5000",
            "--out",
            small,
        ],
    );
    assert!(ok, "kiln-train --model gpt failed: {err}");
    assert!(out.contains("SmallGpt") && out.contains("2 steps"), "{out}");
    let (ok, out, err) = run(
        generate,
        &["--checkpoint", small, "--prompt", "A", "--bytes", "5"],
    );
    assert!(ok, "kiln-generate on the small GPT failed: {err}");
    assert!(out.starts_with('A') && out.len() >= 6, "{out:?}");

    for (bin, args, says) in [
        (
            generate,
            vec!["--checkpoint", ckpt, "--temperature", "0"],
            "--temperature must be a positive number",
        ),
        (
            generate,
            vec!["--checkpoint", ckpt, "--top-k", "300"],
            "--top-k must be between 1 and 256",
        ),
        (
            generate,
            vec!["--checkpoint", "/nonexistent/gpt.safetensors"],
            "cannot read",
        ),
        (
            train,
            vec!["--model", "gpt", "--dataset", "mnist"],
            "--dataset chooses the image models' data",
        ),
        (
            train,
            vec!["--model", "gpt", "--batch-size", "0"],
            "--batch-size 0 takes no examples a step",
        ),
        (
            train,
            vec!["--model", "gpt", "--limit", "100"],
            "less than one step",
        ),
    ] {
        let (ok, _, err) = run(bin, &args);
        assert!(!ok, "{args:?} succeeded");
        assert!(
            err.starts_with("error: ") && err.contains(says),
            "{args:?}: {err}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bf16_and_f16_training_match_f32_and_their_checkpoints_generate() {
    let dir = std::env::temp_dir().join(format!("kiln-gpt-bf16-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let train = env!("CARGO_BIN_EXE_kiln-train");
    let held_out = |precision: &str| {
        let ckpt = dir.join(format!("gpt-{precision}.safetensors"));
        let ckpt = ckpt.to_str().unwrap().to_string();
        let (ok, out, err) = run(
            train,
            &[
                "--model",
                "gpt-tiny",
                "--precision",
                precision,
                "--optimizer",
                "adamw",
                "--lr",
                "0.01",
                "--batch-size",
                "16",
                "--limit",
                "20000",
                "--out",
                &ckpt,
            ],
        );
        assert!(ok, "kiln-train --precision {precision} failed: {err}");
        (output::number_after(&out, "held-out loss"), ckpt)
    };
    let (exact, _) = held_out("f32");
    for precision in ["bf16", "f16"] {
        let (mixed, ckpt) = held_out(precision);
        assert!(
            (exact - mixed).abs() <= 0.02 * exact,
            "held-out loss {mixed} with {precision} products, {exact} in f32"
        );
        // The checkpoint records the configuration, so kiln-generate builds the model.
        let generate = env!("CARGO_BIN_EXE_kiln-generate");
        let (ok, out, err) = run(generate, &["--checkpoint", &ckpt, "--bytes", "20"]);
        assert!(
            ok,
            "kiln-generate failed on a {precision}-trained checkpoint: {err}"
        );
        assert!(out.len() >= 20, "{out:?}");
    }
}
