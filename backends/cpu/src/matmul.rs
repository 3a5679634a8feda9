//! Batched matrix products over strided views: one GEMM call per batch element, the
//! strides (transposes, broadcast batches) resolved by the GEMM's packing.

use crate::conv::DisjointOut;
use crate::gemm::{
    dgemm, sgemm_finishing, sgemm_with, FinalBlock, Finish, GemmInput, GemmOptions, MatRef,
};
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
        f32_into(a, la, &oa, b, lb, &ob, mkn, &mut c, None);
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

/// What a batch of products hands on once values are final: the offset in `c` of the
/// product's matrix, and a block of it.
type FinishBatch<'a> = &'a (dyn Fn(usize, &FinalBlock<'_, f32>) + Sync);

/// The products of `a` and `b` (strided views as [`matmul`] takes them) into `c`,
/// handing each block of it to `finish` once final.
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
    finish: Option<FinishBatch<'_>>,
) {
    let [m, k, n] = mkn;
    if m * n == 0 {
        return;
    }
    let options = GemmOptions::default();
    // A batch of row blocks against one shared matrix (a linear layer over [B, T, K]
    // tokens): one tall product, so the shared matrix is packed once and the threads
    // split the rows, instead of one small product per batch element.
    if let Some(rows) = folded_rows(la, lb, m) {
        let a = MatRef {
            row_stride: la.strides()[la.rank() - 2],
            ..mat(a, la, oa(0))
        };
        let at_start = finish.map(|f| move |block: &FinalBlock<'_, f32>| f(0, block));
        let at_start = at_start.as_ref().map(|f| f as Finish<'_>);
        sgemm_finishing(
            &options,
            rows,
            n,
            k,
            a,
            mat(b, lb, ob(0)),
            c,
            false,
            at_start,
        );
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
            if let Some(f) = finish {
                f(i * m * n, &FinalBlock::whole(cm, m, n));
            }
        });
    } else {
        for (i, cm) in c.chunks_mut(m * n).enumerate() {
            let (a, b) = (mat(a, la, oa(i)), mat(b, lb, ob(i)));
            let at_product = finish.map(|f| move |block: &FinalBlock<'_, f32>| f(i * m * n, block));
            let at_product = at_product.as_ref().map(|f| f as Finish<'_>);
            sgemm_finishing(&options, m, n, k, a, b, cm, false, at_product);
        }
    }
}

/// The row count of the product as one `[rows, K] × [K, N]` product, when its batch
/// can fold into the rows: `b` is the same matrix for every batch element (broadcast
/// batch dims) and `a`'s batch dims continue its row stride (row blocks stacked in
/// storage). `None` for a single product or batches that do not fold.
fn folded_rows(la: &Layout, lb: &Layout, m: usize) -> Option<usize> {
    let r = la.rank();
    let (dims, a_strides, b_strides) = (la.dims().as_slice(), la.strides(), lb.strides());
    let batch: usize = dims[..r - 2].iter().product();
    if batch <= 1 {
        return None;
    }
    let mut next = a_strides[r - 2].checked_mul(m)?;
    for axis in (0..r - 2).rev() {
        if dims[axis] == 1 {
            continue;
        }
        if b_strides[axis] != 0 || a_strides[axis] != next || next == 0 {
            return None;
        }
        next = next.checked_mul(dims[axis])?;
    }
    Some(batch * m)
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
    f32_into(x, la, &oa, y, lb, &ob, mkn, &mut c[..len], None);
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
/// CPU has one) into this thread's buffer, each block rounded as [`matmul`] rounds by
/// the thread that finished it. `false` when the inputs are not both bf16.
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
        let (c, n) = (&mut c[..len], mkn[2]);
        // Each block of the products is rounded into `c` by the thread that computed
        // it, as soon as it is final (while it is in that core's cache).
        // The bf16 result, written block by block from the threads that finish the blocks.
        let out = DisjointOut(c.as_mut_ptr(), len);
        let round = |base: usize, block: &FinalBlock<'_, f32>| {
            for r in 0..block.rows {
                let at = base + (block.first_row + r) * n + block.first_col;
                let row = block.row(r);
                // SAFETY: the blocks of one product cover its matrix once and the
                // products' matrices lie apart, so no two calls write the same
                // elements; `at + cols <= len` is checked, and `c` outlives the call.
                let dst = unsafe { out.slice(at, row.len()) };
                kiln_tensor::simd::wide(
                    #[inline(always)]
                    || {
                        for (d, &v) in dst.iter_mut().zip(row) {
                            *d = bf16::from_f32(v);
                        }
                    },
                )
            }
        };
        f32_into(x, la, &oa, y, lb, &ob, mkn, products, Some(&round));
        true
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::sgemm;

    fn layout(dims: &[usize], strides: &[usize]) -> Layout {
        Layout::from_parts(Dims::new(dims).unwrap(), strides, 0)
    }

    #[test]
    fn only_stacked_rows_against_a_shared_matrix_fold() {
        let a = layout(&[2, 3, 5, 4], &[60, 20, 4, 1]);
        let shared = layout(&[2, 3, 4, 6], &[0, 0, 6, 1]);
        assert_eq!(folded_rows(&a, &shared, 5), Some(30));
        // A transposed shared matrix folds as well; its own strides are the GEMM's.
        let shared_t = layout(&[2, 3, 4, 6], &[0, 0, 1, 4]);
        assert_eq!(folded_rows(&a, &shared_t, 5), Some(30));
        // One matrix per batch element: nothing to share.
        let batched = layout(&[2, 3, 4, 6], &[72, 24, 6, 1]);
        assert_eq!(folded_rows(&a, &batched, 5), None);
        // Rows that do not continue across batch elements (a slice, permuted batch dims).
        let gapped = layout(&[2, 3, 5, 4], &[66, 22, 4, 1]);
        assert_eq!(folded_rows(&gapped, &shared, 5), None);
        let permuted = layout(&[3, 2, 5, 4], &[20, 60, 4, 1]);
        let shared32 = layout(&[3, 2, 4, 6], &[0, 0, 6, 1]);
        assert_eq!(folded_rows(&permuted, &shared32, 5), None);
        // Transposed rows (a column-major A) do not stack.
        let a_t = layout(&[2, 5, 4], &[20, 1, 5]);
        assert_eq!(folded_rows(&a_t, &layout(&[2, 4, 6], &[0, 6, 1]), 5), None);
        // Size-1 batch dims are skipped; a single product is not a batch.
        let a1 = layout(&[1, 3, 5, 4], &[999, 20, 4, 1]);
        let s1 = layout(&[1, 3, 4, 6], &[7, 0, 6, 1]);
        assert_eq!(folded_rows(&a1, &s1, 5), Some(15));
        assert_eq!(folded_rows(&layout(&[1, 5, 4], &[20, 4, 1]), &s1, 5), None);
    }

    /// The folded product against one product per batch element (bit for bit) and
    /// against an f64 reference, over sizes that cross the kernels' tiles.
    #[test]
    fn folded_products_are_the_per_batch_products() {
        for &(batch, m, k, n, transposed) in &[
            (3usize, 5usize, 7usize, 9usize, false),
            (4, 30, 70, 50, true),
            (32, 16, 128, 40, false),
            (2, 1, 33, 17, true),
        ] {
            let a: Vec<f32> = (0..batch * m * k)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
                .collect();
            let w: Vec<f32> = (0..k * n)
                .map(|i| ((i * 53 % 97) as f32 - 48.0) / 30.0)
                .collect();
            let la = Layout::contiguous(Dims::new(&[batch, m, k]).unwrap());
            // The weight as `[k, n]`, or as `[n, k]` read transposed, broadcast over the batch.
            let lb = if transposed {
                layout(&[batch, k, n], &[0, 1, k])
            } else {
                layout(&[batch, k, n], &[0, n, 1])
            };
            assert_eq!(folded_rows(&la, &lb, m), Some(batch * m));
            let (sa, sb) = (
                CpuStorage::F32(a.clone().into()),
                CpuStorage::F32(w.clone().into()),
            );
            let CpuStorage::F32(got) = matmul(&sa, &la, &sb, &lb).unwrap() else {
                panic!("an f32 product is f32");
            };
            let mut want = vec![0f32; batch * m * n];
            for (i, c) in want.chunks_mut(m * n).enumerate() {
                let ai = MatRef {
                    data: &a[..],
                    offset: i * m * k,
                    row_stride: k,
                    col_stride: 1,
                };
                sgemm(m, n, k, ai, mat(&w[..], &lb, 0), c, false);
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{batch}x{m}x{k}x{n}");
            for (i, g) in got.iter().enumerate() {
                let (row, col) = (i / n, i % n);
                let exact: f64 = (0..k)
                    .map(|p| {
                        let wv = if transposed {
                            w[col * k + p]
                        } else {
                            w[p * n + col]
                        };
                        a[row * k + p] as f64 * wv as f64
                    })
                    .sum();
                assert!(
                    (*g as f64 - exact).abs() <= 1e-4 * (1.0 + exact.abs()),
                    "{i}: {g} vs {exact}"
                );
            }
        }
    }
}
