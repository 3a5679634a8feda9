//! A nonsense value of an environment variable the wgpu runtime reads is one error
//! naming the variable when the device opens, not a panic inside CubeCL. Its own test
//! binary: the variable is process-wide, and the device is opened once per process.

#![cfg(feature = "wgpu")]

use kiln_cubecl::WgpuDevice;

#[test]
fn a_nonsense_launches_per_submission_is_refused_naming_the_variable() {
    std::env::set_var("CUBECL_WGPU_MAX_TASKS", "lots");
    let e = WgpuDevice::new(0).map(|_| ()).unwrap_err().to_string();
    assert!(
        e.contains("CUBECL_WGPU_MAX_TASKS") && e.contains("\"lots\"") && e.contains("at least 1"),
        "{e}"
    );
    // Zero launches per submission is refused too; a whole number opens the device.
    std::env::set_var("CUBECL_WGPU_MAX_TASKS", "0");
    assert!(WgpuDevice::new(0).is_err());
    std::env::set_var("CUBECL_WGPU_MAX_TASKS", "16");
    let dev = WgpuDevice::new(0).unwrap_or_else(|e| panic!("no wgpu device: {e}"));
    let x = kiln_tensor::RawTensor::<kiln_cubecl::Wgpu>::from_vec(vec![1f32, 2.0], &[2], &dev)
        .and_then(|x| x.add(&x))
        .and_then(|y| y.to_vec::<f32>());
    assert_eq!(x.unwrap(), vec![2.0, 4.0]);
}
