//! Errors only a kernel can see (an index out of range, an integer division by zero)
//! are read at the launching thread's next download or synchronisation: they are
//! returned there once, naming the op and the index, never by another thread.

#![cfg(feature = "wgpu")]

use kiln_cubecl::{Wgpu, WgpuDevice};
use kiln_tensor::{Backend, DType, RawTensor, Result};

fn device() -> WgpuDevice {
    WgpuDevice::first().unwrap_or_else(|e| panic!("no wgpu device for the error tests: {e}"))
}

fn bad_gather(dev: &WgpuDevice) -> Result<RawTensor<Wgpu>> {
    let data = RawTensor::<Wgpu>::zeros(&[4, 3], DType::F32, dev)?;
    let index = RawTensor::<Wgpu>::from_vec(vec![0i32, 1, 7, 2], &[4, 1], dev)?;
    data.gather(1, &index)
}

#[test]
fn a_bad_index_is_reported_at_the_next_read_once() -> Result<()> {
    let dev = device();
    let out = bad_gather(&dev)?;
    let err = out.to_vec::<f32>().unwrap_err().to_string();
    assert!(
        err.contains("gather") && err.contains("index 7 is out of range for axis 1 of size 3"),
        "{err}"
    );
    // Reported once: the next read on this thread is clean.
    let fine = RawTensor::<Wgpu>::from_vec(vec![1f32, 2.0], &[2], &dev)?;
    assert_eq!(fine.add(&fine)?.to_vec::<f32>()?, vec![2.0, 4.0]);
    Ok(())
}

#[test]
fn synchronize_reports_a_division_by_zero() -> Result<()> {
    let dev = device();
    let a = RawTensor::<Wgpu>::from_vec(vec![4i32, 6], &[2], &dev)?;
    let b = RawTensor::<Wgpu>::from_vec(vec![2i32, 0], &[2], &dev)?;
    let _quotient = a.div(&b)?;
    let err = Wgpu::synchronize(&dev).unwrap_err().to_string();
    assert!(err.contains("integer division by zero"), "{err}");
    Wgpu::synchronize(&dev)?;
    Ok(())
}

#[test]
fn another_threads_error_stays_with_that_thread() -> Result<()> {
    let dev = device();
    let other = dev.clone();
    let (launched_tx, launched_rx) = std::sync::mpsc::channel();
    let (checked_tx, checked_rx) = std::sync::mpsc::channel::<()>();
    let worker = std::thread::spawn(move || -> Result<String> {
        let out = bad_gather(&other)?;
        launched_tx.send(()).expect("main thread waits");
        checked_rx.recv().expect("main thread answers");
        Ok(out.to_vec::<f32>().unwrap_err().to_string())
    });
    launched_rx.recv().expect("worker launches");
    // The worker's bad gather is queued; this thread's reads are not affected.
    let x = RawTensor::<Wgpu>::from_vec(vec![3f32], &[1], &dev)?;
    assert_eq!(x.to_vec::<f32>()?, vec![3.0]);
    Wgpu::synchronize(&dev)?;
    checked_tx.send(()).expect("worker waits");
    let err = worker.join().expect("worker thread")?;
    assert!(err.contains("index 7 is out of range"), "{err}");
    Ok(())
}
