//! # kiln-cubecl
//!
//! Will own Kiln's GPU backend, one implementation generic over CubeCL runtimes
//! (wgpu/Vulkan and CUDA). It is not ready: the crate compiles so the workspace and the
//! `wgpu`/`cuda` features have a home, and [`status`] says so at run time.

/// Why this backend cannot be used yet.
pub fn status() -> kiln_tensor::Result<()> {
    Err(kiln_tensor::Error::Device(
        "the CubeCL backend (wgpu, cuda) is not implemented yet; use the cpu backend".into(),
    ))
}
