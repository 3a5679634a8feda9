//! The dynamic path equals the static path for every model of kiln-models on wgpu
//! (lavapipe in CI), and a `#[model]` with a dynamic part against the same network all
//! planned: the comparisons and tolerance of
//! models/tests/support/dynamic_equal.rs, one seed each (the CPU test draws more).
#![cfg(feature = "wgpu")]

use kiln_cubecl::{Wgpu, WgpuDevice};

#[path = "../../tests/support/dynamic_equal.rs"]
mod equal;

fn dev() -> WgpuDevice {
    WgpuDevice::first().expect("a wgpu adapter (lavapipe in CI)")
}

#[test]
fn mlp() {
    equal::mlp::<Wgpu>(&dev(), 4);
}

#[test]
fn lenet() {
    equal::lenet::<Wgpu>(&dev(), 5);
}

#[test]
fn residual_mlp() {
    equal::residual::<Wgpu>(&dev(), 6);
}

#[test]
fn attention() {
    equal::attention::<Wgpu>(&dev(), 7);
}

#[test]
fn gpt() {
    equal::gpt::<Wgpu>(&dev(), 8);
}

#[test]
fn hybrid_with_a_dynamic_part() {
    for case in [
        equal::HybridCase::Once,
        equal::HybridCase::Twice,
        equal::HybridCase::Deep,
    ] {
        equal::hybrid::<Wgpu>(&dev(), 9, case);
    }
}
