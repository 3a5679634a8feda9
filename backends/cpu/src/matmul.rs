//! Batched matrix products over strided views: one GEMM call per batch element, the
//! strides (transposes, broadcast batches) resolved by the GEMM's packing.

use crate::gemm::{dgemm, sgemm, sgemm_with, GemmInput, GemmOptions, MatRef};
use crate::storage::CpuStorage;
use half::{bf16, f16};
use kiln_tensor::{Dims, Layout, Result};
use rayon::prelude::*;

/// Multiply-adds below which a product of a batch runs on one thread.
const SMALL_PRODUCT: usize = 1 << 24;

/// The batch offsets of a view: the storage offset of each matrix, row-major over the
/// batch dims.
fn batch_offsets(l: &Layout) -> Vec<usize> {
    let r = l.rank();
    let batch = Layout::from_parts(
        Dims::new(&l.dims()[..r - 2]).expect("rank fits"),
        &l.strides()[..r - 2],
        l.offset(),
    );
    let mut v = Vec::with_capacity(batch.numel());
    batch.for_each_offset(|o| v.push(o));
    v
}

/// The storage offset of matrix number `i` of a view (row-major over the batch dims),
/// computed where it is needed rather than listed.
fn batch_offset(l: &Layout, i: usize) -> usize {
    let r = l.rank();
    let (dims, strides) = (l.dims().as_slice(), l.strides());
    let mut rest = i;
    let mut at = l.offset();
    for axis in (0..r - 2).rev() {
        at += (rest % dims[axis]) * strides[axis];
        rest /= dims[axis];
    }
    at
}

fn mat<'a, T>(data: &'a [T], l: &Layout, offset: usize) -> MatRef<'a, T> {
    let r = l.rank();
    MatRef {
        data,
        offset,
        row_stride: l.strides()[r - 2],
        col_stride: l.strides()[r - 1],
    }
}

/// `[.., M, K] × [.., K, N]` with identical batch dims.
pub fn matmul(a: &CpuStorage, la: &Layout, b: &CpuStorage, lb: &Layout) -> Result<CpuStorage> {
    let r = la.rank();
    let (m, k, n) = (la.dims()[r - 2], la.dims()[r - 1], lb.dims()[r - 1]);
    let (oa, ob) = (batch_offsets(la), batch_offsets(lb));
    fn f32_out<A: GemmInput, B: GemmInput>(
        a: &[A],
        la: &Layout,
        oa: &[usize],
        b: &[B],
        lb: &Layout,
        ob: &[usize],
        mkn: [usize; 3],
    ) -> Vec<f32> {
        let [m, _, n] = mkn;
        let mut c = vec![0f32; oa.len() * m * n];
        let (oa, ob) = (|i: usize| oa[i], |i: usize| ob[i]);
        f32_into(a, la, &oa, b, lb, &ob, mkn, &mut c);
        c
    }
    let mkn = [m, k, n];
    Ok(match (a, b) {
        (CpuStorage::F32(x), CpuStorage::F32(y)) => {
            CpuStorage::F32(f32_out(x, la, &oa, y, lb, &ob, mkn).into())
        }
        (CpuStorage::F16(x), CpuStorage::F16(y)) => CpuStorage::F16(
            f32_out(x, la, &oa, y, lb, &ob, mkn)
                .into_iter()
                .map(f16::from_f32)
                .collect(),
        ),
        (CpuStorage::BF16(x), CpuStorage::BF16(y)) => CpuStorage::BF16(
            f32_out(x, la, &oa, y, lb, &ob, mkn)
                .into_iter()
                .map(bf16::from_f32)
                .collect(),
        ),
        (CpuStorage::F64(x), CpuStorage::F64(y)) => {
            let mut c = vec![0f64; oa.len() * m * n];
            if m * n > 0 {
                for (i, cm) in c.chunks_mut(m * n).enumerate() {
                    dgemm(m, n, k, mat(x, la, oa[i]), mat(y, lb, ob[i]), cm, false);
                }
            }
            CpuStorage::F64(c.into())
        }
        _ => return Err(crate::elementwise::unsupported("matmul", a)),
    })
}

/// The products of `a` and `b` (strided views as [`matmul`] takes them) into `c`.
#[allow(clippy::too_many_arguments)]
fn f32_into<A: GemmInput, B: GemmInput>(
    a: &[A],
    la: &Layout,
    oa: &(dyn Fn(usize) -> usize + Sync),
    b: &[B],
    lb: &Layout,
    ob: &(dyn Fn(usize) -> usize + Sync),
    mkn: [usize; 3],
    c: &mut [f32],
) {
    let [m, k, n] = mkn;
    if m * n == 0 {
        return;
    }
    // Many small products (conv as a batched matmul, attention heads): one thread per
    // product beats splitting each small product across threads.
    let per = m * n * k;
    if c.len() / (m * n) >= rayon::current_num_threads() && per < SMALL_PRODUCT {
        let single = GemmOptions {
            threads: Some(1),
            ..GemmOptions::default()
        };
        c.par_chunks_mut(m * n).enumerate().for_each(|(i, cm)| {
            sgemm_with(
                &single,
                m,
                n,
                k,
                mat(a, la, oa(i)),
                mat(b, lb, ob(i)),
                cm,
                false,
            );
        });
    } else {
        for (i, cm) in c.chunks_mut(m * n).enumerate() {
            sgemm(m, n, k, mat(a, la, oa(i)), mat(b, lb, ob(i)), cm, false);
        }
    }
}

/// An f32 product `[.., M, K] × [.., K, N]` written into the first elements of `c`
/// (which must hold them); `false` when the inputs are not both f32. Each matrix's
/// offset is computed where it is needed: a steady-state step allocates nothing.
pub fn matmul_f32_into(
    a: &CpuStorage,
    la: &Layout,
    b: &CpuStorage,
    lb: &Layout,
    c: &mut [f32],
) -> bool {
    let (CpuStorage::F32(x), CpuStorage::F32(y)) = (a, b) else {
        return false;
    };
    let (mkn, len) = product_sizes(la, lb);
    let (oa, ob) = (|i| batch_offset(la, i), |i| batch_offset(lb, i));
    f32_into(x, la, &oa, y, lb, &ob, mkn, &mut c[..len]);
    true
}

/// `[M, K, N]` of the product of views `la` and `lb`, and its element count.
fn product_sizes(la: &Layout, lb: &Layout) -> ([usize; 3], usize) {
    let r = la.rank();
    let mkn = [la.dims()[r - 2], la.dims()[r - 1], lb.dims()[r - 1]];
    let len = la.dims().as_slice()[..r - 2].iter().product::<usize>() * mkn[0] * mkn[2];
    (mkn, len)
}

thread_local! {
    /// The f32 products of bf16 operands before they are rounded into their buffer,
    /// kept between calls so that a steady-state step allocates nothing.
    static UNROUNDED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A bf16 product `[.., M, K] × [.., K, N]` written into the first elements of `c`
/// (which must hold them): computed in f32 (on the bf16 dot-product kernel where the
/// CPU has one) into this thread's buffer, then rounded as [`matmul`] rounds. `false`
/// when the inputs are not both bf16.
pub fn matmul_bf16_into(
    a: &CpuStorage,
    la: &Layout,
    b: &CpuStorage,
    lb: &Layout,
    c: &mut [bf16],
) -> bool {
    let (CpuStorage::BF16(x), CpuStorage::BF16(y)) = (a, b) else {
        return false;
    };
    let (mkn, len) = product_sizes(la, lb);
    let (oa, ob) = (|i| batch_offset(la, i), |i| batch_offset(lb, i));
    UNROUNDED.with(|buf| {
        let Ok(mut buf) = buf.try_borrow_mut() else {
            return false;
        };
        // Every element is written by the product: grow the buffer, never clear it.
        if buf.len() < len {
            buf.resize(len, 0.0);
        }
        let products = &mut buf[..len];
        f32_into(x, la, &oa, y, lb, &ob, mkn, products);
        c[..len]
            .par_chunks_mut(1 << 14)
            .zip(products.par_chunks(1 << 14))
            .for_each(|(c, v)| {
                kiln_tensor::simd::wide(
                    #[inline(always)]
                    || {
                        for (d, &v) in c.iter_mut().zip(v) {
                            *d = bf16::from_f32(v);
                        }
                    },
                )
            });
        true
    })
}
