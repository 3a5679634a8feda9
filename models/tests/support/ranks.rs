//! What the tests of data-parallel ranks as processes share: scratch folders, the
//! trained MLP's parameters compared to rounding, and children watched to their end.

// Each test file uses what it needs of these.
#![allow(dead_code)]

use kiln::cpu::{Cpu, CpuDevice};
use kiln::tensor::nn::Module;
use kiln_models::mlp::Mlp;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

/// A fresh scratch folder for the test `name` of the file whose folders start with
/// `prefix`.
pub fn scratch(prefix: &str, name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("{prefix}-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Every parameter of the MLP checkpoint at `path`, in visit order.
pub fn params(path: &Path) -> Vec<(String, Vec<f32>)> {
    let m: Mlp<Cpu> = kiln::train::checkpoint::load_new(path, &CpuDevice, false).unwrap();
    let mut out = Vec::new();
    m.visit_params("", &mut |s| {
        out.push((s.name.to_string(), s.value.to_vec::<f32>().unwrap()))
    });
    out
}

/// Holds two checkpoints of the MLP equal to rounding: one trained on whole batches,
/// the other by ranks that each summed a share of them before their mean.
pub fn assert_same_training(one: &Path, other: &Path) {
    let (a, b) = (params(one), params(other));
    assert_eq!(a.len(), b.len());
    for ((name, x), (_, y)) in a.iter().zip(&b) {
        let scale = x.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
        let worst = x
            .iter()
            .zip(y)
            .map(|(p, q)| (p - q).abs())
            .fold(0.0f32, f32::max);
        assert!(
            worst <= 1e-5 * scale,
            "{name}: {worst} apart (scale {scale})"
        );
    }
}

/// A child's exit code, standard output and standard error once it ends (each empty
/// when not piped), failing the test if it runs past `limit`.
pub fn finish(mut child: Child, limit: Duration) -> (Option<i32>, String, String) {
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            let _ = child.kill();
            panic!("the rank still ran after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
