//! The backend conformance suite of `kiln_tensor::testing` on the wgpu backend (Mesa's
//! lavapipe on machines without a GPU), as `Config::vulkan` holds it: the dtypes wgpu
//! has (f32, i32, u32, bool), `sin` and `cos` to Vulkan's bound. A machine without a
//! Vulkan adapter fails every test with what to install.

#![cfg(feature = "wgpu")]

use kiln_cubecl::{Wgpu, WgpuDevice};
use kiln_tensor::testing::Config;

fn device() -> WgpuDevice {
    WgpuDevice::first().unwrap_or_else(|e| panic!("no wgpu device for the conformance suite: {e}"))
}

kiln_tensor::conformance_tests!(Wgpu, device(), Config::vulkan());
