//! Running out of device memory is an error a program catches and survives: under a
//! memory limit (`CubeDevice::set_memory_limit`), allocations past it are
//! `Error::OutOfMemory` naming the device, and once tensors are dropped the same
//! device allocates and computes again. One test: the limit is the device's, shared by
//! every test of a binary.

#![cfg(feature = "wgpu")]

use kiln_cubecl::{Wgpu, WgpuDevice};
use kiln_tensor::nn::{Linear, Module};
use kiln_tensor::{DType, Error, Rank2, RawTensor, Result, Tensor};

#[test]
fn out_of_memory_is_an_error_the_program_survives() -> Result<()> {
    let dev = WgpuDevice::first().unwrap_or_else(|e| panic!("no wgpu device: {e}"));
    dev.set_memory_limit(Some(64 << 20));
    assert_eq!(dev.memory_limit(), Some(64 << 20));

    // 8 MiB at a time until the 64 MiB limit refuses one.
    let mut held = Vec::new();
    let error = loop {
        match RawTensor::<Wgpu>::zeros(&[2 << 20], DType::F32, &dev) {
            Ok(t) => held.push(t),
            Err(e) => break e,
        }
        assert!(held.len() < 64, "the limit never refused an allocation");
    };
    match &error {
        Error::OutOfMemory { device, bytes } => {
            assert_eq!(*bytes, 8 << 20);
            assert!(device.contains("memory limit"), "{device}");
        }
        other => panic!("expected out of memory, got {other:?}"),
    }
    assert!(
        (4..=8).contains(&held.len()),
        "{} tensors of 8 MiB fit under 64 MiB",
        held.len()
    );
    // An upload past the limit is refused the same way.
    let e = RawTensor::<Wgpu>::from_vec(vec![1f32; 16 << 20], &[16 << 20], &dev).unwrap_err();
    assert!(matches!(e, Error::OutOfMemory { .. }), "{e:?}");

    // Survived: what was held still reads, and once it is dropped, work goes on.
    assert_eq!(held[0].to_vec::<f32>()?[..4], [0.0; 4]);
    drop(held);
    let x = RawTensor::<Wgpu>::from_vec(vec![1f32, 2.0, 3.0], &[3], &dev)?;
    assert_eq!(x.add(&x)?.to_vec::<f32>()?, vec![2.0, 4.0, 6.0]);
    let big: Vec<RawTensor<Wgpu>> = (0..4)
        .map(|_| RawTensor::<Wgpu>::zeros(&[2 << 20], DType::F32, &dev))
        .collect::<Result<_>>()?;
    assert_eq!(big.len(), 4);
    drop(big);

    // A layer whose forward pass does not fit fails cleanly; under a larger limit the
    // same layer and input run.
    let layer = Linear::<Wgpu, 1024, 1024>::init(&dev, 1)?;
    let input =
        Tensor::<Wgpu, Rank2<4096, 1024>>::from_vec(vec![0.01; 4096 * 1024], &[4096, 1024], &dev)?;
    dev.set_memory_limit(Some(24 << 20));
    let e = layer.forward(&input).map(|_| ()).unwrap_err();
    assert!(matches!(e, Error::OutOfMemory { .. }), "{e:?}");
    dev.set_memory_limit(Some(128 << 20));
    let y = layer.forward(&input)?;
    assert!(y.to_vec()?.iter().all(|v: &f32| v.is_finite()));
    dev.set_memory_limit(None);
    Ok(())
}
