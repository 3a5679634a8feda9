//! Attention's forward pass on the tensor cores with every fragment in registers, for
//! half-float heads on CUDA (PTX `mma.sync` m16n8k16, f32 accumulators):
//! FlashAttention-2's forward. A cube of [`WARPS`] warps owns 16 query rows per warp.
//! Each warp keeps its queries, its block of scores and its output in registers for the
//! whole pass and streams keys and values through shared memory in tiles of
//! [`KEY_TILE`] rows, with one online softmax per tile: each row's running maximum
//! rescales the output's accumulators in place, and the probabilities become the next
//! product's operand without leaving registers (an m16n8 accumulator holds exactly
//! what an m16k16 operand's half needs, lane for lane). One pass over the keys writes
//! the output and each row's log-sum-exp; the log-sum-exp alone is the same kernel
//! without the values, so the two agree bit for bit.
//!
//! Fragment layouts are PTX's for m16n8k16 (lane `l`, group `g = l / 4`, `t = l % 4`):
//! an A operand's four pairs are rows `g`, `g + 8`, `g`, `g + 8` at columns `2t` and
//! `2t + 1`, `+ 8` for the last two; a B operand's two pairs are rows `2t, 2t + 1` and
//! `2t + 8, 2t + 9` of column `g`; an accumulator's two pairs are rows `g` and `g + 8`
//! at columns `2t, 2t + 1`. Keys are staged row-major (a B pair is two neighbours of a
//! key row) and values transposed (a B pair is two neighbouring keys of a value
//! column), both padded so that a warp's pair loads fall in 32 different banks.
//!
//! The math is `kiln_tensor::attention`'s: scores and statistics in f32, the
//! probabilities rounded to the inputs' dtype for their product. A key whose score is
//! −∞ adds nothing; a NaN score makes its row NaN; a row that sees no key has
//! log-sum-exp −∞ and output 0. Metadata as [`super::attention`]'s: `[batch, tq, tk,
//! causal, e, ev]`.

// Kernel code rounds up by hand: `u32::div_ceil` has no cube expansion.
#![allow(clippy::manual_div_ceil)]
use super::common::{cube_index, nan};
use cubecl::prelude::cmma::MmaDefinition;
use cubecl::prelude::*;

/// Warps per cube, 16 query rows each.
pub const WARPS: u32 = 4;
/// Key (and value) rows per shared-memory tile.
pub const KEY_TILE: u32 = 64;
/// The widest head (`E` or `Ev`, padded to a multiple of 16) the kernel holds.
pub const MAX_WIDTH: usize = 128;
/// Pairs of padding after each staged row: rows `4 (mod 8)` words apart put the eight
/// rows a warp reads at once in different banks.
const PAD_PAIRS: u32 = 4;

/// Two neighbouring elements: one 32-bit register of an operand, or two of an
/// accumulator's f32s.
type Pair<F> = Vector<F, Const<2>>;

/// Elements `col` and `col + 1` of row `row` of `src` (rows of `width`), zeros past the
/// row's end and for rows at or past `end`.
#[cube]
fn pair_at<F: Float>(src: &Array<F>, row: u32, end: u32, col: u32, width: u32) -> Pair<F> {
    let mut x = Pair::<F>::new(F::new(0.0));
    if row < end {
        if col < width {
            x[0usize] = src[(row * width + col) as usize];
        }
        if col + 1 < width {
            x[1usize] = src[(row * width + col + 1) as usize];
        }
    }
    x
}

/// Rows `first..first + tile` of `src` (rows of `width`, padded to `padded`) staged
/// row-major: pair `c` of staged row `r` at `r · stride + c`; zeros past each row's end
/// and for rows at or past `end`. Every unit of the cube takes part.
#[cube]
#[allow(clippy::too_many_arguments)]
fn stage_rows<F: Float>(
    src: &Array<F>,
    dst: &mut SharedMemory<Pair<F>>,
    first: u32,
    end: u32,
    width: u32,
    #[comptime] tile: u32,
    #[comptime] padded: u32,
    #[comptime] stride: u32,
) {
    let units = comptime!(WARPS * 32);
    let pairs = comptime!(tile * padded / 2);
    #[unroll]
    for s in 0..comptime!((tile * padded / 2).div_ceil(units)) {
        let idx = UNIT_POS_X + s * units;
        if idx < pairs {
            let r = idx / (padded / 2);
            let c = idx % (padded / 2);
            dst[(r * stride + c) as usize] = pair_at::<F>(src, first + r, end, 2 * c, width);
        }
    }
}

/// The same rows staged transposed: pair `p` of staged row `d` (at `d · stride + p`)
/// holds column `d` of rows `2p` and `2p + 1`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn stage_columns<F: Float>(
    src: &Array<F>,
    dst: &mut SharedMemory<Pair<F>>,
    first: u32,
    end: u32,
    width: u32,
    #[comptime] tile: u32,
    #[comptime] padded: u32,
    #[comptime] stride: u32,
) {
    let units = comptime!(WARPS * 32);
    let pairs = comptime!(tile / 2 * padded);
    #[unroll]
    for s in 0..comptime!((tile / 2 * padded).div_ceil(units)) {
        let idx = UNIT_POS_X + s * units;
        if idx < pairs {
            // Neighbouring units read neighbouring columns of a row.
            let d = idx % padded;
            let p = idx / padded;
            let row = first + 2 * p;
            let mut x = Pair::<F>::new(F::new(0.0));
            if d < width {
                if row < end {
                    x[0usize] = src[(row * width + d) as usize];
                }
                if row + 1 < end {
                    x[1usize] = src[((row + 1) * width + d) as usize];
                }
            }
            dst[(d * stride + p) as usize] = x;
        }
    }
}

/// Rows `row_a` and `row_a + 8` of `src` (rows of `width` from row `base`, the rows at
/// or past `end` zero) as the A operands of a warp's 16 rows, one per 16 columns of
/// `padded`.
#[cube]
fn own_operands<F: Float>(
    src: &Array<F>,
    row_a: u32,
    end: u32,
    width: u32,
    #[comptime] padded: u32,
) -> Sequence<Array<Pair<F>>> {
    let t = UNIT_POS_X % 4;
    let mut operands = Sequence::<Array<Pair<F>>>::new();
    #[unroll]
    for kk in 0..(padded / 16) as usize {
        let col = kk as u32 * 16 + 2 * t;
        let mut a = Array::<Pair<F>>::new(4usize);
        a[0usize] = pair_at::<F>(src, row_a, end, col, width);
        a[1usize] = pair_at::<F>(src, row_a + 8, end, col, width);
        a[2usize] = pair_at::<F>(src, row_a, end, col + 8, width);
        a[3usize] = pair_at::<F>(src, row_a + 8, end, col + 8, width);
        operands.push(a);
    }
    operands
}

/// `count` accumulators of zeros.
#[cube]
fn zero_accs(#[comptime] count: u32) -> Sequence<Array<Pair<f32>>> {
    let mut accs = Sequence::<Array<Pair<f32>>>::new();
    #[unroll]
    for _n in 0..count {
        let mut acc = Array::<Pair<f32>>::new(2usize);
        acc[0usize] = Pair::<f32>::new(0.0);
        acc[1usize] = Pair::<f32>::new(0.0);
        accs.push(acc);
    }
    accs
}

/// The warp's 16 own rows (A operands over `width`) times the `streamed` rows of a
/// row-major staged tile, transposed: one accumulator per 8 streamed rows.
#[cube]
fn products<F: Float>(
    own: &Sequence<Array<Pair<F>>>,
    tile: &SharedMemory<Pair<F>>,
    #[comptime] streamed: u32,
    #[comptime] width: u32,
    #[comptime] stride: u32,
) -> Sequence<Array<Pair<f32>>> {
    let mma = MmaDefinition::<F, F, f32>::new(16usize, 8usize, 16usize);
    let lane = UNIT_POS_X % 32;
    let mut accs = zero_accs(streamed / 8);
    #[unroll]
    for n in 0..(streamed / 8) as usize {
        let at = (n as u32 * 8 + lane / 4) * stride + lane % 4;
        #[unroll]
        for kk in 0..(width / 16) as usize {
            let mut bf = Array::<Pair<F>>::new(2usize);
            bf[0usize] = tile[(at + kk as u32 * 8) as usize];
            bf[1usize] = tile[(at + kk as u32 * 8 + 4) as usize];
            mma.execute_inplace(own.index(kk), &bf, accs.index_mut(n));
        }
    }
    accs
}

/// `accs += weights · columns`: the warp's 16×`streamed` weights (accumulators from
/// [`products`], rounded to `F`) times the `streamed` rows of a transposed staged tile,
/// one accumulator per 8 of its `width` columns.
#[cube]
fn accumulate<F: Float>(
    weights: &Sequence<Array<Pair<f32>>>,
    columns: &SharedMemory<Pair<F>>,
    accs: &mut Sequence<Array<Pair<f32>>>,
    #[comptime] streamed: u32,
    #[comptime] width: u32,
    #[comptime] stride: u32,
) {
    let mma = MmaDefinition::<F, F, f32>::new(16usize, 8usize, 16usize);
    let lane = UNIT_POS_X % 32;
    #[unroll]
    for kk in 0..(streamed / 16) as usize {
        let lo = weights.index(2 * kk);
        let hi = weights.index(2 * kk + 1);
        let mut a = Array::<Pair<F>>::new(4usize);
        a[0usize] = rounded::<F>(lo[0usize]);
        a[1usize] = rounded::<F>(lo[1usize]);
        a[2usize] = rounded::<F>(hi[0usize]);
        a[3usize] = rounded::<F>(hi[1usize]);
        #[unroll]
        for nb in 0..(width / 8) as usize {
            let at = (nb as u32 * 8 + lane / 4) * stride + kk as u32 * 8 + lane % 4;
            let mut bf = Array::<Pair<F>>::new(2usize);
            bf[0usize] = columns[at as usize];
            bf[1usize] = columns[(at + 4) as usize];
            mma.execute_inplace(&a, &bf, accs.index_mut(nb));
        }
    }
}

/// Writes `accs · factor` (the warp's 16 rows from `row_a`, `width` columns of
/// `padded`) as rows of `dst` (rows of `width` from row `base`, rows at or past `end`
/// skipped).
#[cube]
#[allow(clippy::too_many_arguments)]
fn store_rows<F: Float>(
    dst: &mut Array<F>,
    accs: &Sequence<Array<Pair<f32>>>,
    row_a: u32,
    end: u32,
    width: u32,
    factor_a: f32,
    factor_b: f32,
    #[comptime] padded: u32,
) {
    let t = UNIT_POS_X % 4;
    #[unroll]
    for nb in 0..(padded / 8) as usize {
        let acc = accs.index(nb);
        let xa = acc[0usize];
        let xb = acc[1usize];
        #[unroll]
        for c in 0..2u32 {
            let col = nb as u32 * 8 + 2 * t + c;
            if col < width {
                if row_a < end {
                    dst[(row_a * width + col) as usize] = F::cast_from(xa[c as usize] * factor_a);
                }
                if row_a + 8 < end {
                    dst[((row_a + 8) * width + col) as usize] =
                        F::cast_from(xb[c as usize] * factor_b);
                }
            }
        }
    }
}

/// An A operand's pair from two f32s, rounded to `F`.
#[cube]
fn rounded<F: Float>(x: Pair<f32>) -> Pair<F> {
    let mut r = Pair::<F>::new(F::new(0.0));
    r[0usize] = F::cast_from(x[0usize]);
    r[1usize] = F::cast_from(x[1usize]);
    r
}

/// The larger of `x` and its neighbours' in the lane's group of four (a row's lanes).
#[cube]
fn quad_max(x: f32) -> f32 {
    let y = max(x, plane_shuffle_xor(x, 1));
    max(y, plane_shuffle_xor(y, 2))
}

/// The sum of `x` over the lane's group of four.
#[cube]
fn quad_sum(x: f32) -> f32 {
    let y = x + plane_shuffle_xor(x, 1);
    y + plane_shuffle_xor(y, 2)
}

/// One row's running maximum `m` after a tile whose largest score (over the row's
/// lanes) is `tile_max`: returns the reference the tile's probabilities are taken
/// against (the new maximum, or 0 while the row has seen only −∞, so that its
/// probabilities are 0 rather than NaN) and the factor that rescales what was summed
/// so far (0 while that is nothing).
#[cube]
fn advance(m: &mut f32, tile_max: f32, neg_inf: f32) -> (f32, f32) {
    let grown = max(*m, tile_max);
    let mut reference = grown;
    if grown == neg_inf {
        reference = 0.0;
    }
    let alpha = (*m - reference).exp();
    *m = grown;
    (reference, alpha)
}

/// The forward pass of `WARPS · 16` query rows: each row's log-sum-exp over the keys it
/// sees and, `with_values`, its output `Σ_j p_ij v_j`. `e` and `ev` are the padded
/// widths (multiples of 16, at most [`MAX_WIDTH`]). `stats` receives the log-sum-exp
/// when `with_values` is false or `keep_stats` is true; `out` the output when
/// `with_values`.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn flash_forward_mma<F: Float>(
    q: &Array<F>,
    k: &Array<F>,
    v: &Array<F>,
    out: &mut Array<F>,
    stats: &mut Array<f32>,
    meta: &Array<u32>,
    scale: f32,
    neg_inf: f32,
    #[comptime] e: u32,
    #[comptime] ev: u32,
    #[comptime] with_values: bool,
    #[comptime] keep_stats: bool,
) {
    let rows = comptime!(WARPS * 16);
    let key_stride = comptime!(e / 2 + PAD_PAIRS);
    let value_stride = comptime!(KEY_TILE / 2 + PAD_PAIRS);
    let (tq, tk) = (meta[1], meta[2]);
    let causal = meta[3] == 1;
    let (we, wv) = (meta[4], meta[5]);
    let per_batch = (tq + rows - 1) / rows;
    let b = cube_index() / per_batch;
    // Whole cubes leave together, before any barrier.
    if b < meta[0] {
        let q0 = (cube_index() % per_batch) * rows;
        let lane = UNIT_POS_X % 32;
        let g = lane / 4;
        let t = lane % 4;
        // This lane's two query rows (in the batch's rows) and their first row in `q`.
        let row_a = q0 + (UNIT_POS_X / 32) * 16 + g;
        let row_b = row_a + 8;
        let q_base = b * tq;
        let k_base = b * tk;
        let queries = own_operands::<F>(q, q_base + row_a, q_base + tq, we, e);
        let mut outputs = zero_accs(comptime!(if with_values { ev / 8 } else { 0 }));
        let mut keys = SharedMemory::<Pair<F>>::new((KEY_TILE * key_stride) as usize);
        let mut values =
            SharedMemory::<Pair<F>>::new(
                comptime!(if with_values { ev * value_stride } else { 1 }) as usize,
            );

        let mut m_a = neg_inf;
        let mut m_b = neg_inf;
        // Each lane's share of its rows' sums (over its columns), added up at the end.
        let mut l_a = 0.0f32;
        let mut l_b = 0.0f32;
        let mut last = tk;
        if causal {
            last = min(tk, q0 + rows);
        }
        let mut j0 = 0u32;
        while j0 < last {
            // The tile: keys row-major, values transposed (a value column's keys in a
            // row).
            stage_rows::<F>(
                k,
                &mut keys,
                k_base + j0,
                k_base + tk,
                we,
                KEY_TILE,
                e,
                key_stride,
            );
            if with_values {
                stage_columns::<F>(
                    v,
                    &mut values,
                    k_base + j0,
                    k_base + tk,
                    wv,
                    KEY_TILE,
                    ev,
                    value_stride,
                );
            }
            sync_cube();
            let mut scores = products::<F>(&queries, &keys, KEY_TILE, e, key_stride);
            // Scale and mask them; each row's largest over the tile. A NaN score needs
            // no care here: its probability is NaN whatever the maximum.
            let mut tile_a = neg_inf;
            let mut tile_b = neg_inf;
            #[unroll]
            for n in 0..(KEY_TILE / 8) as usize {
                let acc = scores.index_mut(n);
                let mut sa = acc[0usize] * Pair::<f32>::new(scale);
                let mut sb = acc[1usize] * Pair::<f32>::new(scale);
                #[unroll]
                for c in 0..2u32 {
                    let j = j0 + n as u32 * 8 + 2 * t + c;
                    if j >= tk || (causal && j > row_a) {
                        sa[c as usize] = neg_inf;
                    }
                    if j >= tk || (causal && j > row_b) {
                        sb[c as usize] = neg_inf;
                    }
                    tile_a = max(tile_a, sa[c as usize]);
                    tile_b = max(tile_b, sb[c as usize]);
                }
                acc[0usize] = sa;
                acc[1usize] = sb;
            }
            let (ref_a, alpha_a) = advance(&mut m_a, quad_max(tile_a), neg_inf);
            let (ref_b, alpha_b) = advance(&mut m_b, quad_max(tile_b), neg_inf);
            // The probabilities, in place of the scores.
            let mut sum_a = 0.0f32;
            let mut sum_b = 0.0f32;
            #[unroll]
            for n in 0..(KEY_TILE / 8) as usize {
                let acc = scores.index_mut(n);
                let mut pa = acc[0usize];
                let mut pb = acc[1usize];
                #[unroll]
                for c in 0..2u32 {
                    pa[c as usize] = (pa[c as usize] - ref_a).exp();
                    pb[c as usize] = (pb[c as usize] - ref_b).exp();
                    sum_a += pa[c as usize];
                    sum_b += pb[c as usize];
                }
                acc[0usize] = pa;
                acc[1usize] = pb;
            }
            l_a = l_a * alpha_a + sum_a;
            l_b = l_b * alpha_b + sum_b;
            if with_values {
                #[unroll]
                for nb in 0..(ev / 8) as usize {
                    let o = outputs.index_mut(nb);
                    o[0usize] = o[0usize] * Pair::<f32>::new(alpha_a);
                    o[1usize] = o[1usize] * Pair::<f32>::new(alpha_b);
                }
                // output += probabilities (16 × KEY_TILE) · values (KEY_TILE × ev).
                accumulate::<F>(&scores, &values, &mut outputs, KEY_TILE, ev, value_stride);
            }
            sync_cube();
            j0 += KEY_TILE;
        }

        let total_a = quad_sum(l_a);
        let total_b = quad_sum(l_b);
        let mut lse_a = neg_inf;
        let mut lse_b = neg_inf;
        let mut inv_a = 0.0f32;
        let mut inv_b = 0.0f32;
        if total_a > 0.0 || nan::<f32>(total_a) {
            lse_a = m_a + total_a.ln();
            inv_a = 1.0 / total_a;
        }
        if total_b > 0.0 || nan::<f32>(total_b) {
            lse_b = m_b + total_b.ln();
            inv_b = 1.0 / total_b;
        }
        if (keep_stats || !with_values) && t == 0 {
            if row_a < tq {
                stats[(q_base + row_a) as usize] = lse_a;
            }
            if row_b < tq {
                stats[(q_base + row_b) as usize] = lse_b;
            }
        }
        if with_values {
            store_rows::<F>(
                out,
                &outputs,
                q_base + row_a,
                q_base + tq,
                wv,
                inv_a,
                inv_b,
                ev,
            );
        }
    }
}

/// Rows streamed per tile by the gradients' kernels for padded widths `e` and `ev`:
/// four staged tiles of 64 rows fit the shared memory up to heads 64 wide, of 32 rows
/// past that.
pub fn grad_tile(e: u32, ev: u32) -> u32 {
    if e.max(ev) <= 64 {
        64
    } else {
        32
    }
}

/// A gradient's weights from a block of scores `s` (accumulators of [`products`],
/// unscaled) and, `with_dp`, of `g·v` products `dp`, in place of `s`: the
/// probabilities `p = exp(scale·s − lse)`, or `p·(dp − delta)` with `dp`. Own row
/// `own_a` (and `own_a + 8`) and streamed column `first + c` are a query and a key as
/// `own_queries` says; the queries' statistics are in `own_stats` (by the warp's rows)
/// or `streamed_stats` (by column), log-sum-exps then deltas [`STATS_STRIDE`] further.
/// An element past either end, above the causal diagonal or of a row that sees no key
/// weighs 0.
#[cube]
#[allow(clippy::too_many_arguments, unused_assignments)]
fn weights_of(
    s: &mut Sequence<Array<Pair<f32>>>,
    dp: &Sequence<Array<Pair<f32>>>,
    own_stats: &SharedMemory<f32>,
    streamed_stats: &SharedMemory<f32>,
    own_a: u32,
    first: u32,
    own_end: u32,
    streamed_end: u32,
    causal: bool,
    scale: f32,
    neg_inf: f32,
    #[comptime] streamed: u32,
    #[comptime] own_queries: bool,
    #[comptime] with_dp: bool,
) {
    let lane = UNIT_POS_X % 32;
    let t = lane % 4;
    let warp_row = (UNIT_POS_X / 32) * 16 + lane / 4;
    #[unroll]
    for n in 0..(streamed / 8) as usize {
        let acc = s.index_mut(n);
        #[unroll]
        for h in 0..2u32 {
            let mut x = acc[h as usize];
            let mut d = Pair::<f32>::new(0.0);
            if with_dp {
                d = dp.index(n)[h as usize];
            }
            let own = own_a + 8 * h;
            #[unroll]
            for c in 0..2u32 {
                let col = n as u32 * 8 + 2 * t + c;
                let other = first + col;
                let mut query = other;
                let mut key = own;
                let mut row_lse = 0.0f32;
                let mut row_delta = 0.0f32;
                if own_queries {
                    query = own;
                    key = other;
                    row_lse = own_stats[(warp_row + 8 * h) as usize];
                    if with_dp {
                        row_delta = own_stats[(STATS_STRIDE + warp_row + 8 * h) as usize];
                    }
                } else {
                    row_lse = streamed_stats[col as usize];
                    if with_dp {
                        row_delta = streamed_stats[(STATS_STRIDE + col) as usize];
                    }
                }
                let mut w = 0.0f32;
                let seen = !(row_lse == neg_inf);
                if own < own_end && other < streamed_end && (!causal || key <= query) && seen {
                    w = (x[c as usize] * scale - row_lse).exp();
                    if with_dp {
                        w *= d[c as usize] - row_delta;
                    }
                }
                x[c as usize] = w;
            }
            acc[h as usize] = x;
        }
    }
}

/// Statistics rows `first..first + count` of `lse` and `delta` into `dst` (the
/// log-sum-exps at `0..`, the deltas at [`STATS_STRIDE`]`..`; zeros past `end`).
#[cube]
fn stage_stats(
    lse: &Array<f32>,
    delta: &Array<f32>,
    dst: &mut SharedMemory<f32>,
    first: u32,
    end: u32,
    #[comptime] count: u32,
) {
    if UNIT_POS_X < count {
        let mut l = 0.0f32;
        let mut d = 0.0f32;
        if first + UNIT_POS_X < end {
            l = lse[(first + UNIT_POS_X) as usize];
            d = delta[(first + UNIT_POS_X) as usize];
        }
        dst[UNIT_POS_X as usize] = l;
        dst[(STATS_STRIDE + UNIT_POS_X) as usize] = d;
    }
}

/// Where the deltas start in a cube's statistics (after the log-sum-exps).
const STATS_STRIDE: u32 = 64;

/// `dq_i = scale · Σ_j p_ij (g_i·v_j − delta_i) k_j` for `WARPS · 16` query rows (held
/// as A operands with their output gradients), keys and values streamed in tiles of
/// `tile` rows: keys staged both row-major (for the scores) and transposed (for the
/// sum), values row-major (for `g·v`).
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn flash_grad_q_mma<F: Float>(
    q: &Array<F>,
    k: &Array<F>,
    v: &Array<F>,
    g: &Array<F>,
    lse: &Array<f32>,
    delta: &Array<f32>,
    dq: &mut Array<F>,
    meta: &Array<u32>,
    scale: f32,
    neg_inf: f32,
    #[comptime] e: u32,
    #[comptime] ev: u32,
    #[comptime] tile: u32,
) {
    let rows = comptime!(WARPS * 16);
    let key_stride = comptime!(e / 2 + PAD_PAIRS);
    let value_stride = comptime!(ev / 2 + PAD_PAIRS);
    let column_stride = comptime!(tile / 2 + PAD_PAIRS);
    let (tq, tk) = (meta[1], meta[2]);
    let causal = meta[3] == 1;
    let (we, wv) = (meta[4], meta[5]);
    let per_batch = (tq + rows - 1) / rows;
    let b = cube_index() / per_batch;
    if b < meta[0] {
        let q0 = (cube_index() % per_batch) * rows;
        let row_a = q0 + (UNIT_POS_X / 32) * 16 + (UNIT_POS_X % 32) / 4;
        let q_base = b * tq;
        let k_base = b * tk;
        let queries = own_operands::<F>(q, q_base + row_a, q_base + tq, we, e);
        let grads = own_operands::<F>(g, q_base + row_a, q_base + tq, wv, ev);
        let mut own_stats = SharedMemory::<f32>::new(comptime!(2 * STATS_STRIDE) as usize);
        let streamed_stats = SharedMemory::<f32>::new(1usize);
        stage_stats(lse, delta, &mut own_stats, q_base + q0, q_base + tq, rows);
        let mut acc = zero_accs(e / 8);
        let mut keys = SharedMemory::<Pair<F>>::new((tile * key_stride) as usize);
        let mut key_columns = SharedMemory::<Pair<F>>::new((e * column_stride) as usize);
        let mut values = SharedMemory::<Pair<F>>::new((tile * value_stride) as usize);
        let mut last = tk;
        if causal {
            last = min(tk, q0 + rows);
        }
        let mut j0 = 0u32;
        while j0 < last {
            let (first, end) = (k_base + j0, k_base + tk);
            stage_rows::<F>(k, &mut keys, first, end, we, tile, e, key_stride);
            stage_columns::<F>(k, &mut key_columns, first, end, we, tile, e, column_stride);
            stage_rows::<F>(v, &mut values, first, end, wv, tile, ev, value_stride);
            sync_cube();
            let mut w = products::<F>(&queries, &keys, tile, e, key_stride);
            let dp = products::<F>(&grads, &values, tile, ev, value_stride);
            weights_of(
                &mut w,
                &dp,
                &own_stats,
                &streamed_stats,
                row_a,
                j0,
                tq,
                tk,
                causal,
                scale,
                neg_inf,
                tile,
                true,
                true,
            );
            accumulate::<F>(&w, &key_columns, &mut acc, tile, e, column_stride);
            sync_cube();
            j0 += tile;
        }
        store_rows::<F>(dq, &acc, q_base + row_a, q_base + tq, we, scale, scale, e);
    }
}

/// For `WARPS · 16` key rows (held as A operands with their values), the keys'
/// gradient `dk_j = scale · Σ_i p_ij (g_i·v_j − delta_i) q_i` (`with_dk`) and the
/// values' `dv_j = Σ_i p_ij g_i` (`with_dv`), queries and output gradients streamed in
/// tiles of `tile` rows, each staged row-major (for the scores and `g·v`) and
/// transposed (for the sums). Either gradient alone is bit for bit what both compute.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn flash_grad_kv_mma<F: Float>(
    q: &Array<F>,
    k: &Array<F>,
    v: &Array<F>,
    g: &Array<F>,
    lse: &Array<f32>,
    delta: &Array<f32>,
    dk: &mut Array<F>,
    dv: &mut Array<F>,
    meta: &Array<u32>,
    scale: f32,
    neg_inf: f32,
    #[comptime] e: u32,
    #[comptime] ev: u32,
    #[comptime] tile: u32,
    #[comptime] with_dk: bool,
    #[comptime] with_dv: bool,
) {
    let rows = comptime!(WARPS * 16);
    let query_stride = comptime!(e / 2 + PAD_PAIRS);
    let grad_stride = comptime!(ev / 2 + PAD_PAIRS);
    let column_stride = comptime!(tile / 2 + PAD_PAIRS);
    let (tq, tk) = (meta[1], meta[2]);
    let causal = meta[3] == 1;
    let (we, wv) = (meta[4], meta[5]);
    let per_batch = (tk + rows - 1) / rows;
    let b = cube_index() / per_batch;
    if b < meta[0] {
        let k0 = (cube_index() % per_batch) * rows;
        let row_a = k0 + (UNIT_POS_X / 32) * 16 + (UNIT_POS_X % 32) / 4;
        let q_base = b * tq;
        let k_base = b * tk;
        let keys = own_operands::<F>(k, k_base + row_a, k_base + tk, we, e);
        let values = own_operands::<F>(
            v,
            k_base + row_a,
            k_base + tk,
            wv,
            comptime!(if with_dk { ev } else { 0 }),
        );
        let own_stats = SharedMemory::<f32>::new(1usize);
        let mut streamed_stats = SharedMemory::<f32>::new(comptime!(2 * STATS_STRIDE) as usize);
        let mut key_grads = zero_accs(comptime!(if with_dk { e / 8 } else { 0 }));
        let mut value_grads = zero_accs(comptime!(if with_dv { ev / 8 } else { 0 }));
        let mut queries = SharedMemory::<Pair<F>>::new((tile * query_stride) as usize);
        let mut query_columns =
            SharedMemory::<Pair<F>>::new(
                comptime!(if with_dk { e * column_stride } else { 1 }) as usize
            );
        let mut grads =
            SharedMemory::<Pair<F>>::new(
                comptime!(if with_dk { tile * grad_stride } else { 1 }) as usize
            );
        let mut grad_columns =
            SharedMemory::<Pair<F>>::new(
                comptime!(if with_dv { ev * column_stride } else { 1 }) as usize
            );
        // Causal: queries before the cube's first key see none of its keys.
        let mut i0 = 0u32;
        if causal {
            i0 = k0 - k0 % tile;
        }
        while i0 < tq {
            let (first, end) = (q_base + i0, q_base + tq);
            stage_rows::<F>(q, &mut queries, first, end, we, tile, e, query_stride);
            if with_dk {
                stage_columns::<F>(
                    q,
                    &mut query_columns,
                    first,
                    end,
                    we,
                    tile,
                    e,
                    column_stride,
                );
                stage_rows::<F>(g, &mut grads, first, end, wv, tile, ev, grad_stride);
            }
            if with_dv {
                stage_columns::<F>(
                    g,
                    &mut grad_columns,
                    first,
                    end,
                    wv,
                    tile,
                    ev,
                    column_stride,
                );
            }
            stage_stats(lse, delta, &mut streamed_stats, first, end, tile);
            sync_cube();
            let s = products::<F>(&keys, &queries, tile, e, query_stride);
            if with_dv {
                let mut p = zero_accs(tile / 8);
                #[unroll]
                for n in 0..(tile / 8) as usize {
                    let x = s.index(n);
                    let y = p.index_mut(n);
                    y[0usize] = x[0usize];
                    y[1usize] = x[1usize];
                }
                weights_of(
                    &mut p,
                    &s,
                    &own_stats,
                    &streamed_stats,
                    row_a,
                    i0,
                    tk,
                    tq,
                    causal,
                    scale,
                    neg_inf,
                    tile,
                    false,
                    false,
                );
                accumulate::<F>(&p, &grad_columns, &mut value_grads, tile, ev, column_stride);
            }
            if with_dk {
                let mut w = s;
                let dp = products::<F>(&values, &grads, tile, ev, grad_stride);
                weights_of(
                    &mut w,
                    &dp,
                    &own_stats,
                    &streamed_stats,
                    row_a,
                    i0,
                    tk,
                    tq,
                    causal,
                    scale,
                    neg_inf,
                    tile,
                    false,
                    true,
                );
                accumulate::<F>(&w, &query_columns, &mut key_grads, tile, e, column_stride);
            }
            sync_cube();
            i0 += tile;
        }
        if with_dk {
            store_rows::<F>(
                dk,
                &key_grads,
                k_base + row_a,
                k_base + tk,
                we,
                scale,
                scale,
                e,
            );
        }
        if with_dv {
            store_rows::<F>(
                dv,
                &value_grads,
                k_base + row_a,
                k_base + tk,
                wv,
                1.0,
                1.0,
                ev,
            );
        }
    }
}
