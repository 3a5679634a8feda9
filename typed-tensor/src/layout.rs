//! Layouts: how a tensor's logical dims map onto its storage (strides in elements and
//! an offset). Permute, broadcast and slice are layout changes, never copies.

use crate::error::{Error, Result};
use crate::shape::{Dims, MAX_RANK};

/// Dims, element strides and an offset into storage.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Layout {
    dims: Dims,
    strides: [usize; MAX_RANK],
    offset: usize,
}

impl Layout {
    /// A row-major layout starting at element 0.
    pub fn contiguous(dims: Dims) -> Self {
        Layout {
            strides: dims.contiguous_strides(),
            dims,
            offset: 0,
        }
    }

    /// A layout from its parts; the caller guarantees it stays inside the storage.
    pub fn from_parts(dims: Dims, strides: &[usize], offset: usize) -> Self {
        let mut s = [0; MAX_RANK];
        s[..strides.len()].copy_from_slice(strides);
        Layout {
            dims,
            strides: s,
            offset,
        }
    }

    /// The logical dims.
    pub fn dims(&self) -> &Dims {
        &self.dims
    }

    /// The element strides, one per dim.
    pub fn strides(&self) -> &[usize] {
        &self.strides[..self.dims.rank()]
    }

    /// The offset of the first element in storage.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The number of dims.
    pub fn rank(&self) -> usize {
        self.dims.rank()
    }

    /// The number of logical elements.
    pub fn numel(&self) -> usize {
        self.dims.numel()
    }

    /// Whether the elements are in row-major order with no gaps (size-1 dims may have
    /// any stride).
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1;
        for i in (0..self.rank()).rev() {
            let d = self.dims[i];
            if d != 1 && self.strides[i] != expected {
                return false;
            }
            expected *= d;
        }
        true
    }

    /// Whether this view over `out_dims` is one row broadcast over every other dim
    /// (strides 0, a unit stride along the last dim), as a bias added to a product is.
    pub fn is_broadcast_row(&self, out_dims: &[usize]) -> bool {
        let r = out_dims.len();
        self.dims.as_slice() == out_dims
            && r >= 1
            && self.strides()[..r - 1].iter().all(|&s| s == 0)
            && (self.strides()[r - 1] == 1 || out_dims[r - 1] == 1)
    }

    /// One past the largest storage index this layout touches (0 when empty).
    pub fn storage_extent(&self) -> usize {
        if self.numel() == 0 {
            return 0;
        }
        self.offset
            + self
                .dims
                .iter()
                .zip(self.strides())
                .map(|(d, s)| (d - 1) * s)
                .sum::<usize>()
            + 1
    }

    /// Reorders the dims: dim `i` of the result is dim `perm[i]` of `self`.
    pub fn permute(&self, perm: &[usize]) -> Result<Layout> {
        check_perm(perm, self.rank())?;
        let mut dims = self.dims;
        let mut strides = [0; MAX_RANK];
        for (i, &p) in perm.iter().enumerate() {
            dims.as_mut_slice()[i] = self.dims[p];
            strides[i] = self.strides[p];
        }
        Ok(Layout {
            dims,
            strides,
            offset: self.offset,
        })
    }

    /// Broadcasts to `target` (NumPy rules, aligned on the right): size-1 and new
    /// leading dims get stride 0.
    pub fn broadcast_to(&self, target: &Dims) -> Result<Layout> {
        let (r, t) = (self.rank(), target.rank());
        if r > t {
            return Err(Error::shape(
                "broadcast",
                format!("cannot broadcast {} to lower rank {}", self.dims, target),
            ));
        }
        let mut strides = [0; MAX_RANK];
        for i in 0..t {
            let j = i as isize - (t - r) as isize;
            if j < 0 {
                continue;
            }
            let j = j as usize;
            if self.dims[j] == target[i] {
                strides[i] = self.strides[j];
            } else if self.dims[j] == 1 {
                strides[i] = 0;
            } else {
                return Err(Error::shape(
                    "broadcast",
                    format!("cannot broadcast {} to {}", self.dims, target),
                ));
            }
        }
        Ok(Layout {
            dims: *target,
            strides,
            offset: self.offset,
        })
    }

    /// Keeps elements `start, start+step, ...` below `end` along `axis`.
    pub fn slice(&self, axis: usize, start: usize, end: usize, step: usize) -> Result<Layout> {
        if axis >= self.rank() || start > end || end > self.dims[axis] || step == 0 {
            return Err(Error::invalid(
                "slice",
                format!(
                    "range {start}..{end} step {step} on axis {axis} does not fit shape {}",
                    self.dims
                ),
            ));
        }
        let mut out = *self;
        out.dims.as_mut_slice()[axis] = (end - start).div_ceil(step);
        if out.dims[axis] > 0 {
            out.offset += start * self.strides[axis];
        }
        out.strides[axis] *= step;
        Ok(out)
    }

    /// The same elements under new dims, when that needs no copy (`None` otherwise).
    pub fn reshape(&self, dims: &Dims) -> Option<Layout> {
        if dims.numel() != self.numel() {
            return None;
        }
        if self.is_contiguous() {
            return Some(Layout {
                dims: *dims,
                strides: dims.contiguous_strides(),
                offset: self.offset,
            });
        }
        None
    }

    /// Calls `f` with the storage index of every element, in row-major order.
    pub fn for_each_offset(&self, mut f: impl FnMut(usize)) {
        let rank = self.rank();
        if self.numel() == 0 {
            return;
        }
        if rank == 0 {
            f(self.offset);
            return;
        }
        let inner = self.dims[rank - 1];
        let inner_stride = self.strides[rank - 1];
        let mut idx = [0usize; MAX_RANK];
        let outer: usize = self.dims[..rank - 1].iter().product();
        let mut base = self.offset;
        for _ in 0..outer {
            let mut o = base;
            for _ in 0..inner {
                f(o);
                o += inner_stride;
            }
            // Advance the multi-index over the outer dims, updating `base` in step.
            let mut ax = rank - 1;
            while ax > 0 {
                ax -= 1;
                idx[ax] += 1;
                base += self.strides[ax];
                if idx[ax] < self.dims[ax] {
                    break;
                }
                base -= self.strides[ax] * self.dims[ax];
                idx[ax] = 0;
            }
        }
    }

    /// The storage index of the element at a multi-index.
    pub fn offset_of(&self, index: &[usize]) -> usize {
        self.offset
            + index
                .iter()
                .zip(self.strides())
                .map(|(i, s)| i * s)
                .sum::<usize>()
    }
}

/// Checks that `perm` is a permutation of `0..rank`.
pub fn check_perm(perm: &[usize], rank: usize) -> Result<()> {
    let mut seen = [false; MAX_RANK];
    let ok = perm.len() == rank
        && perm.iter().all(|&p| {
            let fresh = p < rank && !seen[p];
            if fresh {
                seen[p] = true;
            }
            fresh
        });
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(
            "permute",
            format!("{perm:?} is not a permutation of the {rank} axes"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offsets(l: &Layout) -> Vec<usize> {
        let mut v = vec![];
        l.for_each_offset(|o| v.push(o));
        v
    }

    #[test]
    fn permute_and_iterate() {
        let l = Layout::contiguous(Dims::new(&[2, 3]).unwrap());
        let t = l.permute(&[1, 0]).unwrap();
        assert_eq!(offsets(&t), vec![0, 3, 1, 4, 2, 5]);
        assert!(!t.is_contiguous());
        assert!(l.permute(&[0, 0]).is_err());
    }

    #[test]
    fn broadcast_and_slice() {
        let l = Layout::contiguous(Dims::new(&[3, 1]).unwrap());
        let b = l.broadcast_to(&Dims::new(&[2, 3, 2]).unwrap()).unwrap();
        assert_eq!(offsets(&b), vec![0, 0, 1, 1, 2, 2, 0, 0, 1, 1, 2, 2]);
        let s = Layout::contiguous(Dims::new(&[10]).unwrap())
            .slice(0, 1, 8, 3)
            .unwrap();
        assert_eq!(offsets(&s), vec![1, 4, 7]);
        assert!(l.broadcast_to(&Dims::new(&[2]).unwrap()).is_err());
    }
}
