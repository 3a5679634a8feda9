//! Walking strided views row by row. Dims are first coalesced (adjacent dims merged
//! where every input allows), so a contiguous or row-broadcast input becomes one long
//! inner run that the kernels process as a slice.

use kiln_tensor::{Dims, Layout};
use std::borrow::Cow;

/// Rows of an op over `n` inputs that all have the same logical dims.
pub struct RowPlan {
    /// Coalesced outer dims (all but the innermost).
    outer: Vec<usize>,
    /// Per input, the stride of each outer dim.
    outer_strides: Vec<Vec<usize>>,
    /// Per input, the stride along the inner run.
    pub inner_strides: Vec<usize>,
    /// Per input, the storage offset of element 0.
    offsets: Vec<usize>,
    /// Length of the inner run.
    pub inner: usize,
    /// Number of rows.
    pub rows: usize,
}

impl RowPlan {
    /// Plans rows for inputs laid out by `layouts` (each with dims `dims`).
    pub fn new(dims: &Dims, layouts: &[&Layout]) -> Self {
        let n = layouts.len();
        // Dims (and per-input strides), innermost first, size-1 dims dropped.
        let mut cd: Vec<usize> = Vec::new();
        let mut cs: Vec<Vec<usize>> = vec![Vec::new(); n];
        for ax in (0..dims.rank()).rev() {
            let d = dims[ax];
            if d == 1 {
                continue;
            }
            let merge = !cd.is_empty()
                && layouts
                    .iter()
                    .zip(&cs)
                    .all(|(l, s)| l.strides()[ax] == s[s.len() - 1] * cd[cd.len() - 1]);
            if merge {
                let last = cd.len() - 1;
                cd[last] *= d;
            } else {
                cd.push(d);
                for (s, l) in cs.iter_mut().zip(layouts) {
                    s.push(l.strides()[ax]);
                }
            }
        }
        if cd.is_empty() {
            cd.push(1);
            for s in cs.iter_mut() {
                s.push(0);
            }
        }
        let inner = cd[0];
        let inner_strides = cs.iter().map(|s| s[0]).collect();
        let outer: Vec<usize> = cd[1..].iter().rev().copied().collect();
        let outer_strides = cs
            .iter()
            .map(|s| s[1..].iter().rev().copied().collect())
            .collect();
        let rows = if dims.numel() == 0 {
            0
        } else {
            outer.iter().product()
        };
        RowPlan {
            outer,
            outer_strides,
            inner_strides,
            offsets: layouts.iter().map(|l| l.offset()).collect(),
            inner: if dims.numel() == 0 { 0 } else { inner },
            rows,
        }
    }

    /// Calls `f(row, bases)` for rows `start..end`, with each input's storage offset of
    /// the row's first element.
    pub fn for_rows(&self, start: usize, end: usize, mut f: impl FnMut(usize, &[usize])) {
        if start >= end {
            return;
        }
        let n = self.offsets.len();
        let r = self.outer.len();
        // Decompose `start` into a multi-index once, then step incrementally.
        let mut idx = vec![0usize; r];
        let mut rem = start;
        for ax in (0..r).rev() {
            idx[ax] = rem % self.outer[ax];
            rem /= self.outer[ax];
        }
        let mut bases: Vec<usize> = (0..n)
            .map(|i| {
                self.offsets[i]
                    + (0..r)
                        .map(|ax| idx[ax] * self.outer_strides[i][ax])
                        .sum::<usize>()
            })
            .collect();
        for row in start..end {
            f(row, &bases);
            let mut ax = r;
            while ax > 0 {
                ax -= 1;
                idx[ax] += 1;
                for (b, s) in bases.iter_mut().zip(&self.outer_strides) {
                    *b += s[ax];
                }
                if idx[ax] < self.outer[ax] {
                    break;
                }
                for (b, s) in bases.iter_mut().zip(&self.outer_strides) {
                    *b -= s[ax] * self.outer[ax];
                }
                idx[ax] = 0;
            }
        }
    }
}

/// The elements a layout selects, in row-major order: borrowed when contiguous.
pub fn gather<'a, T: Copy + Send + Sync>(data: &'a [T], layout: &Layout) -> Cow<'a, [T]> {
    let n = layout.numel();
    if layout.is_contiguous() {
        return Cow::Borrowed(&data[layout.offset()..layout.offset() + n]);
    }
    let mut out = Vec::with_capacity(n);
    gather_into(data, layout, &mut out);
    Cow::Owned(out)
}

/// The elements a layout selects, in row-major order, appended to `out` (a buffer the
/// caller reuses, so that a strided read allocates nothing once it has grown).
pub fn gather_into<T: Copy + Send + Sync>(data: &[T], layout: &Layout, out: &mut Vec<T>) {
    let plan = RowPlan::new(layout.dims(), &[layout]);
    let (inner, s) = (plan.inner, plan.inner_strides[0]);
    plan.for_rows(0, plan.rows, |_, b| {
        let b = b[0];
        if s == 1 {
            out.extend_from_slice(&data[b..b + inner]);
        } else {
            out.extend((0..inner).map(|i| data[b + i * s]));
        }
    });
}

/// Rows per parallel task so that each task handles at least `grain` elements.
pub fn rows_per_task(rows: usize, inner: usize, grain: usize) -> usize {
    let per = grain.div_ceil(inner.max(1)).max(1);
    per.min(rows.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coalesces_contiguous_and_broadcast() {
        let d = Dims::new(&[4, 3, 5]).unwrap();
        let c = Layout::contiguous(d);
        let p = RowPlan::new(&d, &[&c]);
        assert_eq!((p.rows, p.inner), (1, 60));
        let bias = Layout::contiguous(Dims::new(&[5]).unwrap())
            .broadcast_to(&d)
            .unwrap();
        let p = RowPlan::new(&d, &[&c, &bias]);
        assert_eq!((p.rows, p.inner), (12, 5));
        let mut seen = vec![];
        p.for_rows(0, p.rows, |r, b| seen.push((r, b.to_vec())));
        assert_eq!(seen[2], (2, vec![10, 0]));
    }

    #[test]
    fn gathers_transposes() {
        let data: Vec<i32> = (0..6).collect();
        let t = Layout::contiguous(Dims::new(&[2, 3]).unwrap())
            .permute(&[1, 0])
            .unwrap();
        assert_eq!(&*gather(&data, &t), &[0, 3, 1, 4, 2, 5]);
    }
}
