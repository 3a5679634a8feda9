//! Kiln's own batched matrix product for runtimes without a vendor library (wgpu):
//! 64×64 output tiles per cube of 256 units, each unit accumulating a 4×4 block
//! (rows `ty + 16i`, columns `tx + 16j`, so shared-memory reads and global writes are
//! consecutive across units), K in steps of 16 through shared memory. Operands are
//! read through their strides (transposed and broadcast operands need no copy);
//! accumulation is in `A`. Where the output has too few tiles to fill the GPU (a
//! batch-1 product, a 10-column classifier), K is split into ranges, one cube per tile
//! and range, each writing its partial sums in `A`; [`sum_splits()`] then adds them in
//! order of the range, so the result does not depend on scheduling.
//!
//! Metadata: `[M, N, K, batch dims (br), a offset, a row stride, a k stride, a batch
//! strides (br), b offset, b k stride, b column stride, b batch strides (br)]`.

use super::common::{linear_pos, offset_of};
use cubecl::prelude::*;

/// Tile edge (rows and columns of output per cube).
pub const TILE: u32 = 64;
/// Depth of one K step.
pub const DEPTH: u32 = 16;

/// One 64×64 tile of `out[b] = a[b] · b[b]`, over K range `CUBE_POS_Z % splits`
/// (`split_len` deep, a multiple of [`DEPTH`]) for batch `CUBE_POS_Z / splits +
/// batch_base`. Unsplit (`splits` 1) `out` is the result (`O` = `F`); split, it holds
/// the partial sums (`O` = `A`), range after range, each `batches × M × N`.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn matmul<F: Float, A: Float, O: Float>(
    a: &Array<F>,
    b: &Array<F>,
    out: &mut Array<O>,
    meta: &Array<u32>,
    batch_base: u32,
    splits: u32,
    split_len: u32,
    #[comptime] br: u32,
) {
    let m = meta[0];
    let n = meta[1];
    let k = meta[2];
    let a_at = 3 + br;
    let b_at = a_at + 3 + br;
    let split = CUBE_POS_Z % splits;
    let local_batch = CUBE_POS_Z / splits;
    let batch = local_batch + batch_base;
    let a_base = meta[a_at as usize] + offset_of(meta, batch, 3, a_at + 3, br);
    let b_base = meta[b_at as usize] + offset_of(meta, batch, 3, b_at + 3, br);
    let (a_sm, a_sk) = (meta[(a_at + 1) as usize], meta[(a_at + 2) as usize]);
    let (b_sk, b_sn) = (meta[(b_at + 1) as usize], meta[(b_at + 2) as usize]);
    let k_begin = split * split_len;
    let k_end = select(k - k_begin < split_len, k, k_begin + split_len);
    let (a_along_k, b_along_k) = (a_sk == 1, b_sk == 1 && b_sn != 1);
    let tx = UNIT_POS_X % 16;
    let ty = UNIT_POS_X / 16;
    let row0 = CUBE_POS_Y * 64;
    let col0 = CUBE_POS_X * 64;

    let mut sa = SharedMemory::<A>::new(1024usize);
    let mut sb = SharedMemory::<A>::new(1024usize);
    let mut acc = Array::<A>::new(16usize);
    #[unroll]
    for i in 0..16u32 {
        acc[i as usize] = A::new(0.0);
    }
    // The next step's tiles are loaded into registers while this step's are multiplied
    // out of shared memory, so a cube's global loads overlap its arithmetic.
    let mut ra = Array::<A>::new(4usize);
    let mut rb = Array::<A>::new(4usize);
    let at = (a_base, a_sm, a_sk, b_base, b_sk, b_sn);
    load_step::<F, A>(a, b, &mut ra, &mut rb, at, m, n, row0, col0, k_begin, k_end);
    let mut k0 = k_begin;
    while k0 < k_end {
        #[unroll]
        for l in 0..4u32 {
            // Shared A is k-major (16 k × 64 rows) and B row-major (16 k × 64 columns),
            // where `load_step` took each element from.
            let idx = UNIT_POS_X + l * 256;
            let (kk, r) = tile_coords(idx, a_along_k);
            sa[(kk * 64 + r) as usize] = ra[l as usize];
            let (kb, cb) = tile_coords(idx, b_along_k);
            sb[(kb * 64 + cb) as usize] = rb[l as usize];
        }
        sync_cube();
        let next = k0 + 16;
        load_step::<F, A>(a, b, &mut ra, &mut rb, at, m, n, row0, col0, next, k_end);
        #[unroll]
        for kk in 0..16u32 {
            #[unroll]
            for i in 0..4u32 {
                let av = sa[(kk * 64 + ty + 16 * i) as usize];
                #[unroll]
                for j in 0..4u32 {
                    let bv = sb[(kk * 64 + tx + 16 * j) as usize];
                    acc[(i * 4 + j) as usize] += av * bv;
                }
            }
        }
        sync_cube();
        k0 = next;
    }
    // Unsplit, the result's batch; split, this range's partial sums of the launch's
    // batches (`CUBE_COUNT_Z / splits` of them).
    let out_base = select(
        splits == 1,
        batch * m * n,
        (split * (CUBE_COUNT_Z / splits) + local_batch) * m * n,
    );
    #[unroll]
    for i in 0..4u32 {
        #[unroll]
        for j in 0..4u32 {
            let r = row0 + ty + 16 * i;
            let c = col0 + tx + 16 * j;
            if r < m && c < n {
                out[(out_base + r * n + c) as usize] = O::cast_from(acc[(i * 4 + j) as usize]);
            }
        }
    }
}

/// This unit's four elements of the A tile (64 rows × 16 k) and of the B tile (16 k ×
/// 64 columns) at K step `k0`, for `idx = UNIT_POS_X + 256 l`; zeros past the matrix or
/// `k_end`. Neighbouring units read neighbouring elements of memory: along k where an
/// operand's k stride is 1 (a row-major `a`, a transposed `b`), across rows or columns
/// otherwise. `at` is `(a base, a row stride, a k stride, b base, b k stride, b column
/// stride)`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_step<F: Float, A: Float>(
    a: &Array<F>,
    b: &Array<F>,
    ra: &mut Array<A>,
    rb: &mut Array<A>,
    at: (u32, u32, u32, u32, u32, u32),
    m: u32,
    n: u32,
    row0: u32,
    col0: u32,
    k0: u32,
    k_end: u32,
) {
    let (a_base, a_sm, a_sk, b_base, b_sk, b_sn) = at;
    let (a_along_k, b_along_k) = (a_sk == 1, b_sk == 1 && b_sn != 1);
    #[unroll]
    for l in 0..4u32 {
        let idx = UNIT_POS_X + l * 256;
        let (kk, r) = tile_coords(idx, a_along_k);
        let mut va = A::new(0.0);
        if row0 + r < m && k0 + kk < k_end {
            va = A::cast_from(a[(a_base + (row0 + r) * a_sm + (k0 + kk) * a_sk) as usize]);
        }
        ra[l as usize] = va;
        let (kb, cb) = tile_coords(idx, b_along_k);
        let mut vb = A::new(0.0);
        if k0 + kb < k_end && col0 + cb < n {
            vb = A::cast_from(b[(b_base + (k0 + kb) * b_sk + (col0 + cb) * b_sn) as usize]);
        }
        rb[l as usize] = vb;
    }
}

/// Where element `idx` of a tile 16 deep and 64 wide sits, `(k, row or column)`: k
/// varying fastest across neighbouring units when `along_k`, the other otherwise.
#[cube]
fn tile_coords(idx: u32, along_k: bool) -> (u32, u32) {
    (
        select(along_k, idx % 16, idx / 64),
        select(along_k, idx / 16, idx % 64),
    )
}

/// `out[out_base + i] = Σ_s partials[s * len + i]` for `i < len`, the ranges added
/// in order: the split tiled product's second pass.
#[cube(launch_unchecked)]
pub fn sum_splits<F: Float, A: Float>(
    partials: &Array<A>,
    out: &mut Array<F>,
    len: u32,
    splits: u32,
    out_base: u32,
) {
    let i = linear_pos();
    if i < len {
        let mut total = partials[i as usize];
        for s in 1..splits {
            total += partials[(s * len + i) as usize];
        }
        out[(out_base + i) as usize] = F::cast_from(total);
    }
}

/// Rows of output per unit of [`matmul_direct()`].
pub const DIRECT_ROWS: u32 = 8;
/// Units (columns) per cube of [`matmul_direct()`].
pub const DIRECT_COLS: u32 = 64;

/// The matrix product for CPU adapters (Mesa's lavapipe): no shared memory and no
/// barriers, which a CPU driver runs by switching between the invocations of a
/// workgroup. Each unit owns one column and [`DIRECT_ROWS`] rows of the output and
/// walks K directly in global memory; neighbouring units read neighbouring columns of
/// `b` and the same elements of `a`. Same metadata as [`matmul()`]; accumulation in `A`
/// in the order of K, like the tiled kernel.
#[cube(launch_unchecked)]
pub fn matmul_direct<F: Float, A: Float>(
    a: &Array<F>,
    b: &Array<F>,
    out: &mut Array<F>,
    meta: &Array<u32>,
    batch_base: u32,
    #[comptime] br: u32,
) {
    let m = meta[0];
    let n = meta[1];
    let k = meta[2];
    let a_at = 3 + br;
    let b_at = a_at + 3 + br;
    let batch = CUBE_POS_Z + batch_base;
    let a_base = meta[a_at as usize] + offset_of(meta, batch, 3, a_at + 3, br);
    let b_base = meta[b_at as usize] + offset_of(meta, batch, 3, b_at + 3, br);
    let (a_sm, a_sk) = (meta[(a_at + 1) as usize], meta[(a_at + 2) as usize]);
    let (b_sk, b_sn) = (meta[(b_at + 1) as usize], meta[(b_at + 2) as usize]);
    let col = CUBE_POS_X * DIRECT_COLS + UNIT_POS_X;
    let row0 = CUBE_POS_Y * DIRECT_ROWS;
    // Out-of-range units compute a clamped copy and write nothing.
    let c = select(col < n, col, n - 1);
    let mut a_row = Array::<u32>::new(DIRECT_ROWS as usize);
    let mut acc = Array::<A>::new(DIRECT_ROWS as usize);
    #[unroll]
    for i in 0..DIRECT_ROWS {
        let r = select(row0 + i < m, row0 + i, m - 1);
        a_row[i as usize] = a_base + r * a_sm;
        acc[i as usize] = A::new(0.0);
    }
    let mut b_off = b_base + c * b_sn;
    let mut a_k = 0u32;
    for _ in 0..k {
        let bv = A::cast_from(b[b_off as usize]);
        #[unroll]
        for i in 0..DIRECT_ROWS {
            acc[i as usize] += A::cast_from(a[(a_row[i as usize] + a_k) as usize]) * bv;
        }
        b_off += b_sk;
        a_k += a_sk;
    }
    let out_base = batch * m * n;
    if col < n {
        #[unroll]
        for i in 0..DIRECT_ROWS {
            if row0 + i < m {
                out[(out_base + (row0 + i) * n + col) as usize] = F::cast_from(acc[i as usize]);
            }
        }
    }
}
