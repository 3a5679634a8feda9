//! Source ops: constants and the counter-based random generator of `kiln_tensor::rng`.

use crate::storage::{CpuElement, CpuStorage};
use half::{bf16, f16};
use kiln_tensor::{rng, simd, DType, Error, RandDist, Result};
use rayon::prelude::*;

/// A buffer of `n` copies of `value` as `dtype`.
pub fn full(n: usize, value: f64, dtype: DType) -> CpuStorage {
    fn go<T: CpuElement>(n: usize, v: f64) -> CpuStorage {
        T::wrap(vec![T::from_f64(v); n])
    }
    match dtype {
        DType::F32 => go::<f32>(n, value),
        DType::F64 => go::<f64>(n, value),
        DType::F16 => go::<f16>(n, value),
        DType::BF16 => go::<bf16>(n, value),
        DType::I32 => go::<i32>(n, value),
        DType::U32 => go::<u32>(n, value),
        DType::Bool => go::<bool>(n, value),
        DType::I8 => go::<i8>(n, value),
    }
}

/// Each element's index along `axis` of `dims`, as i32 (the op's rule checked the sizes).
pub fn iota(dims: &[usize], axis: usize) -> CpuStorage {
    let mut out = vec![0; dims.iter().product()];
    iota_into(dims, axis, &mut out);
    CpuStorage::I32(out.into())
}

/// [`iota`] written into the first elements of `out` (which holds at least as many).
pub fn iota_into(dims: &[usize], axis: usize, out: &mut [i32]) {
    let n: usize = dims.iter().product();
    let stride: usize = dims[axis + 1..].iter().product::<usize>().max(1);
    let size = dims[axis].max(1);
    for (i, o) in out[..n].iter_mut().enumerate() {
        *o = ((i / stride) % size) as i32;
    }
}

/// Refuses draws past the generator's 2^32 counter.
fn check_count(n: usize) -> Result<()> {
    if n > u32::MAX as usize {
        return Err(Error::invalid(
            "rand",
            format!("{n} values exceed the generator's 2^32 counter"),
        ));
    }
    Ok(())
}

/// Value `i` of a seeded draw of `dist`, in f64.
fn draw(dist: RandDist, seed: u64, i: u32) -> f64 {
    match dist {
        RandDist::Uniform { low, high } => rng::uniform(seed, i, low, high),
        RandDist::Normal { mean, std } => mean + std * rng::standard_normal(seed, i),
    }
}

/// [`rand`] in f32, written into the first `n` elements of `out` (a dropout mask
/// drawn each step into the plan's buffer, not a fresh one).
pub fn rand_f32_into(n: usize, dist: RandDist, seed: u64, out: &mut [f32]) -> Result<()> {
    check_count(n)?;
    let chunks = out[..n].par_chunks_mut(DRAW_CHUNK).enumerate();
    match dist {
        // Uniform draws in wide vectors: the key once, then integer mixing and the
        // mapping to values lane by lane.
        RandDist::Uniform { low, high } => {
            let key = rng::stream_key(seed, 0);
            chunks.for_each(|(c, chunk)| {
                let first = (c * DRAW_CHUNK) as u32;
                simd::wide(
                    #[inline(always)]
                    || {
                        for (j, o) in chunk.iter_mut().enumerate() {
                            let i = first.wrapping_add(j as u32);
                            *o = rng::uniform_with_key(key, i, low, high) as f32;
                        }
                    },
                )
            })
        }
        RandDist::Normal { .. } => chunks.for_each(|(c, chunk)| {
            let first = (c * DRAW_CHUNK) as u32;
            for (j, o) in chunk.iter_mut().enumerate() {
                let i = first.wrapping_add(j as u32);
                *o = <f32 as kiln_tensor::Element>::from_f64(draw(dist, seed, i));
            }
        }),
    }
    Ok(())
}

/// Elements a thread draws at a time.
const DRAW_CHUNK: usize = 1 << 14;

/// `n` seeded random values of `dist` as `dtype`.
pub fn rand(n: usize, dist: RandDist, seed: u64, dtype: DType) -> Result<CpuStorage> {
    check_count(n)?;
    fn go<T: CpuElement>(n: usize, f: impl Fn(u32) -> f64 + Sync) -> CpuStorage {
        T::wrap(
            (0..n as u32)
                .into_par_iter()
                .map(|i| T::from_f64(f(i)))
                .collect(),
        )
    }
    let draw = move |i: u32| draw(dist, seed, i);
    Ok(match dtype {
        DType::F32 => {
            let mut out = vec![0.0; n];
            rand_f32_into(n, dist, seed, &mut out)?;
            CpuStorage::F32(out.into())
        }
        DType::F64 => go::<f64>(n, draw),
        DType::F16 => go::<f16>(n, draw),
        DType::BF16 => go::<bf16>(n, draw),
        other => return Err(Error::dtype("rand", format!("draws floats, not {other}"))),
    })
}
