//! Reductions. A cube of `block` units reduces `block / lanes` items (an output, or
//! one chunk of an output's reduced elements), `lanes` units each: every unit folds a
//! strided subset of its item's elements (floats with a compensated sum, so long
//! same-sign sums stay accurate), then each item's lanes combine their partials in
//! shared memory.
//!
//! Which units share an item follows the layout, so that a warp's loads are
//! consecutive: where the reduced axis is contiguous (a softmax's rows) an item's
//! lanes are neighbours; where the kept axis is (a bias gradient's columns) neighbouring
//! units take neighbouring items (`items_inner`). A long sum over few outputs is cut
//! into chunks, one partial per output and chunk laid out `[chunks, outputs]`, which a
//! second launch sums: a handful of cubes walking a whole column would leave the rest
//! of the device idle.
//!
//! Metadata: `[items, extent, chunk, n_out, kept dims, reduced dims, offset, kept
//! strides, reduced strides]`, where `items = n_out * ceil(extent / chunk)`. Units past
//! the last item compute a clamped copy and write nothing, so every barrier stays in
//! uniform control flow (WGSL requires it).

use super::common::{cube_index, inf, nan, offset_of};
use super::fused::{prologue_value, FusedConfig};
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

/// The item slot of this unit within its cube.
#[allow(unused_assignments)]
#[cube]
fn item_slot(#[comptime] block: u32, #[comptime] lanes: u32, #[comptime] items_inner: bool) -> u32 {
    let mut s = 0u32;
    if comptime!(items_inner) {
        s = UNIT_POS_X % comptime!(block / lanes);
    } else {
        s = UNIT_POS_X / lanes;
    }
    s
}

/// This unit's lane among its item's `lanes` units.
#[allow(unused_assignments)]
#[cube]
fn item_lane(#[comptime] block: u32, #[comptime] lanes: u32, #[comptime] items_inner: bool) -> u32 {
    let mut l = 0u32;
    if comptime!(items_inner) {
        l = UNIT_POS_X / comptime!(block / lanes);
    } else {
        l = UNIT_POS_X % lanes;
    }
    l
}

/// The input offset of output `o`'s first element.
#[cube]
fn kept_offset(meta: &Array<u32>, o: u32, #[comptime] kr: u32, #[comptime] rr: u32) -> u32 {
    let base_at = 4 + kr + rr;
    meta[base_at as usize] + offset_of(meta, o, 4, base_at + 1, kr)
}

/// The offset of reduced element `r` from its output's first element (one multiply
/// when the reduced dims coalesce into one, the common case).
#[allow(unused_assignments)]
#[cube]
fn reduced_offset(meta: &Array<u32>, r: u32, #[comptime] kr: u32, #[comptime] rr: u32) -> u32 {
    let strides_at = 5 + 2 * kr + rr;
    let mut off = 0u32;
    if comptime!(rr == 1) {
        off = r * meta[strides_at as usize];
    } else {
        off = offset_of(meta, r, 4 + kr, strides_at, rr);
    }
    off
}

/// Where this unit's work lies: its item (clamped to the last), whether that item is
/// real, its output's first input offset, and the reduced range `[first, end)` its
/// lanes share.
#[derive(CubeType)]
struct Work {
    item: u32,
    real: bool,
    lane: u32,
    at: u32,
    base: u32,
    first: u32,
    end: u32,
}

/// This unit's [`Work`].
#[cube]
fn work(
    meta: &Array<u32>,
    #[comptime] kr: u32,
    #[comptime] rr: u32,
    #[comptime] block: u32,
    #[comptime] lanes: u32,
    #[comptime] items_inner: bool,
) -> Work {
    let items = meta[0];
    let extent = meta[1];
    let chunk = meta[2];
    let n_out = meta[3];
    let slot = item_slot(block, lanes, items_inner);
    let lane = item_lane(block, lanes, items_inner);
    let wanted = cube_index() * comptime!(block / lanes) + slot;
    let real = wanted < items;
    let item = select(real, wanted, items - 1);
    let first = (item / n_out) * chunk;
    let end = select(first + chunk < extent, first + chunk, extent);
    Work {
        item,
        real,
        lane,
        at: slot * lanes + lane,
        base: kept_offset(meta, item % n_out, kr, rr),
        first,
        end,
    }
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
///
/// With a `prologue`, the reduced elements are not read from `x` but computed where
/// they are needed: element `i` of the (contiguous) input is the prologue's value at
/// `i` over `inputs` ([`prologue_value()`]; `pmeta` their strided metadata, `consts` its
/// constants), so that a plan's reduction of a fused group's result stores nothing
/// between the two.
#[allow(clippy::too_many_arguments, unused_assignments)]
#[cube(launch_unchecked)]
pub fn reduce_float<F: Float, A: Float>(
    x: &Array<F>,
    out: &mut Array<F>,
    meta: &Array<u32>,
    inputs: &Sequence<Array<f32>>,
    pmeta: &Sequence<u32>,
    consts: &Sequence<f32>,
    zero: f32,
    #[comptime] op: u32,
    #[comptime] kr: u32,
    #[comptime] rr: u32,
    #[comptime] block: u32,
    #[comptime] lanes: u32,
    #[comptime] items_inner: bool,
    #[comptime] prologue: Option<FusedConfig>,
) {
    let w = work(meta, kr, rr, block, lanes, items_inner);
    let mut fold = fold_start::<A>();
    let mut r = w.first + w.lane;
    while r < w.end {
        let at = w.base + reduced_offset(meta, r, kr, rr);
        let mut v = A::new(0.0);
        if comptime!(prologue.is_some()) {
            let config = comptime!(prologue.clone().unwrap());
            v = A::cast_from(prologue_value(inputs, pmeta, consts, zero, at, config));
        } else {
            v = A::cast_from(x[at as usize]);
        }
        fold_value::<A>(&mut fold, v, op);
        r += lanes;
    }
    let mut shared = SharedMemory::<A>::new(block as usize);
    let mut has = SharedMemory::<u32>::new(block as usize);
    combine_lanes::<A>(&mut shared, &mut has, fold, w.at, w.lane, lanes, op);
    if w.lane == 0 && w.real {
        out[w.item as usize] = F::cast_from(shared[w.at as usize]);
    }
}

/// A unit's running fold of an item's values: the sum (or the best value so far), the
/// sum's compensation, and whether any value was folded.
#[derive(CubeType)]
pub struct Fold<A: Float> {
    acc: A,
    comp: A,
    any: bool,
}

/// A fold of no values.
#[cube]
pub fn fold_start<A: Float>() -> Fold<A> {
    Fold::<A> {
        acc: A::new(0.0),
        comp: A::new(0.0),
        any: false,
    }
}

/// Folds `v` into `fold`: Neumaier's compensated sum (the reference's), which skips
/// the correction once the sum is infinite or NaN; or the max or min that lets NaN
/// win. Every float reduction folds through here (the reductions and the row passes),
/// so that the two give the same bits.
#[cube]
pub fn fold_value<A: Float>(fold: &mut Fold<A>, v: A, #[comptime] op: u32) {
    if comptime!(op == SUM) {
        let acc = fold.acc;
        let t = acc + v;
        if !is_special::<A>(t) {
            if acc.abs() >= v.abs() {
                fold.comp += (acc - t) + v;
            } else {
                fold.comp += (v - t) + acc;
            }
        }
        fold.acc = t;
    } else if !fold.any || float_better::<A>(v, fold.acc, comptime!(op == MAX)) {
        fold.acc = v;
    }
    fold.any = true;
}

/// Combines the folds of each item's `lanes` units (this unit's `fold`, at slot `at`
/// of `shared`, lane `lane`) into the item's first slot, `shared[at - lane]`, halving
/// the active lanes each round; `has` marks partials that folded any value. Ends on a
/// barrier, so every unit of the cube may then read its item's result; every unit of
/// the cube must call it (WGSL wants barriers in uniform control flow).
#[allow(clippy::collapsible_if)]
#[cube]
pub fn combine_lanes<A: Float>(
    shared: &mut SharedMemory<A>,
    has: &mut SharedMemory<u32>,
    fold: Fold<A>,
    at: u32,
    lane: u32,
    #[comptime] lanes: u32,
    #[comptime] op: u32,
) {
    let mut acc = fold.acc;
    if comptime!(op == SUM) {
        if !is_special::<A>(acc) {
            acc += fold.comp;
        }
    }
    let at = at as usize;
    shared[at] = acc;
    has[at] = u32::cast_from(fold.any);
    sync_cube();
    let mut s = comptime!(lanes / 2).runtime();
    while s > 0 {
        if lane < s {
            let a = shared[at];
            let b = shared[at + s as usize];
            if comptime!(op == SUM) {
                shared[at] = a + b;
            } else if has[at + s as usize] != 0 {
                let ha = has[at];
                if ha == 0 || float_better::<A>(b, a, comptime!(op == MAX)) {
                    shared[at] = b;
                    has[at] = 1;
                }
            }
        }
        sync_cube();
        s /= 2;
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
    #[comptime] lanes: u32,
    #[comptime] items_inner: bool,
) {
    let w = work(meta, kr, rr, block, lanes, items_inner);
    let mut acc = I::from_int(0);
    let mut any = false;
    let mut r = w.first + w.lane;
    while r < w.end {
        let v = x[(w.base + reduced_offset(meta, r, kr, rr)) as usize];
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
        r += lanes;
    }
    let mut shared = SharedMemory::<I>::new(block as usize);
    let mut has = SharedMemory::<u32>::new(block as usize);
    let at = w.at as usize;
    shared[at] = acc;
    has[at] = u32::cast_from(any);
    sync_cube();
    let mut s = comptime!(lanes / 2).runtime();
    while s > 0 {
        if w.lane < s {
            let a = shared[at];
            let b = shared[at + s as usize];
            let hb = has[at + s as usize];
            if comptime!(op == SUM) {
                shared[at] = a + b;
            } else if hb != 0 {
                let ha = has[at];
                let mut take = ha == 0;
                if comptime!(op == MAX) {
                    take = take || b > a;
                } else {
                    take = take || b < a;
                }
                if take {
                    shared[at] = b;
                    has[at] = 1;
                }
            }
        }
        sync_cube();
        s /= 2;
    }
    if w.lane == 0 && w.real {
        out[w.item as usize] = shared[at];
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
    #[comptime] lanes: u32,
    #[comptime] items_inner: bool,
) {
    let w = work(meta, kr, rr, block, lanes, items_inner);
    let wants_max = comptime!(op == ARGMAX);
    let mut best = A::from_int(0);
    let mut best_i = comptime!(u32::MAX).runtime();
    let mut r = w.first + w.lane;
    while r < w.end {
        let v = A::cast_from(x[(w.base + reduced_offset(meta, r, kr, rr)) as usize]);
        if arg_better::<A>(best, best_i, v, r, wants_max) {
            best = v;
            best_i = r;
        }
        r += lanes;
    }
    let mut sv = SharedMemory::<A>::new(block as usize);
    let mut si = SharedMemory::<u32>::new(block as usize);
    let at = w.at as usize;
    sv[at] = best;
    si[at] = best_i;
    sync_cube();
    let mut s = comptime!(lanes / 2).runtime();
    while s > 0 {
        if w.lane < s {
            let u = at;
            let v = at + s as usize;
            if arg_better::<A>(sv[u], si[u], sv[v], si[v], wants_max) {
                sv[u] = sv[v];
                si[u] = si[v];
            }
        }
        sync_cube();
        s /= 2;
    }
    if w.lane == 0 && w.real {
        out[w.item as usize] = i32::cast_from(si[at]);
    }
}
