//! GEMM throughput benchmark: one parseable line per figure, e.g.
//! `gemm f32 1024x1024x1024 nn threads=2 gflops=250.1 us=8585.2 isa=avx512` (bf16 lines
//! name the bf16 kernel that ran: `isa=avx512-bf16` or `isa=widened`).
//!
//! Usage: bench_gemm [--filter SUBSTR] [--threads N] [--portable|--avx2] [--samples N]
//!                   [--cputime] [--efficiency] [--best] [--dtype f16|bf16] [--shape MxNxK:ll]
//!                   [--packed]
//! Layout letters: first for A, second for B; `n` = row-major, `t` = a transposed
//! view of a row-major buffer (as in torch's `x.t()`).
//! `--packed` turns the skinny shortcuts off (every shape through the packed kernels).
//! `--dtype f16|bf16` feeds both inputs in that type (lines then say `gemm f16 ...`).
//! `--cputime` times with process CPU time instead of wall time; `--efficiency`
//! prints the best GFLOP/s relative to a single-core FMA-loop peak measured in
//! alternation; `--best` reports the fastest batch instead of the median (all
//! three are aids for a noisy machine, where interference only slows things down).

use kiln_cpu::gemm::{dgemm, sgemm_with, GemmOptions, Isa, MatRef};
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// The benchmarked shapes: (m, n, k, layout). Keep in sync with bench_vs_torch.py.
const SHAPES: &[(usize, usize, usize, &str)] = &[
    (1024, 1024, 1024, "nn"),
    (1024, 1024, 1024, "tn"),
    (1024, 1024, 1024, "nt"),
    (256, 1024, 784, "nn"),
    (256, 10, 1024, "nn"),
    (1, 1024, 784, "nn"),
    (1, 1024, 784, "nt"),
    (784, 1024, 256, "tn"),
    (1024, 10, 256, "tn"),
    (256, 784, 1024, "nt"),
    (256, 1024, 10, "nn"),
    (4, 1024, 784, "nt"),
    (64, 64, 64, "nn"),
    // The small GPT's products (width 128, MLP 512, 4,096 tokens a step): forward
    // against `[out, in]` weights, input gradients, weight gradients.
    (4096, 128, 128, "nt"),
    (4096, 512, 128, "nt"),
    (4096, 128, 512, "nt"),
    (4096, 128, 128, "nn"),
    (4096, 128, 512, "nn"),
    (4096, 512, 128, "nn"),
    (128, 128, 4096, "tn"),
    (128, 512, 4096, "tn"),
    (512, 128, 4096, "tn"),
];

fn rand_vec(len: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// CPU seconds consumed so far by all threads of this process: unlike wall time
/// it does not count time the threads spent descheduled. (Linux; NaN elsewhere.)
#[cfg(target_os = "linux")]
fn cpu_seconds() -> f64 {
    #[repr(C)]
    struct Timespec {
        tv_sec: i64,
        tv_nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clk: i32, tp: *mut Timespec) -> i32;
    }
    const CLOCK_PROCESS_CPUTIME_ID: i32 = 2;
    let mut ts = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: plain libc call writing into a local struct with the C layout of timespec (64-bit Linux).
    let rc = unsafe { clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return f64::NAN;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

#[cfg(not(target_os = "linux"))]
fn cpu_seconds() -> f64 {
    f64::NAN
}

static USE_CPU_TIME: AtomicBool = AtomicBool::new(false);

/// Wall-clock (or, with --cputime, process CPU) seconds.
fn now() -> f64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    if USE_CPU_TIME.load(Ordering::Relaxed) {
        cpu_seconds()
    } else {
        START.get_or_init(Instant::now).elapsed().as_secs_f64()
    }
}

/// Median (or with --best, minimum) seconds per call: batches sized to ~3 ms,
/// `samples` batches.
fn time_it(samples: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..3 {
        f();
    }
    let t = now();
    f();
    let one = (now() - t).max(1e-7);
    let reps = ((3e-3 / one) as usize).clamp(1, 100_000);
    let mut v: Vec<f64> = (0..samples)
        .map(|_| {
            let t = now();
            for _ in 0..reps {
                f();
            }
            (now() - t) / reps as f64
        })
        .collect();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    if USE_BEST.load(Ordering::Relaxed) {
        v[0]
    } else {
        v[v.len() / 2]
    }
}

static USE_BEST: AtomicBool = AtomicBool::new(false);

/// Single-core FMA peak (GFLOP/s) from a loop of 28 independent AVX-512 FMAs.
#[cfg(target_arch = "x86_64")]
fn fma_peak() -> f64 {
    use std::arch::x86_64::*;
    #[target_feature(enable = "avx512f")]
    fn fma_loop(iters: usize) -> f32 {
        let mut acc = [_mm512_set1_ps(0.0); 28];
        let (x, y) = (_mm512_set1_ps(1.0000001), _mm512_set1_ps(0.9999999));
        for _ in 0..iters {
            for a in acc.iter_mut() {
                *a = _mm512_fmadd_ps(*a, x, y);
            }
        }
        _mm512_reduce_add_ps(
            acc.iter()
                .fold(_mm512_setzero_ps(), |s, &a| _mm512_add_ps(s, a)),
        )
    }
    if !is_x86_feature_detected!("avx512f") {
        return f64::NAN;
    }
    let iters = 1_000_000;
    let t = now();
    // SAFETY: AVX-512F was detected above.
    black_box(unsafe { fma_loop(iters) });
    (iters * 28 * 32) as f64 / (now() - t) / 1e9
}

#[cfg(not(target_arch = "x86_64"))]
fn fma_peak() -> f64 {
    f64::NAN
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str| args.iter().any(|a| a == name);
    let get = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let filter = get("--filter");
    let samples: usize = get("--samples").and_then(|s| s.parse().ok()).unwrap_or(15);
    USE_CPU_TIME.store(flag("--cputime"), Ordering::Relaxed);
    USE_BEST.store(flag("--best"), Ordering::Relaxed);
    let mut opts = GemmOptions::default();
    if flag("--portable") {
        opts.isa = Isa::Portable;
    }
    if flag("--avx2") {
        opts.isa = opts.isa.min(Isa::Avx2);
    }
    if flag("--packed") {
        opts.allow_gemv = false;
    }
    if let Some(t) = get("--threads").and_then(|s| s.parse().ok()) {
        opts.threads = Some(t);
    }
    let threads = opts.threads.unwrap_or_else(rayon::current_num_threads);
    let isa = format!("{:?}", opts.isa).to_lowercase();

    // `--shape MxNxK:ll` runs just that shape (e.g. 2048x2048x2048:nn).
    let custom: Option<(usize, usize, usize, String)> = get("--shape").map(|s| {
        let (dims, layout) = s.split_once(':').unwrap_or((s.as_str(), "nn"));
        let d: Vec<usize> = dims
            .split('x')
            .map(|v| v.parse().expect("--shape MxNxK:ll"))
            .collect();
        (d[0], d[1], d[2], layout.to_string())
    });
    let shapes: Vec<(usize, usize, usize, &str)> = match &custom {
        Some((m, n, k, l)) => vec![(*m, *n, *k, l.as_str())],
        None => SHAPES.to_vec(),
    };
    for &(m, n, k, layout) in &shapes {
        let name = format!("{m}x{n}x{k} {layout}");
        if filter.as_ref().is_some_and(|f| !name.contains(f.as_str())) {
            continue;
        }
        let abuf = rand_vec(m * k, 1);
        let bbuf = rand_vec(k * n, 2);
        match get("--dtype").as_deref() {
            Some("f16") => {
                let cv = |v: Vec<f32>| v.into_iter().map(half::f16::from_f32).collect::<Vec<_>>();
                run_shape(
                    &opts,
                    &flag,
                    samples,
                    threads,
                    &isa,
                    m,
                    n,
                    k,
                    layout,
                    &cv(abuf),
                    &cv(bbuf),
                    "f16",
                );
            }
            Some("bf16") => {
                let cv = |v: Vec<f32>| v.into_iter().map(half::bf16::from_f32).collect::<Vec<_>>();
                run_shape(
                    &opts,
                    &flag,
                    samples,
                    threads,
                    &isa,
                    m,
                    n,
                    k,
                    layout,
                    &cv(abuf),
                    &cv(bbuf),
                    "bf16",
                );
            }
            _ => run_shape(
                &opts, &flag, samples, threads, &isa, m, n, k, layout, &abuf, &bbuf, "f32",
            ),
        }
    }
    if custom.is_none() && (filter.is_none() || filter.as_deref() == Some("f64")) {
        let (m, n, k) = (512, 512, 512);
        let abuf: Vec<f64> = rand_vec(m * k, 3).into_iter().map(f64::from).collect();
        let bbuf: Vec<f64> = rand_vec(k * n, 4).into_iter().map(f64::from).collect();
        let mut c = vec![0.0f64; m * n];
        let secs = time_it(samples, || {
            dgemm(
                m,
                n,
                k,
                MatRef::row_major(&abuf, k),
                MatRef::row_major(&bbuf, n),
                black_box(&mut c),
                false,
            );
        });
        let gflops = 2.0 * (m * n * k) as f64 / secs / 1e9;
        println!(
            "gemm f64 {m}x{n}x{k} nn threads={threads} gflops={gflops:.1} us={:.1}",
            secs * 1e6
        );
    }
}

/// Times one shape with inputs of element type `X` and prints its line.
#[allow(clippy::too_many_arguments)]
fn run_shape<X: kiln_cpu::gemm::GemmInput>(
    opts: &GemmOptions,
    flag: &dyn Fn(&str) -> bool,
    samples: usize,
    threads: usize,
    isa: &str,
    m: usize,
    n: usize,
    k: usize,
    layout: &str,
    abuf: &[X],
    bbuf: &[X],
    dtype: &str,
) {
    let name = format!("{m}x{n}x{k} {layout}");
    let mut c = vec![0.0f32; m * n];
    let a = if layout.starts_with('t') {
        MatRef::row_major(abuf, m).t()
    } else {
        MatRef::row_major(abuf, k)
    };
    let b = if layout.ends_with('t') {
        MatRef::row_major(bbuf, k).t()
    } else {
        MatRef::row_major(bbuf, n)
    };
    let flops = 2.0 * (m * n * k) as f64;
    if flag("--efficiency") {
        // Alternate GEMM batches and peak-loop batches; interference only ever
        // slows things down, so the ratio of the best figures is the robust one.
        let (mut best, mut peak) = (0.0f64, 0.0f64);
        for _ in 0..samples {
            let secs = time_it(1, || {
                sgemm_with(opts, m, n, k, a, b, black_box(&mut c), false)
            });
            best = best.max(flops / secs / 1e9);
            peak = peak.max(fma_peak());
        }
        println!(
            "efficiency {dtype} {name} threads={threads} best_gflops={best:.1} peak_1core={peak:.1} of_1core_peak={:.3}",
            best / peak
        );
        return;
    }
    let secs = time_it(samples, || {
        sgemm_with(opts, m, n, k, a, b, black_box(&mut c), false)
    });
    // Two bf16 operands run on the bf16 dot-product kernel where the CPU has one.
    let kernel = if dtype == "bf16" && opts.bf16_dot && isa == "avx512" {
        kiln_cpu::gemm::bf16_kernel()
    } else {
        isa
    };
    println!(
        "gemm {dtype} {name} threads={threads} gflops={:.1} us={:.1} isa={kernel}",
        flops / secs / 1e9,
        secs * 1e6
    );
}
