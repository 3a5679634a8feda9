//! The backend conformance suite of `kiln_tensor::testing` on the wgpu backend (Mesa's
//! lavapipe on machines without a GPU), with the dtypes wgpu holds: f32, i32, u32 and
//! bool. A machine without a Vulkan adapter fails every test with what to install.

#![cfg(feature = "wgpu")]

use kiln_cubecl::{Wgpu, WgpuDevice};
use kiln_tensor::testing::Config;
use kiln_tensor::DType;

fn device() -> WgpuDevice {
    WgpuDevice::first().unwrap_or_else(|e| panic!("no wgpu device for the conformance suite: {e}"))
}

fn config() -> Config {
    Config::all()
        .without(DType::F64)
        .without(DType::F16)
        .without(DType::BF16)
}

kiln_tensor::conformance_tests!(Wgpu, device(), config());
