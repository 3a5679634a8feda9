//! Attention's tiled kernels (FlashAttention's scheme, every runtime): a cube of
//! [`TILE_ROWS`] units owns as many rows — query rows for the forward pass and `dq`, key
//! rows for `dk` and `dv` — each unit one row held in registers, and streams the other
//! side (keys and values, or queries and the output's gradient) through shared memory in
//! tiles that every unit of the cube reads. The forward pass carries each row's running
//! maximum and sum across the tiles (an online softmax, rescaling only when the maximum
//! grows) and saves the row log-sum-exp; the gradients recompute each probability from
//! it. No `Tq×Tk` matrix is ever stored; causal cubes stop at the last tile their rows
//! see. The head widths, rounded up to a multiple of [`WIDTH_STEP`] and zero-padded, are
//! comptime, so the per-row loops unroll into registers and one kernel serves nearby
//! widths; heads wider than [`MAX_TILED_WIDTH`] go to [`super::attention_rows`]. The
//! math is `kiln_tensor::attention`'s, accumulated in `A`.
//!
//! Dropout on the weights (comptime `dropout`) multiplies each `p_ij` of the output and
//! the gradients by its factor, drawn from the weight's counter as
//! `kiln_tensor::AttentionDropout` defines it; the key derives from the op's own seed
//! (launch arguments) xor the two words of `seed`, so a captured step reads its seed
//! from device memory. Without dropout `seed` is not read.
//!
//! Metadata: `[batch, tq, tk, causal, e, ev]` (`e`, `ev`: the widths as stored). Inputs
//! are contiguous `[batch·T, width]` rows.

// Kernel code rounds up by hand: `u32::div_ceil` has no cube expansion.
#![allow(clippy::manual_div_ceil)]
use super::common::{cube_index, nan};
use super::random::{dropout_factor, dropout_key};
use cubecl::prelude::*;

/// Four consecutive elements of a row: the unit of the tiles' shared-memory traffic.
pub(super) type Quad<A> = Vector<A, Const<4>>;

/// Rows per cube, one per unit.
pub const TILE_ROWS: u32 = 64;
/// The widest head (`E` or `Ev`) the tiled kernels hold in registers.
pub const MAX_TILED_WIDTH: usize = 256;

/// The kernels' widths are the heads' rounded up to a multiple of this.
pub const WIDTH_STEP: usize = 16;

/// The comptime width of a head `width` wide.
pub fn padded(width: usize) -> u32 {
    width.next_multiple_of(WIDTH_STEP) as u32
}

/// Rows of the streamed operands per shared-memory tile for padded head widths `e` and
/// `ev`: the two tiles together hold at most 4,096 elements (32 KiB in f64), up to 32
/// rows.
pub fn tile_len(e: u32, ev: u32) -> u32 {
    (4096 / (e + ev).max(1)).clamp(1, 32)
}

/// The key of dropout's draws ([`dropout_key`]); 0, `seed` unread, without dropout.
#[cube]
pub(super) fn key_of(
    seed: &Array<u32>,
    own_lo: u32,
    own_hi: u32,
    #[comptime] dropout: bool,
) -> u32 {
    let mut key = 0u32;
    if dropout {
        key = dropout_key(seed, own_lo, own_hi);
    }
    key
}

/// Copies rows `first..first + tile` of `src` (rows of `width` elements) into `dst` as
/// rows of `padded` in `A`, four to a [`Quad`] (converted once here, not by each unit
/// that reads them), zeros past the row's end and for the rows at or past `end`; every
/// unit of the cube takes part.
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_tile<F: Float, A: Float>(
    src: &Array<F>,
    dst: &mut SharedMemory<Quad<A>>,
    first: u32,
    end: u32,
    width: u32,
    #[comptime] tile: u32,
    #[comptime] padded: u32,
) {
    let quads = comptime!(padded / 4);
    let n = comptime!(tile * quads);
    let steps = comptime!((tile * quads).div_ceil(TILE_ROWS));
    // Not unrolled: on the H200 the unrolled loads cost more registers than the overlap
    // gained (0.63 against 0.52 ms at T 256, f32).
    for s in 0..steps {
        let idx = UNIT_POS_X + s * TILE_ROWS;
        if idx < n {
            let r = idx / quads;
            let c0 = (idx % quads) * 4;
            let mut x = Quad::<A>::new(A::new(0.0));
            if first + r < end {
                let at = (first + r) * width + c0;
                #[unroll]
                for lane in 0..4u32 {
                    if c0 + lane < width {
                        x[lane as usize] = A::cast_from(src[(at + lane) as usize]);
                    }
                }
            }
            dst[idx as usize] = x;
        }
    }
}

/// Copies the row statistics `first..first + tile` of `src` into `dst` (zeros past
/// `end`); the first `tile` units of the cube take part.
#[cube]
pub(super) fn load_stats<A: Float>(
    src: &Array<A>,
    dst: &mut SharedMemory<A>,
    first: u32,
    end: u32,
    #[comptime] tile: u32,
) {
    if UNIT_POS_X < tile {
        let mut x = A::new(0.0);
        if first + UNIT_POS_X < end {
            x = src[(first + UNIT_POS_X) as usize];
        }
        dst[UNIT_POS_X as usize] = x;
    }
}

/// Row `row` of `src` (rows of `width`) in registers padded to `padded`, four to a
/// [`Quad`], times `factor`; zeros for a unit past the last row.
#[cube]
fn load_row<F: Float, A: Float>(
    src: &Array<F>,
    row: u32,
    live: bool,
    factor: A,
    width: u32,
    #[comptime] padded: u32,
) -> Array<Quad<A>> {
    let mut r = Array::<Quad<A>>::new((padded / 4) as usize);
    #[unroll]
    for c4 in 0..padded / 4 {
        let mut x = Quad::<A>::new(A::new(0.0));
        #[unroll]
        for lane in 0..4u32 {
            let c = c4 * 4 + lane;
            if live && c < width {
                x[lane as usize] = A::cast_from(src[(row * width + c) as usize]) * factor;
            }
        }
        r[c4 as usize] = x;
    }
    r
}

/// `padded / 4` zero [`Quad`]s: an accumulator row.
#[cube]
fn zero_row<A: Float>(#[comptime] padded: u32) -> Array<Quad<A>> {
    let mut r = Array::<Quad<A>>::new((padded / 4) as usize);
    #[unroll]
    for c4 in 0..padded / 4 {
        r[c4 as usize] = Quad::<A>::new(A::new(0.0));
    }
    r
}

/// `Σ_c row_c · tile_c` over the `width` elements of the tile's row starting at quad
/// `at`. Lane `l` of the running [`Quad`] sums the elements `c ≡ l (mod 4)`: four
/// independent chains (one would make each unit wait out the FMA latency `width`
/// times), added pairwise at the end. A quad is one 16-byte shared-memory load, which
/// every unit of a warp reads at once (a broadcast): a load per four FMAs, not per one.
#[cube]
fn dot<A: Float>(
    row: &Array<Quad<A>>,
    tile: &SharedMemory<Quad<A>>,
    at: u32,
    #[comptime] width: u32,
) -> A {
    let mut s = Quad::<A>::new(A::new(0.0));
    #[unroll]
    for c4 in 0..width / 4 {
        s += row[c4 as usize] * tile[(at + c4) as usize];
    }
    (s[0usize] + s[1usize]) + (s[2usize] + s[3usize])
}

/// `acc += w · tile[at..]` over the `width` elements of the tile's row starting at quad
/// `at`.
#[cube]
fn add_scaled<A: Float>(
    acc: &mut Array<Quad<A>>,
    w: A,
    tile: &SharedMemory<Quad<A>>,
    at: u32,
    #[comptime] width: u32,
) {
    let ws = Quad::<A>::new(w);
    #[unroll]
    for c4 in 0..width / 4 {
        acc[c4 as usize] += ws * tile[(at + c4) as usize];
    }
}

/// Writes `acc · factor` (padded to `padded`) as row `row` of `dst` (rows of `width`).
#[cube]
fn store_row<F: Float, A: Float>(
    dst: &mut Array<F>,
    acc: &Array<Quad<A>>,
    row: u32,
    factor: A,
    width: u32,
    #[comptime] padded: u32,
) {
    #[unroll]
    for c4 in 0..padded / 4 {
        let x = acc[c4 as usize];
        #[unroll]
        for lane in 0..4u32 {
            let c = c4 * 4 + lane;
            if c < width {
                dst[(row * width + c) as usize] = F::cast_from(x[lane as usize] * factor);
            }
        }
    }
}

/// The forward pass of [`TILE_ROWS`] query rows: each row's log-sum-exp over the keys it
/// sees (−∞ when it sees none) and with `with_values` its output `Σ_j p_ij v_j`. A key
/// whose score is −∞ adds nothing (as on the CPU); a NaN score makes the row NaN.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn flash_forward<F: Float, A: Float + CubeElement>(
    q: &Array<F>,
    k: &Array<F>,
    v: &Array<F>,
    out: &mut Array<F>,
    lse: &mut Array<A>,
    meta: &Array<u32>,
    seed: &Array<u32>,
    own_lo: u32,
    own_hi: u32,
    threshold: u32,
    keep: A,
    scale: A,
    neg_inf: A,
    #[comptime] e: u32,
    #[comptime] ev: u32,
    #[comptime] tile: u32,
    #[comptime] with_values: bool,
    #[comptime] dropout: bool,
) {
    let (tq, tk) = (meta[1], meta[2]);
    let causal = meta[3] == 1;
    let (we, wv) = (meta[4], meta[5]);
    let blocks = (tq + TILE_ROWS - 1) / TILE_ROWS;
    let b = cube_index() / blocks;
    // Whole cubes leave together, before any barrier.
    if b < meta[0] {
        let i0 = (cube_index() % blocks) * TILE_ROWS;
        let i = i0 + UNIT_POS_X;
        let live = i < tq;
        let row = b * tq + i;
        let key = key_of(seed, own_lo, own_hi, dropout);
        let qr = load_row::<F, A>(q, row, live, scale, we, e);
        let mut o = zero_row::<A>(ev);
        let mut m = neg_inf;
        let mut l = A::new(0.0);
        let mut keys = tk;
        if causal {
            keys = min(tk, i0 + TILE_ROWS);
        }
        let mut ks = SharedMemory::<Quad<A>>::new((tile * e / 4) as usize);
        let mut vs = SharedMemory::<Quad<A>>::new((tile * ev / 4) as usize);
        let mut j0 = 0u32;
        while j0 < keys {
            load_tile::<F, A>(k, &mut ks, b * tk + j0, b * tk + tk, we, tile, e);
            if with_values {
                load_tile::<F, A>(v, &mut vs, b * tk + j0, b * tk + tk, wv, tile, ev);
            }
            sync_cube();
            for jj in 0..tile {
                let j = j0 + jj;
                if j < tk && (!causal || j <= i) {
                    let s = dot::<A>(&qr, &ks, jj * e / 4, e);
                    if s > m {
                        // The maximum grows: what was summed so far is rescaled to it.
                        let alpha = (m - s).exp();
                        l *= alpha;
                        let alphas = Quad::<A>::new(alpha);
                        #[unroll]
                        for c4 in 0..ev / 4 {
                            o[c4 as usize] *= alphas;
                        }
                        m = s;
                    }
                    if s > neg_inf {
                        let p = (s - m).exp();
                        l += p;
                        if with_values {
                            let mut w = p;
                            if dropout {
                                w *= dropout_factor::<A>(key, threshold, row * tk + j, keep);
                            }
                            add_scaled::<A>(&mut o, w, &vs, jj * ev / 4, ev);
                        }
                    } else if nan::<A>(s) {
                        l = s;
                    }
                }
            }
            sync_cube();
            j0 += tile;
        }
        if live {
            let mut row_lse = neg_inf;
            let mut inv = A::new(0.0);
            if l > A::new(0.0) || nan::<A>(l) {
                row_lse = m + l.ln();
                inv = A::new(1.0) / l;
            }
            lse[row as usize] = row_lse;
            if with_values {
                store_row::<F, A>(out, &o, row, inv, wv, ev);
            }
        }
    }
}

/// `dq_i = scale · Σ_j p_ij (g_i·v_j − delta_i) k_j` for [`TILE_ROWS`] query rows, keys
/// and values streamed.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn flash_grad_q<F: Float, A: Float + CubeElement>(
    q: &Array<F>,
    k: &Array<F>,
    v: &Array<F>,
    g: &Array<F>,
    lse: &Array<A>,
    delta: &Array<A>,
    dq: &mut Array<F>,
    meta: &Array<u32>,
    seed: &Array<u32>,
    own_lo: u32,
    own_hi: u32,
    threshold: u32,
    keep: A,
    scale: A,
    #[comptime] e: u32,
    #[comptime] ev: u32,
    #[comptime] tile: u32,
    #[comptime] dropout: bool,
) {
    let (tq, tk) = (meta[1], meta[2]);
    let causal = meta[3] == 1;
    let (we, wv) = (meta[4], meta[5]);
    let blocks = (tq + TILE_ROWS - 1) / TILE_ROWS;
    let b = cube_index() / blocks;
    if b < meta[0] {
        let i0 = (cube_index() % blocks) * TILE_ROWS;
        let i = i0 + UNIT_POS_X;
        let live = i < tq;
        let row = b * tq + i;
        let key = key_of(seed, own_lo, own_hi, dropout);
        let qr = load_row::<F, A>(q, row, live, scale, we, e);
        let gr = load_row::<F, A>(g, row, live, A::new(1.0), wv, ev);
        let mut row_lse = A::new(0.0);
        let mut row_delta = A::new(0.0);
        if live {
            row_lse = lse[row as usize];
            row_delta = delta[row as usize];
        }
        let mut acc = zero_row::<A>(e);
        let mut keys = tk;
        if causal {
            keys = min(tk, i0 + TILE_ROWS);
        }
        let mut ks = SharedMemory::<Quad<A>>::new((tile * e / 4) as usize);
        let mut vs = SharedMemory::<Quad<A>>::new((tile * ev / 4) as usize);
        let mut j0 = 0u32;
        while j0 < keys {
            load_tile::<F, A>(k, &mut ks, b * tk + j0, b * tk + tk, we, tile, e);
            load_tile::<F, A>(v, &mut vs, b * tk + j0, b * tk + tk, wv, tile, ev);
            sync_cube();
            for jj in 0..tile {
                let j = j0 + jj;
                if j < tk && (!causal || j <= i) {
                    let p = (dot::<A>(&qr, &ks, jj * e / 4, e) - row_lse).exp();
                    let mut dp = dot::<A>(&gr, &vs, jj * ev / 4, ev);
                    if dropout {
                        dp *= dropout_factor::<A>(key, threshold, row * tk + j, keep);
                    }
                    add_scaled::<A>(&mut acc, p * (dp - row_delta), &ks, jj * e / 4, e);
                }
            }
            sync_cube();
            j0 += tile;
        }
        if live {
            store_row::<F, A>(dq, &acc, row, scale, we, e);
        }
    }
}

/// For [`TILE_ROWS`] key rows, `dk_j = scale · Σ_i p_ij (g_i·v_j − delta_i) q_i`
/// (`values` false) or `dv_j = Σ_i p_ij g_i` (true), queries and the output's gradient
/// streamed.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn flash_grad_kv<F: Float, A: Float + CubeElement>(
    q: &Array<F>,
    k: &Array<F>,
    v: &Array<F>,
    g: &Array<F>,
    lse: &Array<A>,
    delta: &Array<A>,
    grad: &mut Array<F>,
    meta: &Array<u32>,
    seed: &Array<u32>,
    own_lo: u32,
    own_hi: u32,
    threshold: u32,
    keep: A,
    scale: A,
    #[comptime] e: u32,
    #[comptime] ev: u32,
    #[comptime] tile: u32,
    #[comptime] values: bool,
    #[comptime] dropout: bool,
) {
    let (tq, tk) = (meta[1], meta[2]);
    let causal = meta[3] == 1;
    let (we, wv) = (meta[4], meta[5]);
    let blocks = (tk + TILE_ROWS - 1) / TILE_ROWS;
    let b = cube_index() / blocks;
    if b < meta[0] {
        let j0 = (cube_index() % blocks) * TILE_ROWS;
        let j = j0 + UNIT_POS_X;
        let live = j < tk;
        let row = b * tk + j;
        let key = key_of(seed, own_lo, own_hi, dropout);
        let kr = load_row::<F, A>(k, row, live, scale, we, e);
        let width = comptime!(if values { ev } else { e });
        // Unused for `dv` (the compiler drops the loads).
        let vr = load_row::<F, A>(v, row, live, A::new(1.0), wv, ev);
        let mut acc = zero_row::<A>(width);
        let mut qs = SharedMemory::<Quad<A>>::new((tile * e / 4) as usize);
        let mut gs = SharedMemory::<Quad<A>>::new((tile * ev / 4) as usize);
        let mut ls = SharedMemory::<A>::new(tile as usize);
        let mut ds = SharedMemory::<A>::new(tile as usize);
        // Causal: the cube's first key is seen from its own row on.
        let mut i0 = 0u32;
        if causal {
            i0 = j0;
        }
        while i0 < tq {
            load_tile::<F, A>(q, &mut qs, b * tq + i0, b * tq + tq, we, tile, e);
            load_tile::<F, A>(g, &mut gs, b * tq + i0, b * tq + tq, wv, tile, ev);
            load_stats::<A>(lse, &mut ls, b * tq + i0, b * tq + tq, tile);
            if !values {
                load_stats::<A>(delta, &mut ds, b * tq + i0, b * tq + tq, tile);
            }
            sync_cube();
            for ii in 0..tile {
                let i = i0 + ii;
                if i < tq && (!causal || j <= i) {
                    let p = (dot::<A>(&kr, &qs, ii * e / 4, e) - ls[ii as usize]).exp();
                    let mut z = A::new(1.0);
                    if dropout {
                        z = dropout_factor::<A>(key, threshold, (b * tq + i) * tk + j, keep);
                    }
                    if values {
                        add_scaled::<A>(&mut acc, p * z, &gs, ii * ev / 4, ev);
                    } else {
                        let dp = z * dot::<A>(&vr, &gs, ii * ev / 4, ev);
                        add_scaled::<A>(&mut acc, p * (dp - ds[ii as usize]), &qs, ii * e / 4, e);
                    }
                }
            }
            sync_cube();
            i0 += tile;
        }
        if live {
            let mut factor = scale;
            if values {
                factor = A::new(1.0);
            }
            let mut stored = we;
            if values {
                stored = wv;
            }
            store_row::<F, A>(grad, &acc, row, factor, stored, width);
        }
    }
}
