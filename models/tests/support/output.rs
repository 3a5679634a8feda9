//! Running the binaries in tests and reading their output.

// Each test file uses what it needs of these.
#![allow(dead_code)]

use std::process::Command;

/// Runs `bin` with `args`: its exit status code, standard output and standard error.
pub fn run(bin: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(bin)
        .args(args)
        .output()
        .expect("the binary runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs `bin` with `args` and checks it refused them as a user's mistake should be:
/// exit status 1, and standard error one line that contains `want`, no backtrace.
pub fn assert_refused(bin: &str, args: &[&str], want: &str) {
    let (code, _, err) = run(bin, args);
    assert_eq!(code, Some(1), "{bin} {args:?}: {err}");
    assert!(err.contains(want), "{bin} {args:?}: {err}");
    assert_eq!(err.trim().lines().count(), 1, "{bin} {args:?}: {err}");
    assert!(!err.contains("panicked"), "{bin} {args:?}: {err}");
}

/// The first number after `key` in `text` (a panic naming both when `key` is absent).
pub fn number_after(text: &str, key: &str) -> f64 {
    let at = text
        .find(key)
        .unwrap_or_else(|| panic!("no `{key}` in {text}"))
        + key.len();
    text[at..]
        .trim_start()
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .next()
        .unwrap()
        .parse()
        .unwrap()
}
