//! What the out-of-memory tests check once memory is free again, on any backend.

use kiln_tensor::nn::{Linear, Module};
use kiln_tensor::{Backend, Rank2, RawTensor, Result, Tensor};

/// A layer trains on `dev`: its forward pass, the gradient of its weight (for Σ y,
/// d/dW = 1ᵀ·x: each row the column sums of the input) and the weight updated, all
/// finite. About 100 MB of buffers.
pub fn a_layer_trains<B: Backend>(dev: &B::Device) -> Result<()> {
    let layer = Linear::<B, 1024, 1024>::init(dev, 1)?;
    let input =
        Tensor::<B, Rank2<4096, 1024>>::from_vec(vec![0.01; 4096 * 1024], &[4096, 1024], dev)?;
    let y = layer.forward(&input)?;
    assert!(y.to_vec()?.iter().all(|v: &f32| v.is_finite()));
    let mut w = None;
    layer.visit_params("", &mut |s| {
        if s.name == "weight" {
            w = Some(s.value.clone());
        }
    });
    let w = w.expect("a weight");
    let ones = RawTensor::<B>::from_vec(vec![1f32; 4096 * 1024], &[4096, 1024], dev)?;
    let grad = ones.t()?.matmul(input.raw())?;
    let stepped = w.sub(&grad.mul_scalar(1e-3)?)?;
    assert!(stepped.to_vec::<f32>()?.iter().all(|v| v.is_finite()));
    Ok(())
}
