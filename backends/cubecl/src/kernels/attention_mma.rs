//! Attention's tensor-core kernel for half-float heads (bf16, f16) on runtimes with
//! cooperative matrices (CUDA's WMMA): FlashAttention's tiling with every product a
//! 16×16×16 `cmma` (f32 accumulators). A cube of [`WARPS`] or half as many warps owns 16
//! rows per warp — query rows for the log-sum-exp, the output and `dq`, key rows for `dk`
//! and `dv` — and streams the other side through shared memory in tiles of
//! [`STREAM_ROWS`] rows. Per tile each warp forms its 16×32 block of scores (and, for the
//! gradients of q and k, of `g·vᵀ`) in shared memory, turns it into weights with its 32
//! lanes (the probabilities from the row log-sum-exp, or `p·(dp − delta)`), and adds the
//! weights times the tile's values (keys, queries, gradients) to accumulators that stay
//! in registers for the whole pass. The output is computed in two passes over the keys —
//! the log-sum-exp, then the output from it — so the accumulators need no rescaling: one
//! more product against the online softmax's per-tile rescale through shared memory.
//! No `Tq×Tk` matrix is stored; causal cubes stop at the diagonal.
//!
//! The math is `kiln_tensor::attention`'s (as [`super::attention`]'s kernels): scores and
//! statistics in f32, the weights rounded to the inputs' dtype for their product, as
//! FlashAttention does. Metadata as [`super::attention`]'s: `[batch, tq, tk, causal, e,
//! ev]`.

// Kernel code rounds up by hand: `u32::div_ceil` has no cube expansion.
#![allow(clippy::manual_div_ceil)]
use super::attention::load_stats;
use super::common::{cube_index, nan};
use cubecl::cmma::{self, Matrix, MatrixIdent, MatrixLayout};
use cubecl::prelude::*;

/// Warps of a cube for heads up to 64 wide (half as many for wider ones).
pub const WARPS: u32 = 4;
/// Rows of the streamed side per shared-memory tile.
pub const STREAM_ROWS: u32 = 32;
/// Byte alignment of the shared-memory tiles (WMMA loads and stores want 256 bits).
const ALIGN: usize = 32;
/// Extra elements per row of a half tile: rows 16 bytes apart from a multiple of 128,
/// so a fragment's rows fall in different banks.
const HALF_PAD: u32 = 8;
/// Row stride of the f32 score blocks (a multiple of 4, not of 32, for the same reason).
const SCORE_STRIDE: u32 = STREAM_ROWS + 4;
/// Row stride of the half weight blocks.
const WEIGHT_STRIDE: u32 = STREAM_ROWS + HALF_PAD;
/// The widest head the kernel takes.
pub const MAX_MMA_WIDTH: usize = 128;

/// The row log-sum-exp alone ([`kiln_tensor::Op::AttentionLse`]).
pub const MODE_LSE: u32 = 0;
/// The output ([`kiln_tensor::Op::Attention`]).
pub const MODE_OUT: u32 = 1;
/// The gradient of q.
pub const MODE_DQ: u32 = 2;
/// The gradient of k.
pub const MODE_DK: u32 = 3;
/// The gradient of v.
pub const MODE_DV: u32 = 4;
/// The gradients of k and v in one pass over the queries: `dk` into `out`, `dv` into
/// `out2`, each bit for bit what [`MODE_DK`] and [`MODE_DV`] compute alone (the same
/// weights, accumulated in the same order), for the cost of about one of them.
pub const MODE_DKV: u32 = 5;

/// Warps per cube for padded widths `e` and `ev`.
pub fn warps(e: u32, ev: u32) -> u32 {
    if e.max(ev) <= 64 {
        WARPS
    } else {
        WARPS / 2
    }
}

/// Copies rows `first..first + rows` of `src` (rows of `width`) into `dst` as rows of
/// `padded` elements `padded + HALF_PAD` apart, zeros past each row's end and for rows at
/// or past `end`; all `units` take part, their loads issued together (unrolled).
#[cube]
#[allow(clippy::too_many_arguments)]
fn stage<F: Float>(
    src: &Array<F>,
    dst: &mut SharedMemory<F>,
    first: u32,
    end: u32,
    width: u32,
    #[comptime] rows: u32,
    #[comptime] padded: u32,
    #[comptime] units: u32,
) {
    let n = comptime!(rows * padded);
    let steps = comptime!((rows * padded).div_ceil(units));
    #[unroll]
    for s in 0..steps {
        let idx = UNIT_POS_X + s * units;
        if idx < n {
            let r = idx / padded;
            let c = idx % padded;
            let mut x = F::new(0.0);
            if first + r < end && c < width {
                x = src[((first + r) * width + c) as usize];
            }
            dst[(r * (padded + HALF_PAD) + c) as usize] = x;
        }
    }
}

/// This unit's share of rows `first..first + rows` of `src` (as [`stage`] copies them),
/// loaded into `regs` while the cube computes on the tile before: the next tile's
/// global loads overlap this one's products.
#[cube]
#[allow(clippy::too_many_arguments)]
fn fetch<F: Float>(
    regs: &mut Array<F>,
    src: &Array<F>,
    first: u32,
    end: u32,
    width: u32,
    #[comptime] rows: u32,
    #[comptime] padded: u32,
    #[comptime] units: u32,
) {
    let n = comptime!(rows * padded);
    let steps = comptime!((rows * padded).div_ceil(units));
    #[unroll]
    for s in 0..steps {
        let idx = UNIT_POS_X + s * units;
        let r = idx / padded;
        let c = idx % padded;
        let mut x = F::new(0.0);
        if idx < n && first + r < end && c < width {
            x = src[((first + r) * width + c) as usize];
        }
        regs[s as usize] = x;
    }
}

/// Stores what [`fetch`] loaded into its places in `dst`.
#[cube]
fn put<F: Float>(
    regs: &Array<F>,
    dst: &mut SharedMemory<F>,
    #[comptime] rows: u32,
    #[comptime] padded: u32,
    #[comptime] units: u32,
) {
    let n = comptime!(rows * padded);
    let steps = comptime!((rows * padded).div_ceil(units));
    #[unroll]
    for s in 0..steps {
        let idx = UNIT_POS_X + s * units;
        if idx < n {
            dst[((idx / padded) * (padded + HALF_PAD) + idx % padded) as usize] = regs[s as usize];
        }
    }
}

/// This warp's 16×[`STREAM_ROWS`] block `own_w · streamedᵀ` (both staged rows `width`
/// wide) into `out` (f32, rows [`SCORE_STRIDE`] apart) at `at`.
#[cube]
fn scores<F: Float, A: Float>(
    own: &SharedMemory<F>,
    streamed: &SharedMemory<F>,
    out: &mut SharedMemory<A>,
    warp: u32,
    at: u32,
    #[comptime] width: u32,
) {
    let stride = comptime!(width + HALF_PAD);
    #[unroll]
    for n in 0..STREAM_ROWS / 16 {
        let acc = Matrix::<A>::from_value(
            MatrixIdent::Accumulator,
            16usize,
            16usize,
            16usize,
            MatrixLayout::Undefined,
            A::new(0.0),
        );
        #[unroll]
        for kk in 0..width / 16 {
            let a_at = (warp * 16 * stride + kk * 16) as usize;
            let a = Matrix::<F>::from_slice(
                MatrixIdent::A,
                16usize,
                16usize,
                16usize,
                MatrixLayout::RowMajor,
                &own.slice(a_at, a_at + (15 * stride + 16) as usize),
                stride,
            );
            // `streamedᵀ` as B: element (c, j) is streamed[j·stride + c], column-major.
            let b_at = (n * 16 * stride + kk * 16) as usize;
            let b = Matrix::<F>::from_slice(
                MatrixIdent::B,
                16usize,
                16usize,
                16usize,
                MatrixLayout::ColMajor,
                &streamed.slice(b_at, b_at + (15 * stride + 16) as usize),
                stride,
            );
            cmma::execute::<F, F, A, A>(&a, &b, &acc, &acc);
        }
        let o_at = (at + n * 16) as usize;
        cmma::store(
            &mut out.slice_mut(o_at, o_at + (15 * SCORE_STRIDE + 16) as usize),
            &acc,
            SCORE_STRIDE,
            MatrixLayout::RowMajor,
        );
    }
}

/// One launch of attention on the tensor cores; `mode` says which result (the `MODE_*`
/// constants), `e` and `ev` are the padded widths (multiples of 16), `warps` the cube's.
/// `out` is the result's rows (unused for the log-sum-exp), `stats` the log-sum-exp
/// written (for it alone, or beside the output with `keep_stats`: the output's first
/// pass computes it anyway, so the forward pass and its statistics cost one launch),
/// `out2` the second result of [`MODE_DKV`] (unused otherwise).
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn flash_mma<F: Float, A: Float + CubeElement>(
    q: &Array<F>,
    k: &Array<F>,
    v: &Array<F>,
    g: &Array<F>,
    lse: &Array<A>,
    delta: &Array<A>,
    out: &mut Array<F>,
    out2: &mut Array<F>,
    stats: &mut Array<A>,
    meta: &Array<u32>,
    scale: A,
    neg_inf: A,
    #[comptime] e: u32,
    #[comptime] ev: u32,
    #[comptime] mode: u32,
    #[comptime] warps: u32,
    #[comptime] keep_stats: bool,
) {
    let units = comptime!(warps * 32);
    let rows = comptime!(warps * 16);
    // Own rows are queries for the log-sum-exp, the output and dq; keys for dk and dv.
    let own_queries = comptime!(mode <= MODE_DQ);
    let both = comptime!(mode == MODE_DKV);
    let two_products = comptime!(mode == MODE_DQ || mode == MODE_DK || both);
    // The accumulated product's source is the second streamed tile (v, g) for the output
    // and dv, the first (k, q) for dq and dk; its width is the result's.
    let from_second = comptime!(mode == MODE_OUT || mode == MODE_DV);
    let result_width = comptime!(if from_second { ev } else { e });
    let source_stride = comptime!(result_width + HALF_PAD);
    // Each unit's share of a streamed tile, held while the tile before is computed on.
    let y_regs = comptime!((STREAM_ROWS * e).div_ceil(units));
    let y2_regs = comptime!((STREAM_ROWS * ev).div_ceil(units));
    let blocks = comptime!((result_width / 16) as usize);
    // `dv`'s accumulators beside `dk`'s, for both gradients in one pass.
    let blocks2 = comptime!(if both { (ev / 16) as usize } else { 0usize });
    let v_stride = comptime!(ev + HALF_PAD);

    let (tq, tk) = (meta[1], meta[2]);
    let causal = meta[3] == 1;
    let (we, wv) = (meta[4], meta[5]);
    let mut own_t = tk;
    let mut str_t = tq;
    if own_queries {
        own_t = tq;
        str_t = tk;
    }
    let per_batch = (own_t + rows - 1) / rows;
    let b = cube_index() / per_batch;
    // Whole cubes leave together, before any barrier.
    if b < meta[0] {
        let own0 = (cube_index() % per_batch) * rows;
        let warp = UNIT_POS_X / 32;
        let lane = UNIT_POS_X % 32;
        let own_base = b * own_t;
        let str_base = b * str_t;

        // The own rows: q (and g for dq), or k (and v for dk).
        let mut xs = SharedMemory::<F>::new_aligned((rows * (e + HALF_PAD)) as usize, ALIGN);
        let mut x2s = SharedMemory::<F>::new_aligned(
            comptime!(if two_products {
                rows * (ev + HALF_PAD)
            } else {
                16
            }) as usize,
            ALIGN,
        );
        if own_queries {
            stage::<F>(
                q,
                &mut xs,
                own_base + own0,
                own_base + own_t,
                we,
                rows,
                e,
                units,
            );
            if two_products {
                stage::<F>(
                    g,
                    &mut x2s,
                    own_base + own0,
                    own_base + own_t,
                    wv,
                    rows,
                    ev,
                    units,
                );
            }
        } else {
            stage::<F>(
                k,
                &mut xs,
                own_base + own0,
                own_base + own_t,
                we,
                rows,
                e,
                units,
            );
            if two_products {
                stage::<F>(
                    v,
                    &mut x2s,
                    own_base + own0,
                    own_base + own_t,
                    wv,
                    rows,
                    ev,
                    units,
                );
            }
        }
        // Per own row (queries): the log-sum-exp (computed by the first pass for the
        // output, read for dq) and delta.
        let mut own_lse = SharedMemory::<A>::new(rows as usize);
        let mut own_delta = SharedMemory::<A>::new(rows as usize);
        if mode == MODE_DQ {
            load_stats::<A>(lse, &mut own_lse, own_base + own0, own_base + own_t, rows);
            load_stats::<A>(
                delta,
                &mut own_delta,
                own_base + own0,
                own_base + own_t,
                rows,
            );
        }
        // Per streamed row (queries, for dk and dv): their statistics.
        let mut str_lse = SharedMemory::<A>::new(STREAM_ROWS as usize);
        let mut str_delta = SharedMemory::<A>::new(STREAM_ROWS as usize);

        let mut ys = SharedMemory::<F>::new_aligned((STREAM_ROWS * (e + HALF_PAD)) as usize, ALIGN);
        let mut y2s =
            SharedMemory::<F>::new_aligned((STREAM_ROWS * (ev + HALF_PAD)) as usize, ALIGN);
        let mut ss = SharedMemory::<A>::new_aligned((rows * SCORE_STRIDE) as usize, ALIGN);
        let mut dps = SharedMemory::<A>::new_aligned(
            comptime!(if two_products {
                rows * SCORE_STRIDE
            } else {
                16
            }) as usize,
            ALIGN,
        );
        let mut ws = SharedMemory::<F>::new_aligned((rows * WEIGHT_STRIDE) as usize, ALIGN);
        // `dv`'s weights (the probabilities) beside `dk`'s.
        let mut ws2 = SharedMemory::<F>::new_aligned(
            comptime!(if both { rows * WEIGHT_STRIDE } else { 16 }) as usize,
            ALIGN,
        );

        // The streamed range: causal queries see keys up to themselves, keys are seen
        // by queries from themselves on.
        let mut first = 0u32;
        let mut last = str_t;
        if causal {
            if own_queries {
                last = min(str_t, own0 + rows);
            } else {
                first = own0 - own0 % STREAM_ROWS;
            }
        }
        // This warp's blocks of scores and of weights.
        let warp_at = warp * 16 * SCORE_STRIDE;
        let weights_at = warp * 16 * WEIGHT_STRIDE;

        // The first pass of the output and the log-sum-exp alone: each row's running
        // maximum and sum over the keys, lanes 2r and 2r + 1 of a warp each holding them
        // for half of row r's columns, merged at the end.
        let mut m = neg_inf;
        let mut l = A::new(0.0);
        if mode <= MODE_OUT {
            let r = lane / 2;
            let half = lane % 2;
            let i = own0 + warp * 16 + r;
            let mut next = Array::<F>::new(y_regs as usize);
            fetch::<F>(
                &mut next,
                k,
                str_base + first,
                str_base + str_t,
                we,
                STREAM_ROWS,
                e,
                units,
            );
            let mut t0 = first;
            while t0 < last {
                put::<F>(&next, &mut ys, STREAM_ROWS, e, units);
                sync_cube();
                fetch::<F>(
                    &mut next,
                    k,
                    str_base + t0 + STREAM_ROWS,
                    str_base + str_t,
                    we,
                    STREAM_ROWS,
                    e,
                    units,
                );
                scores::<F, A>(&xs, &ys, &mut ss, warp, warp_at, e);
                sync_cube();
                #[unroll]
                for cc in 0..STREAM_ROWS / 2 {
                    let c = half * (STREAM_ROWS / 2) + cc;
                    let j = t0 + c;
                    if j < str_t && (!causal || j <= i) {
                        let s = ss[(warp_at + r * SCORE_STRIDE + c) as usize] * scale;
                        if s > m {
                            l *= (m - s).exp();
                            m = s;
                        }
                        if s > neg_inf {
                            l += (s - m).exp();
                        } else if nan::<A>(s) {
                            l = s;
                        }
                    }
                }
                sync_cube();
                t0 += STREAM_ROWS;
            }
            // The odd lane hands its half to the even one through the statistics rows.
            if half == 1 {
                own_lse[(warp * 16 + r) as usize] = m;
                own_delta[(warp * 16 + r) as usize] = l;
            }
            sync_cube();
            if half == 0 {
                let m2 = own_lse[(warp * 16 + r) as usize];
                let l2 = own_delta[(warp * 16 + r) as usize];
                let top = max(m, m2);
                let mut sum = A::new(0.0);
                if l > A::new(0.0) || nan::<A>(l) {
                    sum += l * (m - top).exp();
                }
                if l2 > A::new(0.0) || nan::<A>(l2) {
                    sum += l2 * (m2 - top).exp();
                }
                let mut row_lse = neg_inf;
                if sum > A::new(0.0) || nan::<A>(sum) {
                    row_lse = top + sum.ln();
                }
                own_lse[(warp * 16 + r) as usize] = row_lse;
                if (mode == MODE_LSE || keep_stats) && i < own_t {
                    stats[(own_base + i) as usize] = row_lse;
                }
            }
            sync_cube();
        }

        if mode != MODE_LSE {
            let mut accs = Sequence::<Matrix<A>>::new();
            #[unroll]
            for _o in 0..blocks {
                accs.push(Matrix::<A>::from_value(
                    MatrixIdent::Accumulator,
                    16usize,
                    16usize,
                    16usize,
                    MatrixLayout::Undefined,
                    A::new(0.0),
                ));
            }
            let mut accs2 = Sequence::<Matrix<A>>::new();
            #[unroll]
            for _o in 0..blocks2 {
                accs2.push(Matrix::<A>::from_value(
                    MatrixIdent::Accumulator,
                    16usize,
                    16usize,
                    16usize,
                    MatrixLayout::Undefined,
                    A::new(0.0),
                ));
            }
            // The streamed operands: k and v for own queries, q and g for own keys.
            let mut next = Array::<F>::new(y_regs as usize);
            let mut next2 = Array::<F>::new(y2_regs as usize);
            if own_queries {
                fetch::<F>(
                    &mut next,
                    k,
                    str_base + first,
                    str_base + str_t,
                    we,
                    STREAM_ROWS,
                    e,
                    units,
                );
                fetch::<F>(
                    &mut next2,
                    v,
                    str_base + first,
                    str_base + str_t,
                    wv,
                    STREAM_ROWS,
                    ev,
                    units,
                );
            } else {
                fetch::<F>(
                    &mut next,
                    q,
                    str_base + first,
                    str_base + str_t,
                    we,
                    STREAM_ROWS,
                    e,
                    units,
                );
                fetch::<F>(
                    &mut next2,
                    g,
                    str_base + first,
                    str_base + str_t,
                    wv,
                    STREAM_ROWS,
                    ev,
                    units,
                );
            }
            let mut t0 = first;
            while t0 < last {
                put::<F>(&next, &mut ys, STREAM_ROWS, e, units);
                put::<F>(&next2, &mut y2s, STREAM_ROWS, ev, units);
                if !own_queries {
                    load_stats::<A>(
                        lse,
                        &mut str_lse,
                        str_base + t0,
                        str_base + str_t,
                        STREAM_ROWS,
                    );
                    load_stats::<A>(
                        delta,
                        &mut str_delta,
                        str_base + t0,
                        str_base + str_t,
                        STREAM_ROWS,
                    );
                }
                sync_cube();
                let after = str_base + t0 + STREAM_ROWS;
                if own_queries {
                    fetch::<F>(
                        &mut next,
                        k,
                        after,
                        str_base + str_t,
                        we,
                        STREAM_ROWS,
                        e,
                        units,
                    );
                    fetch::<F>(
                        &mut next2,
                        v,
                        after,
                        str_base + str_t,
                        wv,
                        STREAM_ROWS,
                        ev,
                        units,
                    );
                } else {
                    fetch::<F>(
                        &mut next,
                        q,
                        after,
                        str_base + str_t,
                        we,
                        STREAM_ROWS,
                        e,
                        units,
                    );
                    fetch::<F>(
                        &mut next2,
                        g,
                        after,
                        str_base + str_t,
                        wv,
                        STREAM_ROWS,
                        ev,
                        units,
                    );
                }
                scores::<F, A>(&xs, &ys, &mut ss, warp, warp_at, e);
                if two_products {
                    scores::<F, A>(&x2s, &y2s, &mut dps, warp, warp_at, ev);
                }
                sync_cube();
                // The weights of this warp's 16×STREAM_ROWS block, 16 per lane.
                #[unroll]
                for t in 0..16 * STREAM_ROWS / 32 {
                    let idx = lane + t * 32;
                    let r = idx / STREAM_ROWS;
                    let c = idx % STREAM_ROWS;
                    let own = own0 + warp * 16 + r;
                    let other = t0 + c;
                    let mut query = other;
                    let mut key = own;
                    let mut row_lse = str_lse[c as usize];
                    let mut row_delta = A::new(0.0);
                    if own_queries {
                        query = own;
                        key = other;
                        row_lse = own_lse[(warp * 16 + r) as usize];
                        if two_products {
                            row_delta = own_delta[(warp * 16 + r) as usize];
                        }
                    } else if two_products {
                        row_delta = str_delta[c as usize];
                    }
                    let mut w = A::new(0.0);
                    let mut p = A::new(0.0);
                    let seen = !(row_lse == neg_inf);
                    if own < own_t && other < str_t && (!causal || key <= query) && seen {
                        let at = (warp_at + r * SCORE_STRIDE + c) as usize;
                        p = (ss[at] * scale - row_lse).exp();
                        w = p;
                        if two_products {
                            w *= dps[at] - row_delta;
                        }
                    }
                    ws[(weights_at + r * WEIGHT_STRIDE + c) as usize] = F::cast_from(w);
                    if both {
                        ws2[(weights_at + r * WEIGHT_STRIDE + c) as usize] = F::cast_from(p);
                    }
                }
                sync_cube();
                // acc (16×result) += weights (16×STREAM_ROWS) · source (STREAM_ROWS×result).
                #[unroll]
                for o in 0..blocks {
                    let acc = accs.index(o);
                    let col = o as u32 * 16;
                    #[unroll]
                    for kk in 0..STREAM_ROWS / 16 {
                        let a_at = (weights_at + kk * 16) as usize;
                        let a = Matrix::<F>::from_slice(
                            MatrixIdent::A,
                            16usize,
                            16usize,
                            16usize,
                            MatrixLayout::RowMajor,
                            &ws.slice(a_at, a_at + (15 * WEIGHT_STRIDE + 16) as usize),
                            WEIGHT_STRIDE,
                        );
                        let b_at = (kk * 16 * source_stride + col) as usize;
                        let end = b_at + (15 * source_stride + 16) as usize;
                        if from_second {
                            let b = Matrix::<F>::from_slice(
                                MatrixIdent::B,
                                16usize,
                                16usize,
                                16usize,
                                MatrixLayout::RowMajor,
                                &y2s.slice(b_at, end),
                                source_stride,
                            );
                            cmma::execute::<F, F, A, A>(&a, &b, acc, acc);
                        } else {
                            let b = Matrix::<F>::from_slice(
                                MatrixIdent::B,
                                16usize,
                                16usize,
                                16usize,
                                MatrixLayout::RowMajor,
                                &ys.slice(b_at, end),
                                source_stride,
                            );
                            cmma::execute::<F, F, A, A>(&a, &b, acc, acc);
                        }
                    }
                }
                // dv (16×ev) += probabilities (16×STREAM_ROWS) · g (STREAM_ROWS×ev).
                #[unroll]
                for o in 0..blocks2 {
                    let acc = accs2.index(o);
                    let col = o as u32 * 16;
                    #[unroll]
                    for kk in 0..STREAM_ROWS / 16 {
                        let a_at = (weights_at + kk * 16) as usize;
                        let a = Matrix::<F>::from_slice(
                            MatrixIdent::A,
                            16usize,
                            16usize,
                            16usize,
                            MatrixLayout::RowMajor,
                            &ws2.slice(a_at, a_at + (15 * WEIGHT_STRIDE + 16) as usize),
                            WEIGHT_STRIDE,
                        );
                        let b_at = (kk * 16 * v_stride + col) as usize;
                        let b = Matrix::<F>::from_slice(
                            MatrixIdent::B,
                            16usize,
                            16usize,
                            16usize,
                            MatrixLayout::RowMajor,
                            &y2s.slice(b_at, b_at + (15 * v_stride + 16) as usize),
                            v_stride,
                        );
                        cmma::execute::<F, F, A, A>(&a, &b, acc, acc);
                    }
                }
                sync_cube();
                t0 += STREAM_ROWS;
            }
            // The accumulators out through this warp's score block, 16×16 at a time.
            let mut factor = A::new(1.0);
            if two_products {
                factor = scale;
            }
            let mut stored = we;
            if from_second {
                stored = wv;
            }
            #[unroll]
            for o in 0..blocks {
                cmma::store(
                    &mut ss.slice_mut(
                        warp_at as usize,
                        (warp_at + 15 * SCORE_STRIDE + 16) as usize,
                    ),
                    accs.index(o),
                    SCORE_STRIDE,
                    MatrixLayout::RowMajor,
                );
                sync_cube();
                #[unroll]
                for t in 0..8u32 {
                    let idx = lane + t * 32;
                    let r = idx / 16;
                    let c = o as u32 * 16 + idx % 16;
                    let own = own0 + warp * 16 + r;
                    if own < own_t && c < stored {
                        let x = ss[(warp_at + r * SCORE_STRIDE + idx % 16) as usize] * factor;
                        out[((own_base + own) * stored + c) as usize] = F::cast_from(x);
                    }
                }
                sync_cube();
            }
            // dv's, unscaled, into the second result.
            #[unroll]
            for o in 0..blocks2 {
                cmma::store(
                    &mut ss.slice_mut(
                        warp_at as usize,
                        (warp_at + 15 * SCORE_STRIDE + 16) as usize,
                    ),
                    accs2.index(o),
                    SCORE_STRIDE,
                    MatrixLayout::RowMajor,
                );
                sync_cube();
                #[unroll]
                for t in 0..8u32 {
                    let idx = lane + t * 32;
                    let r = idx / 16;
                    let c = o as u32 * 16 + idx % 16;
                    let own = own0 + warp * 16 + r;
                    if own < own_t && c < wv {
                        let x = ss[(warp_at + r * SCORE_STRIDE + idx % 16) as usize];
                        out2[((own_base + own) * wv + c) as usize] = F::cast_from(x);
                    }
                }
                sync_cube();
            }
        }
    }
}
