//! Attention kernel benchmark on the CPU: the forward pass, the row statistics and the
//! three gradients of causal attention over permuted heads (as a model's heads are),
//! one parseable line per op, e.g.
//! `attention forward b=32 h=4 t=128 e=32 threads=2 us=1234.5`.
//!
//! The one-pass groups a plan runs (`forward+lse`, `grads`) are timed beside the ops.
//!
//! Usage: bench_attention [--shape B,H,T,E] [--samples N] [--dropout P]
//! (the default shape is the small GPT's: 32 sequences, 4 heads, context 128, width 32).

use kiln_cpu::{Cpu, CpuDevice};
use kiln_tensor::{
    AttentionDropout, AttentionInput, AttentionSpec, Backend, Dims, Op, RawTensor, Result,
    TensorMeta, View,
};
use std::time::Instant;

fn random(dims: &[usize], seed: u64) -> Result<RawTensor<Cpu>> {
    kiln_tensor::testing::lcg_tensor(dims, seed, &CpuDevice)
}

/// The median of `samples` timings of `f`, in microseconds.
fn median_us(samples: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    let mut ts = Vec::with_capacity(samples);
    for _ in 0..samples {
        let t = Instant::now();
        f()?;
        ts.push(t.elapsed().as_secs_f64() * 1e6);
    }
    ts.sort_by(f64::total_cmp);
    Ok(ts[ts.len() / 2])
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
    };
    let shape: Vec<usize> = flag("--shape")
        .map(|s| {
            s.split(',')
                .map(|x| x.parse().expect("--shape B,H,T,E"))
                .collect()
        })
        .unwrap_or_else(|| vec![32, 4, 128, 32]);
    let samples: usize = flag("--samples").map_or(20, |s| s.parse().expect("--samples N"));
    let dropout = flag("--dropout").map(|p| AttentionDropout {
        p: p.parse().expect("--dropout P"),
        seed: 7,
    });
    let [b, h, t, e] = shape[..] else {
        panic!("--shape takes four sizes B,H,T,E");
    };
    let heads = |seed| random(&[b, t, h, e], seed)?.permute(&[0, 2, 1, 3]);
    let (q, k, v) = (heads(1)?, heads(2)?, heads(3)?);
    let g = random(&[b, h, t, e], 4)?;
    let spec = AttentionSpec {
        dropout,
        ..AttentionSpec::new(1.0 / (e as f64).sqrt(), true)
    };
    let rows = TensorMeta::new(vec![b, h, t, e], kiln_tensor::DType::F32);
    let stats = TensorMeta::new(vec![b, h, t, 1], kiln_tensor::DType::F32);
    let lse_op = Op::AttentionLse(spec.without_dropout());
    let lse = Cpu::execute(&CpuDevice, &lse_op, &[q.view(), k.view()], &stats)?;
    let lse = RawTensor::<Cpu>::from_storage(lse, Dims::new(&[b, h, t, 1])?, CpuDevice)?;
    let delta = random(&[b, h, t, 1], 5)?;
    let threads = rayon::current_num_threads();
    let line = |name: &str, us: f64| {
        println!("attention {name} b={b} h={h} t={t} e={e} threads={threads} us={us:.1}");
    };
    let mut out = Cpu::alloc(&CpuDevice, kiln_tensor::DType::F32, b * h * t * e)?;
    let fwd: [View<'_, Cpu>; 3] = [q.view(), k.view(), v.view()];
    line(
        "forward",
        median_us(samples, || {
            Cpu::execute_into(&CpuDevice, &Op::Attention(spec), &fwd, &rows, &mut out)
        })?,
    );
    line(
        "lse",
        median_us(samples, || {
            Cpu::execute_into(&CpuDevice, &lse_op, &fwd[..2], &stats, &mut out)
        })?,
    );
    let mut stats_out = Cpu::alloc(&CpuDevice, kiln_tensor::DType::F32, b * h * t)?;
    let attention = Op::Attention(spec);
    line(
        "forward+lse",
        median_us(samples, || {
            Cpu::execute_one_pass_into(
                &CpuDevice,
                &[&attention, &lse_op],
                &fwd,
                &[&rows, &stats],
                &mut [&mut out, &mut stats_out],
            )
        })?,
    );
    let ins = [
        q.view(),
        k.view(),
        v.view(),
        g.view(),
        lse.view(),
        delta.view(),
    ];
    for wrt in [
        AttentionInput::Query,
        AttentionInput::Key,
        AttentionInput::Value,
    ] {
        let op = Op::AttentionGrad { spec, wrt };
        line(
            &format!("grad_{wrt:?}").to_lowercase(),
            median_us(samples, || {
                Cpu::execute_into(&CpuDevice, &op, &ins, &rows, &mut out)
            })?,
        );
    }
    let grads: Vec<Op> = [
        AttentionInput::Query,
        AttentionInput::Key,
        AttentionInput::Value,
    ]
    .map(|wrt| Op::AttentionGrad { spec, wrt })
    .to_vec();
    let mut outs =
        [0, 1, 2].map(|_| Cpu::alloc(&CpuDevice, kiln_tensor::DType::F32, b * h * t * e));
    let [dq, dk, dv] = &mut outs;
    let (dq, dk, dv) = (
        dq.as_mut().unwrap(),
        dk.as_mut().unwrap(),
        dv.as_mut().unwrap(),
    );
    line(
        "grads",
        median_us(samples, || {
            Cpu::execute_one_pass_into(
                &CpuDevice,
                &[&grads[0], &grads[1], &grads[2]],
                &ins,
                &[&rows, &rows, &rows],
                &mut [&mut *dq, &mut *dk, &mut *dv],
            )
        })?,
    );
    Ok(())
}
