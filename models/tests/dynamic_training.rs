//! `kiln-train-dynamic` trains the GPT on the dynamic path with a sequence length that
//! changes every batch: the held-out loss falls below a uniform guess's, the plan
//! cache serves most steps from plans it made for earlier lengths, and nonsense flags
//! are refused with one clear line.

use std::process::Command;

#[path = "support/output.rs"]
mod output;
use output::number_after;

fn run(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln-train-dynamic"))
        .args(args)
        .output()
        .expect("kiln-train-dynamic runs");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[test]
fn variable_lengths_train_and_reuse_plans() {
    let (ok, text) = run(&[
        "--steps",
        "40",
        "--batch",
        "4",
        "--width",
        "32",
        "--context",
        "64",
        "--min-len",
        "16",
    ]);
    assert!(ok, "{text}");
    let held_out = number_after(&text, "held-out loss");
    // A uniform guess over 256 bytes scores ln 256 = 5.55 nats.
    assert!(held_out < 4.0, "held-out loss {held_out}: {text}");
    let stats = &text[text.find("plan cache:").expect("cache line")..];
    let hits = number_after(stats, "plan cache:");
    let misses = number_after(stats, "hits,");
    assert!(hits >= 30.0 && misses <= 10.0, "{stats}");
}

#[test]
fn nonsense_flags_are_refused() {
    for args in [
        &["--min-len", "0"][..],
        &["--min-len", "500", "--context", "64"],
        &["--lr", "0"],
        &["--steps", "0"],
        &["--heads", "5", "--width", "32"],
    ] {
        let (ok, text) = run(args);
        assert!(!ok, "{args:?} was accepted: {text}");
        assert!(
            text.starts_with("error: ") && text.lines().count() == 1,
            "{args:?}: {text}"
        );
    }
}
