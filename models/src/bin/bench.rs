//! `kiln-bench`: the shared workloads of DESIGN.md, one parseable line per figure:
//! `bench=W4 impl=kiln backend=cpu ... ms=… gflops=…`. `scripts/bench_cpu.py` runs it
//! beside PyTorch in the same run and prints the ratios.

use clap::Parser;
use kiln::cpu::{Cpu, CpuDevice};
use kiln::tensor::{DType, RandDist, RawTensor, Result};
use std::time::Instant;

/// Run Kiln's benchmark workloads on the CPU.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Workloads to run (comma-separated): w2, w4.
    #[arg(long, default_value = "w2,w4")]
    workloads: String,
    /// Timed repetitions per figure (the median is printed).
    #[arg(long, default_value_t = 10)]
    reps: usize,
}

/// Median wall time in milliseconds of `reps` runs of `f`, after one warm-up run.
fn time_ms(reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    let mut t: Vec<f64> = (0..reps.max(1))
        .map(|_| {
            let s = Instant::now();
            f().map(|_| s.elapsed().as_secs_f64() * 1e3)
        })
        .collect::<Result<_>>()?;
    t.sort_by(f64::total_cmp);
    Ok(t[t.len() / 2])
}

fn w4(reps: usize) -> Result<()> {
    let dev = CpuDevice;
    let n = 1024;
    let dist = RandDist::Normal { mean: 0.0, std: 1.0 };
    let a = RawTensor::<Cpu>::rand(&[n, n], dist, 1, DType::F32, &dev)?;
    let b = RawTensor::<Cpu>::rand(&[n, n], dist, 2, DType::F32, &dev)?;
    let ms = time_ms(reps, || a.matmul(&b).map(|_| ()))?;
    let gflops = 2.0 * (n * n * n) as f64 / (ms * 1e-3) / 1e9;
    println!("bench=W4 impl=kiln backend=cpu dtype=f32 shape={n}x{n}x{n} ms={ms:.3} gflops={gflops:.1}");
    Ok(())
}

fn w2(reps: usize) -> Result<()> {
    let dev = CpuDevice;
    let n = 1usize << 26;
    let x = RawTensor::<Cpu>::rand(&[n], RandDist::Normal { mean: 0.0, std: 1.0 }, 3, DType::F32, &dev)?;
    let chain = || -> Result<RawTensor<Cpu>> {
        let h = x.mul_scalar(1.5)?.add_scalar(0.5)?.relu()?;
        h.mul(&x.sigmoid()?)
    };
    let ms = time_ms(reps, || chain().map(|_| ()))?;
    // Counted as one read and one write of f32 per element, whatever the kernels do.
    let gbps = (n * 8) as f64 / (ms * 1e-3) / 1e9;
    println!("bench=W2 impl=kiln backend=cpu variant=unfused n={n} ms={ms:.3} gbps={gbps:.2}");
    Ok(())
}

fn main() -> Result<()> {
    let args = Args::parse();
    for w in args.workloads.split(',') {
        match w.trim() {
            "w2" => w2(args.reps)?,
            "w4" => w4(args.reps)?,
            other => eprintln!("unknown workload {other:?} (known: w2, w4)"),
        }
    }
    Ok(())
}
