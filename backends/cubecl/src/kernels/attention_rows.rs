//! Attention's per-row kernels, for heads wider than the tiled kernels take
//! ([`super::attention::MAX_TILED_WIDTH`]): one unit per query row for the forward
//! pass, the row log-sum-exp and `dq`, one unit per key row for `dk` and `dv`. A unit
//! walks the keys (or queries) it pairs with in global memory, recomputing each score
//! from `q` and `k`, so no `Tq×Tk` matrix is written; its running sums of a row live in
//! an f32 (f64) scratch row of global memory, cast into the result's dtype at the end.
//! The math is `kiln_tensor::attention`'s, dropout's factors drawn as the tiled kernels
//! draw them ([`super::attention`]). Inputs are contiguous `[batch·T, width]` rows.
//!
//! Metadata: `[rows, tq, tk, e, ev, causal]` (rows: the units' row count).

use super::attention::key_of;
use super::common::linear_pos;
use super::random::dropout_factor;
use cubecl::prelude::*;

/// `scale · q_i·k_j` over width `e`, `q_row` and `k_row` the global rows.
#[cube]
fn score<F: Float, A: Float>(
    q: &Array<F>,
    k: &Array<F>,
    q_row: u32,
    k_row: u32,
    e: u32,
    scale: A,
) -> A {
    let mut dot = A::new(0.0);
    for c in 0..e {
        dot +=
            A::cast_from(q[(q_row * e + c) as usize]) * A::cast_from(k[(k_row * e + c) as usize]);
    }
    dot * scale
}

/// Each query's log-sum-exp of its scores over the keys it sees (`neg_inf` when none),
/// and with `with_values` its output `Σ_j p_ij v_j` (accumulated in `acc`).
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn attention_rows<F: Float, A: Float + CubeElement>(
    q: &Array<F>,
    k: &Array<F>,
    v: &Array<F>,
    out: &mut Array<F>,
    lse: &mut Array<A>,
    acc: &mut Array<A>,
    meta: &Array<u32>,
    seed: &Array<u32>,
    own_lo: u32,
    own_hi: u32,
    threshold: u32,
    keep: A,
    scale: A,
    neg_inf: A,
    #[comptime] with_values: bool,
    #[comptime] dropout: bool,
) {
    let pos = linear_pos();
    if pos < meta[0] {
        let (tq, tk, e, ev) = (meta[1], meta[2], meta[3], meta[4]);
        let b = pos / tq;
        let i = pos % tq;
        let mut keys = tk;
        if meta[5] == 1 {
            keys = i + 1;
        }
        // The running maximum and the sum of exp(s − max).
        let mut m = neg_inf;
        let mut l = A::new(0.0);
        for j in 0..keys {
            let s = score::<F, A>(q, k, pos, b * tk + j, e, scale);
            if j == 0 {
                m = s;
                l = A::new(1.0);
            } else if s > m {
                l = l * (m - s).exp() + A::new(1.0);
                m = s;
            } else {
                l += (s - m).exp();
            }
        }
        let mut row_lse = neg_inf;
        if keys > 0 {
            row_lse = m + l.ln();
        }
        lse[pos as usize] = row_lse;
        if with_values {
            for c in 0..ev {
                acc[(pos * ev + c) as usize] = A::new(0.0);
            }
            let key = key_of(seed, own_lo, own_hi, dropout);
            for j in 0..keys {
                let mut p = (score::<F, A>(q, k, pos, b * tk + j, e, scale) - row_lse).exp();
                if dropout {
                    p *= dropout_factor::<A>(key, threshold, pos * tk + j, keep);
                }
                for c in 0..ev {
                    acc[(pos * ev + c) as usize] +=
                        p * A::cast_from(v[((b * tk + j) * ev + c) as usize]);
                }
            }
            for c in 0..ev {
                out[(pos * ev + c) as usize] = F::cast_from(acc[(pos * ev + c) as usize]);
            }
        }
    }
}

/// `p_ij·z` and `ds_ij = p_ij·(z·g_i·v_j − delta_i)` of query row `i_row` (global) and
/// key row `j_row` (global), `z` the weight's dropout factor (1 without).
#[cube]
#[allow(clippy::too_many_arguments)]
fn prob_and_ds<F: Float, A: Float>(
    q: &Array<F>,
    k: &Array<F>,
    v: &Array<F>,
    g: &Array<F>,
    lse: &Array<A>,
    delta: &Array<A>,
    i_row: u32,
    j_row: u32,
    e: u32,
    ev: u32,
    scale: A,
    z: A,
) -> (A, A) {
    let p = (score::<F, A>(q, k, i_row, j_row, e, scale) - lse[i_row as usize]).exp();
    let mut dp = A::new(0.0);
    for c in 0..ev {
        dp +=
            A::cast_from(g[(i_row * ev + c) as usize]) * A::cast_from(v[(j_row * ev + c) as usize]);
    }
    (p * z, p * (z * dp - delta[i_row as usize]))
}

/// `dq_i = scale · Σ_j ds_ij k_j`, one unit per query row.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn attention_grad_q<F: Float, A: Float + CubeElement>(
    q: &Array<F>,
    k: &Array<F>,
    v: &Array<F>,
    g: &Array<F>,
    lse: &Array<A>,
    delta: &Array<A>,
    dq: &mut Array<F>,
    acc: &mut Array<A>,
    meta: &Array<u32>,
    seed: &Array<u32>,
    own_lo: u32,
    own_hi: u32,
    threshold: u32,
    keep: A,
    scale: A,
    #[comptime] dropout: bool,
) {
    let pos = linear_pos();
    if pos < meta[0] {
        let (tq, tk, e, ev) = (meta[1], meta[2], meta[3], meta[4]);
        let b = pos / tq;
        let i = pos % tq;
        let mut keys = tk;
        if meta[5] == 1 {
            keys = i + 1;
        }
        for c in 0..e {
            acc[(pos * e + c) as usize] = A::new(0.0);
        }
        let key = key_of(seed, own_lo, own_hi, dropout);
        // A row that sees no keys has lse −∞ and no terms.
        for j in 0..keys {
            let mut z = A::new(1.0);
            if dropout {
                z = dropout_factor::<A>(key, threshold, pos * tk + j, keep);
            }
            let (_p, ds) =
                prob_and_ds::<F, A>(q, k, v, g, lse, delta, pos, b * tk + j, e, ev, scale, z);
            for c in 0..e {
                acc[(pos * e + c) as usize] +=
                    ds * A::cast_from(k[((b * tk + j) * e + c) as usize]);
            }
        }
        for c in 0..e {
            dq[(pos * e + c) as usize] = F::cast_from(acc[(pos * e + c) as usize] * scale);
        }
    }
}

/// `dk_j = scale · Σ_i ds_ij q_i` (`values` false) or `dv_j = Σ_i p_ij g_i` (true), one
/// unit per key row.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn attention_grad_kv<F: Float, A: Float + CubeElement>(
    q: &Array<F>,
    k: &Array<F>,
    v: &Array<F>,
    g: &Array<F>,
    lse: &Array<A>,
    delta: &Array<A>,
    grad: &mut Array<F>,
    acc: &mut Array<A>,
    meta: &Array<u32>,
    seed: &Array<u32>,
    own_lo: u32,
    own_hi: u32,
    threshold: u32,
    keep: A,
    scale: A,
    #[comptime] values: bool,
    #[comptime] dropout: bool,
) {
    let pos = linear_pos();
    if pos < meta[0] {
        let (tq, tk, e, ev) = (meta[1], meta[2], meta[3], meta[4]);
        let b = pos / tk;
        let j = pos % tk;
        let mut first = 0u32;
        if meta[5] == 1 {
            first = j;
        }
        let mut width = e;
        if values {
            width = ev;
        }
        for c in 0..width {
            acc[(pos * width + c) as usize] = A::new(0.0);
        }
        let key = key_of(seed, own_lo, own_hi, dropout);
        for i in first..tq {
            let i_row = b * tq + i;
            let mut z = A::new(1.0);
            if dropout {
                z = dropout_factor::<A>(key, threshold, i_row * tk + j, keep);
            }
            let (p, ds) = prob_and_ds::<F, A>(q, k, v, g, lse, delta, i_row, pos, e, ev, scale, z);
            for c in 0..width {
                if values {
                    acc[(pos * width + c) as usize] +=
                        p * A::cast_from(g[(i_row * ev + c) as usize]);
                } else {
                    acc[(pos * width + c) as usize] +=
                        ds * A::cast_from(q[(i_row * e + c) as usize]);
                }
            }
        }
        let mut factor = scale;
        if values {
            factor = A::new(1.0);
        }
        for c in 0..width {
            grad[(pos * width + c) as usize] =
                F::cast_from(acc[(pos * width + c) as usize] * factor);
        }
    }
}
