//! The counter-based random generator every backend implements: element `i` of a draw
//! with seed `s` depends only on `(s, i)`, so draws are parallel and reproducible. Its
//! bits use only 32-bit integer arithmetic, so every device (GPUs without 64-bit
//! integers too) computes them exactly; the mapping to values below runs in f64 here,
//! and devices map in their compute type (f32 for f32 and the half floats), so their
//! values agree with these to a few ulps of that type.

/// A 32-bit avalanche mix (the "lowbias32" constants).
#[inline]
pub const fn mix32(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^= x >> 16;
    x
}

/// The per-stream key derived from a seed (computed once per draw).
#[inline]
pub const fn stream_key(seed: u64, stream: u32) -> u32 {
    mix32((seed as u32) ^ mix32(((seed >> 32) as u32) ^ stream.wrapping_mul(0x9e37_79b9)))
}

/// The random bits of element `counter` under `key`.
#[inline]
pub const fn bits(key: u32, counter: u32) -> u32 {
    mix32(mix32(counter ^ key).wrapping_add(key))
}

/// A uniform value in [0, 1) with 24 random bits.
#[inline]
pub fn unit_f32(bits: u32) -> f32 {
    (bits >> 8) as f32 * (1.0 / 16_777_216.0)
}

/// Element `i` of a uniform draw on [low, high).
#[inline]
pub fn uniform(seed: u64, i: u32, low: f64, high: f64) -> f64 {
    uniform_with_key(stream_key(seed, 0), i, low, high)
}

/// [`uniform`] with the draw's key ([`stream_key`] of its seed, stream 0) computed
/// once by the caller: a loop over a draw's elements that vectorises.
#[inline(always)]
pub fn uniform_with_key(key: u32, i: u32, low: f64, high: f64) -> f64 {
    let u = unit_f32(bits(key, i)) as f64;
    low + (high - low) * u
}

/// Element `i` of a standard normal draw (Box–Muller on two streams).
#[inline]
pub fn standard_normal(seed: u64, i: u32) -> f64 {
    let u1 = ((bits(stream_key(seed, 0), i) >> 8) as f64 + 1.0) * (1.0 / 16_777_216.0);
    let u2 = unit_f32(bits(stream_key(seed, 1), i)) as f64;
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moments_are_right() {
        let n = 200_000u32;
        let (mut s, mut s2) = (0.0, 0.0);
        for i in 0..n {
            let z = standard_normal(7, i);
            s += z;
            s2 += z * z;
        }
        let mean = s / n as f64;
        let var = s2 / n as f64 - mean * mean;
        assert!(
            mean.abs() < 0.01 && (var - 1.0).abs() < 0.02,
            "mean {mean} var {var}"
        );
        let u: f64 = (0..n).map(|i| uniform(3, i, -1.0, 1.0)).sum::<f64>() / n as f64;
        assert!(u.abs() < 0.01, "{u}");
        assert_ne!(uniform(1, 0, 0.0, 1.0), uniform(2, 0, 0.0, 1.0));
    }
}
