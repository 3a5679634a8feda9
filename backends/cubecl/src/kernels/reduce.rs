//! Reductions: one cube per output element. Each unit folds a strided subset of the
//! reduced elements (floats with a compensated sum, so long same-sign sums stay
//! accurate), then the cube combines the units' partials in shared memory.
//!
//! Metadata: `[n_out, extent, kept dims, reduced dims, offset, kept strides, reduced
//! strides]`. Cubes past the last output compute a clamped copy and write nothing, so
//! every barrier stays in uniform control flow (WGSL requires it).

use super::common::{cube_index, inf, nan, offset_of};
use cubecl::prelude::*;
use kiln_tensor::ReduceOp;

/// Σ
pub const SUM: u32 = ReduceOp::Sum as u32;
/// max
pub const MAX: u32 = ReduceOp::Max as u32;
/// min
pub const MIN: u32 = ReduceOp::Min as u32;
/// argmax
pub const ARGMAX: u32 = ReduceOp::ArgMax as u32;
/// argmin
pub const ARGMIN: u32 = ReduceOp::ArgMin as u32;

/// The input offset of reduced element `r` of output `o`.
#[cube]
fn input_offset(
    meta: &Array<u32>,
    o: u32,
    r: u32,
    #[comptime] kr: u32,
    #[comptime] rr: u32,
) -> u32 {
    let base_at = 2 + kr + rr;
    meta[base_at as usize]
        + offset_of(meta, o, 2, base_at + 1, kr)
        + offset_of(meta, r, 2 + kr, base_at + 1 + kr, rr)
}

#[cube]
fn is_special<A: Float>(x: A) -> bool {
    nan::<A>(x) || inf::<A>(x)
}

/// Whether `v` replaces `best` in a max (or min) that lets NaN win.
#[allow(unused_assignments)]
#[cube]
fn float_better<A: Float>(v: A, best: A, #[comptime] wants_max: bool) -> bool {
    let mut r = false;
    if nan::<A>(best) {
        r = false;
    } else if nan::<A>(v) {
        r = true;
    } else if comptime!(wants_max) {
        r = v > best;
    } else {
        r = v < best;
    }
    r
}

/// Sum, max or min over floats of storage type `F`, accumulated in `A`.
///
/// Max and min start from the first element a unit reads (a `has` mark per partial)
/// rather than from ±infinity: CubeCL's WGSL compiler writes infinite constants as
/// `f32(inf)`, which WGSL rejects, and the launch is then dropped.
// Comptime branches (`comptime!(op == …)`) stay apart from the runtime ones inside them.
#[allow(clippy::collapsible_if)]
#[cube(launch_unchecked)]
pub fn reduce_float<F: Float, A: Float>(
    x: &Array<F>,
    out: &mut Array<F>,
    meta: &Array<u32>,
    #[comptime] op: u32,
    #[comptime] kr: u32,
    #[comptime] rr: u32,
    #[comptime] block: u32,
) {
    let n_out = meta[0];
    let extent = meta[1];
    let real = cube_index();
    let o = select(real < n_out, real, n_out - 1);
    let mut acc = A::new(0.0);
    let mut comp = A::new(0.0);
    let mut any = false;
    let mut r = UNIT_POS_X;
    while r < extent {
        let v = A::cast_from(x[input_offset(meta, o, r, kr, rr) as usize]);
        if comptime!(op == SUM) {
            // Neumaier's compensated sum (the reference's), skipping the correction
            // once the sum is infinite or NaN.
            let t = acc + v;
            if !is_special::<A>(t) {
                if acc.abs() >= v.abs() {
                    comp += (acc - t) + v;
                } else {
                    comp += (v - t) + acc;
                }
            }
            acc = t;
        } else if !any || float_better::<A>(v, acc, comptime!(op == MAX)) {
            acc = v;
        }
        any = true;
        r += block;
    }
    if comptime!(op == SUM) {
        if !is_special::<A>(acc) {
            acc += comp;
        }
    }
    let mut shared = SharedMemory::<A>::new(block as usize);
    let mut has = SharedMemory::<u32>::new(block as usize);
    shared[UNIT_POS_X as usize] = acc;
    has[UNIT_POS_X as usize] = u32::cast_from(any);
    sync_cube();
    let mut s = comptime!(block / 2).runtime();
    while s > 0 {
        if UNIT_POS_X < s {
            let a = shared[UNIT_POS_X as usize];
            let b = shared[(UNIT_POS_X + s) as usize];
            if comptime!(op == SUM) {
                shared[UNIT_POS_X as usize] = a + b;
            } else if has[(UNIT_POS_X + s) as usize] != 0 {
                let ha = has[UNIT_POS_X as usize];
                if ha == 0 || float_better::<A>(b, a, comptime!(op == MAX)) {
                    shared[UNIT_POS_X as usize] = b;
                    has[UNIT_POS_X as usize] = 1;
                }
            }
        }
        sync_cube();
        s /= 2;
    }
    if UNIT_POS_X == 0 && real < n_out {
        out[o as usize] = F::cast_from(shared[0]);
    }
}

/// Sum (wrapping), max or min over integers.
#[cube(launch_unchecked)]
pub fn reduce_int<I: Int>(
    x: &Array<I>,
    out: &mut Array<I>,
    meta: &Array<u32>,
    #[comptime] op: u32,
    #[comptime] kr: u32,
    #[comptime] rr: u32,
    #[comptime] block: u32,
) {
    let n_out = meta[0];
    let extent = meta[1];
    let real = cube_index();
    let o = select(real < n_out, real, n_out - 1);
    let mut acc = I::from_int(0);
    let mut any = false;
    let mut r = UNIT_POS_X;
    while r < extent {
        let v = x[input_offset(meta, o, r, kr, rr) as usize];
        if comptime!(op == SUM) {
            acc += v;
        } else if !any {
            acc = v;
        } else if comptime!(op == MAX) {
            if v > acc {
                acc = v;
            }
        } else if v < acc {
            acc = v;
        }
        any = true;
        r += block;
    }
    let mut shared = SharedMemory::<I>::new(block as usize);
    let mut has = SharedMemory::<u32>::new(block as usize);
    shared[UNIT_POS_X as usize] = acc;
    has[UNIT_POS_X as usize] = u32::cast_from(any);
    sync_cube();
    let mut s = comptime!(block / 2).runtime();
    while s > 0 {
        if UNIT_POS_X < s {
            let a = shared[UNIT_POS_X as usize];
            let b = shared[(UNIT_POS_X + s) as usize];
            let hb = has[(UNIT_POS_X + s) as usize];
            if comptime!(op == SUM) {
                shared[UNIT_POS_X as usize] = a + b;
            } else if hb != 0 {
                let ha = has[UNIT_POS_X as usize];
                let mut take = ha == 0;
                if comptime!(op == MAX) {
                    take = take || b > a;
                } else {
                    take = take || b < a;
                }
                if take {
                    shared[UNIT_POS_X as usize] = b;
                    has[UNIT_POS_X as usize] = 1;
                }
            }
        }
        sync_cube();
        s /= 2;
    }
    if UNIT_POS_X == 0 && real < n_out {
        out[o as usize] = shared[0];
    }
}

/// Whether candidate (vb, ib) beats (va, ia) in an argmax/argmin: a NaN wins, ties and
/// NaN against NaN go to the lower index, `u32::MAX` marks "no candidate".
#[allow(unused_assignments)]
#[cube]
fn arg_better<A: Numeric>(va: A, ia: u32, vb: A, ib: u32, #[comptime] wants_max: bool) -> bool {
    // NaN is the value unequal to itself; `!(x == x)` rather than `x != x`, which
    // WGSL compiles to an ordered comparison that is false for NaN.
    #[allow(clippy::eq_op)]
    let na = !(va == va);
    #[allow(clippy::eq_op)]
    let nb = !(vb == vb);
    let mut r = false;
    if ib == u32::MAX {
        r = false;
    } else if ia == u32::MAX {
        r = true;
    } else if na && nb {
        r = ib < ia;
    } else if na {
        r = false;
    } else if nb {
        r = true;
    } else if vb == va {
        r = ib < ia;
    } else if comptime!(wants_max) {
        r = vb > va;
    } else {
        r = vb < va;
    }
    r
}

/// Argmax or argmin along one axis (the index of the first best element, NaN
/// winning), for any numeric type compared in `A`; written as i32.
#[cube(launch_unchecked)]
pub fn reduce_arg<T: Numeric, A: Numeric>(
    x: &Array<T>,
    out: &mut Array<i32>,
    meta: &Array<u32>,
    #[comptime] op: u32,
    #[comptime] kr: u32,
    #[comptime] rr: u32,
    #[comptime] block: u32,
) {
    let n_out = meta[0];
    let extent = meta[1];
    let real = cube_index();
    let o = select(real < n_out, real, n_out - 1);
    let wants_max = comptime!(op == ARGMAX);
    let mut best = A::from_int(0);
    let mut best_i = comptime!(u32::MAX).runtime();
    let mut r = UNIT_POS_X;
    while r < extent {
        let v = A::cast_from(x[input_offset(meta, o, r, kr, rr) as usize]);
        if arg_better::<A>(best, best_i, v, r, wants_max) {
            best = v;
            best_i = r;
        }
        r += block;
    }
    let mut sv = SharedMemory::<A>::new(block as usize);
    let mut si = SharedMemory::<u32>::new(block as usize);
    sv[UNIT_POS_X as usize] = best;
    si[UNIT_POS_X as usize] = best_i;
    sync_cube();
    let mut s = comptime!(block / 2).runtime();
    while s > 0 {
        if UNIT_POS_X < s {
            let u = UNIT_POS_X as usize;
            let w = (UNIT_POS_X + s) as usize;
            if arg_better::<A>(sv[u], si[u], sv[w], si[w], wants_max) {
                sv[u] = sv[w];
                si[u] = si[w];
            }
        }
        sync_cube();
        s /= 2;
    }
    if UNIT_POS_X == 0 && real < n_out {
        out[o as usize] = i32::cast_from(si[0]);
    }
}
