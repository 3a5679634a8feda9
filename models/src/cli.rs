//! What the binaries' command lines share: `--device`.

use clap::Args;
use kiln::device::DeviceChoice;

/// `--device`, flattened into each binary's arguments.
#[derive(Args, Clone, Copy, Debug)]
pub struct DeviceArg {
    /// Where to run: cpu, wgpu, wgpu:N (the N-th adapter, GPUs first), cuda or cuda:N
    /// (the GPU backends need a build with the `wgpu` / `cuda` feature).
    #[arg(long, default_value = "cpu")]
    pub device: DeviceChoice,
}
