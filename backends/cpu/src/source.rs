//! Source ops: constants and the counter-based random generator of `kiln_tensor::rng`.

use crate::storage::{CpuElement, CpuStorage};
use half::{bf16, f16};
use kiln_tensor::{rng, DType, Error, RandDist, Result};
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
    }
}

/// Each element's index along `axis` of `dims`, as i32 (the op's rule checked the sizes).
pub fn iota(dims: &[usize], axis: usize) -> CpuStorage {
    let n: usize = dims.iter().product();
    let stride: usize = dims[axis + 1..].iter().product();
    let size = dims[axis];
    CpuStorage::I32(
        (0..n)
            .map(|i| ((i / stride.max(1)) % size.max(1)) as i32)
            .collect(),
    )
}

/// `n` seeded random values of `dist` as `dtype`.
pub fn rand(n: usize, dist: RandDist, seed: u64, dtype: DType) -> Result<CpuStorage> {
    if n > u32::MAX as usize {
        return Err(Error::invalid(
            "rand",
            format!("{n} values exceed the generator's 2^32 counter"),
        ));
    }
    fn go<T: CpuElement>(n: usize, f: impl Fn(u32) -> f64 + Sync) -> CpuStorage {
        T::wrap(
            (0..n as u32)
                .into_par_iter()
                .map(|i| T::from_f64(f(i)))
                .collect(),
        )
    }
    let draw = move |i: u32| match dist {
        RandDist::Uniform { low, high } => rng::uniform(seed, i, low, high),
        RandDist::Normal { mean, std } => mean + std * rng::standard_normal(seed, i),
    };
    Ok(match dtype {
        DType::F32 => go::<f32>(n, draw),
        DType::F64 => go::<f64>(n, draw),
        DType::F16 => go::<f16>(n, draw),
        DType::BF16 => go::<bf16>(n, draw),
        other => return Err(Error::dtype("rand", format!("draws floats, not {other}"))),
    })
}
