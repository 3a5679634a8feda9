//! Kiln's own batched matrix product for runtimes without a vendor library (wgpu):
//! 64×64 output tiles per cube of 256 units, each unit accumulating a 4×4 block
//! (rows `ty + 16i`, columns `tx + 16j`, so shared-memory reads and global writes are
//! consecutive across units), K in steps of 16 through shared memory. Operands are
//! read through their strides (transposed and broadcast operands need no copy);
//! accumulation is in `A`.
//!
//! Metadata: `[M, N, K, batch dims (br), a offset, a row stride, a k stride, a batch
//! strides (br), b offset, b k stride, b column stride, b batch strides (br)]`.

use super::common::offset_of;
use cubecl::prelude::*;

/// Tile edge (rows and columns of output per cube).
pub const TILE: u32 = 64;
/// Depth of one K step.
pub const DEPTH: u32 = 16;

/// One 64×64 tile of `out[b] = a[b] · b[b]` for batch `CUBE_POS_Z + batch_base`.
#[cube(launch_unchecked)]
pub fn matmul<F: Float, A: Float>(
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
    let mut k0 = 0u32;
    while k0 < k {
        #[unroll]
        for l in 0..4u32 {
            let idx = UNIT_POS_X + l * 256;
            // A tile: 64 rows × 16 k, stored k-major.
            let r = idx / 16;
            let kk = idx % 16;
            let mut va = A::new(0.0);
            if row0 + r < m && k0 + kk < k {
                va = A::cast_from(a[(a_base + (row0 + r) * a_sm + (k0 + kk) * a_sk) as usize]);
            }
            sa[(kk * 64 + r) as usize] = va;
            // B tile: 16 k × 64 columns.
            let kb = idx / 64;
            let cb = idx % 64;
            let mut vb = A::new(0.0);
            if k0 + kb < k && col0 + cb < n {
                vb = A::cast_from(b[(b_base + (k0 + kb) * b_sk + (col0 + cb) * b_sn) as usize]);
            }
            sb[(kb * 64 + cb) as usize] = vb;
        }
        sync_cube();
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
        k0 += 16;
    }
    let out_base = batch * m * n;
    #[unroll]
    for i in 0..4u32 {
        #[unroll]
        for j in 0..4u32 {
            let r = row0 + ty + 16 * i;
            let c = col0 + tx + 16 * j;
            if r < m && c < n {
                out[(out_base + r * n + c) as usize] = F::cast_from(acc[(i * 4 + j) as usize]);
            }
        }
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
