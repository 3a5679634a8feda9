//! The `gemm` crate's f32 throughput on one shape, printed as Kiln's bench_gemm prints
//! its own: `gemm f32 MxNxK ll threads=T gflops=G us=U isa=gemm-crate`.
//!
//! Usage: kiln-gemm-peer MxNxK LL THREADS SAMPLES
//! Layout letters as bench_gemm's: `n` row-major, `t` a transposed view of a row-major
//! buffer. The median of SAMPLES timed batches, each long enough to time.

use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: kiln-gemm-peer MxNxK LL THREADS SAMPLES";
    let [_, shape, layout, threads, samples] = &args[..] else {
        panic!("{usage}");
    };
    let dims: Vec<usize> = shape.split('x').map(|d| d.parse().expect(usage)).collect();
    let [m, n, k] = dims[..] else { panic!("{usage}") };
    let (threads, samples): (usize, usize) =
        (threads.parse().expect(usage), samples.parse().expect(usage));
    let lay: Vec<char> = layout.chars().collect();
    let value = |i: usize| ((i * 7919 % 2003) as f32 / 1001.5) - 1.0;
    let a: Vec<f32> = (0..m * k).map(value).collect();
    let b: Vec<f32> = (0..k * n).map(|i| value(i + 17)).collect();
    let mut c = vec![0f32; m * n];
    // (column stride, row stride) of each operand as the crate takes them.
    let a_strides = if lay[0] == 'n' { (1, k) } else { (m, 1) };
    let b_strides = if lay[1] == 'n' { (1, n) } else { (k, 1) };
    let parallelism = if threads > 1 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    let mut run = || unsafe {
        // SAFETY: the buffers hold m*k, k*n and m*n elements, addressed within them by
        // the strides above.
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.as_ptr(),
            a_strides.0 as isize,
            a_strides.1 as isize,
            b.as_ptr(),
            b_strides.0 as isize,
            b_strides.1 as isize,
            0.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        )
    };
    for _ in 0..3 {
        run();
    }
    let t = Instant::now();
    run();
    let one = t.elapsed().as_secs_f64().max(1e-7);
    let reps = ((3e-3 / one) as usize).clamp(1, 100_000);
    let mut times: Vec<f64> = (0..samples.max(1))
        .map(|_| {
            let t = Instant::now();
            for _ in 0..reps {
                run();
            }
            t.elapsed().as_secs_f64() / reps as f64
        })
        .collect();
    times.sort_by(f64::total_cmp);
    let secs = times[times.len() / 2];
    println!(
        "gemm f32 {m}x{n}x{k} {layout} threads={threads} gflops={:.1} us={:.1} isa=gemm-crate",
        2.0 * (m * n * k) as f64 / secs / 1e9,
        secs * 1e6
    );
}
