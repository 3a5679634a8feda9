//! The backend conformance suite of `kiln_tensor::testing` on the CUDA backend, with
//! every dtype. A machine without a CUDA driver, device or headers fails every test
//! with what to install.

#![cfg(feature = "cuda")]

use kiln_cubecl::{Cuda, CudaDevice};
use kiln_tensor::testing::Config;

fn device() -> CudaDevice {
    CudaDevice::first().unwrap_or_else(|e| panic!("no CUDA device for the conformance suite: {e}"))
}

kiln_tensor::conformance_tests!(Cuda, device(), Config::all());
