//! Seeded random draws on the device: `kiln_tensor::rng`'s counter-based generator,
//! whose 32-bit integer bits every device computes exactly, mapped to values in the
//! compute type (f32 for f32 and the half floats, f64 for f64). The host reference maps
//! through f64 `ln` and `cos`; the device's own functions differ from it by a few ulps
//! of the compute type, so draws agree to that accuracy, not bit for bit.

use super::common::linear_pos;
use cubecl::prelude::*;

/// `kiln_tensor::rng::mix32`: a 32-bit avalanche mix (wrapping arithmetic).
#[cube]
fn mix32(v: u32) -> u32 {
    let mut x = v;
    x ^= x >> 16;
    x *= 0x7feb_352du32;
    x ^= x >> 15;
    x *= 0x846c_a68bu32;
    x ^= x >> 16;
    x
}

/// `kiln_tensor::rng::bits`: the random bits of element `counter` under `key`.
#[cube]
pub(super) fn bits(key: u32, counter: u32) -> u32 {
    mix32(mix32(counter ^ key) + key)
}

/// cos(2π·u) for `u` in [0, 1) with 24-bit precision: reduced exactly to an angle of
/// at most π/4 first, so that the rounding of 2π·u does not swamp results near zero.
/// `tau` is 2π in the compute type (a literal would be an f32 one).
#[cube]
fn cos_two_pi<A: Float>(u: A, tau: A) -> A {
    let quarter = A::new(0.25);
    let q = A::floor(u * A::new(4.0));
    let r = u - q * quarter;
    let flip = r > A::new(0.125);
    let s = select(flip, quarter - r, r);
    let angle = s * tau;
    let c = angle.cos();
    let sn = angle.sin();
    // cos(2π r) and sin(2π r) from the angle that was reduced.
    let cos_r = select(flip, sn, c);
    let sin_r = select(flip, c, sn);
    let qi = u32::cast_from(q);
    let mut v = cos_r;
    if qi == 1 {
        v = -sin_r;
    } else if qi == 2 {
        v = -cos_r;
    } else if qi == 3 {
        v = sin_r;
    }
    v
}

/// `kiln_tensor::rng::stream_key` of the 64-bit seed `(hi, lo)`.
#[cube]
pub(super) fn stream_key(lo: u32, hi: u32, stream: u32) -> u32 {
    mix32(lo ^ mix32(hi ^ (stream * 0x9e37_79b9u32)))
}

/// The key of a dropout's draws (`kiln_tensor::AttentionDropout::key`): its own seed
/// `(own_hi, own_lo)` xor the seed in `seed` (two words, low first; zeros when the host
/// mixed the seeds).
#[cube]
pub(super) fn dropout_key(seed: &Array<u32>, own_lo: u32, own_hi: u32) -> u32 {
    stream_key(own_lo ^ seed[0], own_hi ^ seed[1], 0)
}

/// Dropout's factor of draw number `counter` under `key`: `keep` when the draw's 24 bits
/// are at or above `threshold`, else 0 (`kiln_tensor::AttentionDropout::factor`).
#[cube]
pub(super) fn dropout_factor<A: Float>(key: u32, threshold: u32, counter: u32, keep: A) -> A {
    select((bits(key, counter) >> 8) >= threshold, keep, A::new(0.0))
}

/// Writes element `i` of a draw with the streams' keys `key0` and `key1`: uniform on
/// `[a, a + b)` or normal with mean `a` and standard deviation `b` (Box–Muller on the
/// generator's streams 0 and 1, as the reference); `tau` is 2π in the compute type.
#[cube]
#[allow(clippy::too_many_arguments)]
fn draw<F: Float, A: Float + CubeElement>(
    out: &mut Array<F>,
    i: u32,
    key0: u32,
    key1: u32,
    a: A,
    b: A,
    tau: A,
    #[comptime] normal: bool,
) {
    let unit = A::new(1.0 / 16_777_216.0);
    let b0 = bits(key0, i) >> 8;
    if comptime!(normal) {
        let u1 = A::cast_from(b0 + 1) * unit;
        let u2 = A::cast_from(bits(key1, i) >> 8) * unit;
        let radius = (A::new(-2.0) * u1.ln()).sqrt();
        out[i as usize] = F::cast_from(a + b * (radius * cos_two_pi::<A>(u2, tau)));
    } else {
        out[i as usize] = F::cast_from(a + b * (A::cast_from(b0) * unit));
    }
}

/// Element `i` of a draw whose streams' keys the host derived from the seed.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn random<F: Float, A: Float + CubeElement>(
    out: &mut Array<F>,
    n: u32,
    key0: u32,
    key1: u32,
    a: A,
    b: A,
    tau: A,
    #[comptime] normal: bool,
) {
    let i = linear_pos();
    if i < n {
        draw::<F, A>(out, i, key0, key1, a, b, tau, normal);
    }
}

/// Element `i` of a draw with the seed `own ^ seed`, `seed` read from device memory
/// (two words, low first): a captured step reads the seed the host wrote before its
/// replay. Every thread derives the keys; they are two hashes, cheaper than a launch.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn random_device_seeded<F: Float, A: Float + CubeElement>(
    out: &mut Array<F>,
    seed: &Array<u32>,
    n: u32,
    own_lo: u32,
    own_hi: u32,
    a: A,
    b: A,
    tau: A,
    #[comptime] normal: bool,
) {
    let i = linear_pos();
    if i < n {
        let lo = own_lo ^ seed[0];
        let hi = own_hi ^ seed[1];
        let key0 = stream_key(lo, hi, 0u32);
        let key1 = stream_key(lo, hi, 1u32);
        draw::<F, A>(out, i, key0, key1, a, b, tau, normal);
    }
}
