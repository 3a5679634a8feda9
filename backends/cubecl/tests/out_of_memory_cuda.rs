//! Running out of a CUDA device's memory is an error a program catches and survives,
//! with no limit set by the user: a CUDA device opens limited to 90% of its memory,
//! allocations past it are `Error::OutOfMemory` naming the device, and once tensors are
//! dropped the same device computes and trains again. One test: the limit is the
//! device's, shared by every test of a binary. Runs on a CUDA machine (the H200 call
//! of scripts/gpu_device_run.sh); CI builds it only with the `cuda` feature.

#![cfg(feature = "cuda")]

mod common;

use kiln_cubecl::{Cuda, CudaDevice};
use kiln_tensor::{DType, Error, RawTensor, Result};

#[test]
fn filling_the_device_is_an_error_the_program_survives() -> Result<()> {
    let dev = CudaDevice::first().unwrap_or_else(|e| panic!("no CUDA device: {e}"));
    let limit = dev
        .memory_limit()
        .expect("a CUDA device opens with a memory limit");
    // 8 GiB at a time until the limit refuses one.
    let chunk = 2usize << 30;
    let mut held = Vec::new();
    let error = loop {
        match RawTensor::<Cuda>::zeros(&[chunk], DType::F32, &dev) {
            Ok(t) => held.push(t),
            Err(e) => break e,
        }
        assert!(
            (held.len() as u64) * (chunk as u64 * 4) <= limit,
            "{} GiB held past the {limit}-byte limit",
            held.len() * 8
        );
    };
    match &error {
        Error::OutOfMemory { device, bytes } => {
            assert_eq!(*bytes, chunk * 4);
            assert!(device.contains("memory limit"), "{device}");
        }
        other => panic!("expected out of memory, got {other:?}"),
    }
    let filled = held.len() as u64 * chunk as u64 * 4;
    assert!(
        filled + (chunk as u64 * 4) > limit,
        "refused at {filled} bytes, below the {limit}-byte limit"
    );
    println!(
        "held {} GiB of a {:.1} GiB limit before the refusal: {error}",
        filled >> 30,
        limit as f64 / (1u64 << 30) as f64
    );
    // What was held still reads; once it is dropped, a layer trains: its forward
    // pass, the gradient of its weight, and the weight updated.
    assert_eq!(held[0].to_vec::<f32>()?[..4], [0.0; 4]);
    drop(held);
    common::a_layer_trains::<Cuda>(&dev)
}
