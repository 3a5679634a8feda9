//! A short MNIST run of the `#[model]` MLP (784-1024-1024-10) on wgpu through the
//! whole training stack (data loader, build-time gradients, SGD with momentum, the
//! schedule): `kiln_models::classify::short_mnist_run`, the CPU suite's recipe, must
//! reach 95% on the 10,000 test images with the loss falling fourfold. About two to
//! eight minutes on lavapipe on a 2-core CI machine.

#![cfg(feature = "wgpu")]

use kiln_cubecl::{Wgpu, WgpuDevice};
use kiln_models::classify::short_mnist_run;
use kiln_tensor::Result;

#[test]
fn mlp_trains_on_wgpu() -> Result<()> {
    let dev =
        WgpuDevice::first().unwrap_or_else(|e| panic!("no wgpu device for the MNIST run: {e}"));
    let start = std::time::Instant::now();
    let run = short_mnist_run::<Wgpu>(&dev)?;
    eprintln!(
        "MNIST on wgpu: {} steps in {:.1}s, test accuracy {:.2}%",
        run.losses.len(),
        start.elapsed().as_secs_f64(),
        run.accuracy * 100.0
    );
    run.learned()
        .unwrap_or_else(|e| panic!("the short run did not learn on wgpu: {e}"));
    Ok(())
}
