//! The blocked GEMM driver. Loop nest (BLIS-style, with the roles of A and B
//! arranged for a kernel that broadcasts A and vector-loads B):
//!
//! ```text
//! for ic in m by MC                 shared A block (packed lazily, see LazyPanels)
//!   for pc in k by KC               reduction block
//!     parallel over (column block of <= NC, slice of A panels):
//!       pack B[pc.., jc..]          into this thread's buffer (stays in its L2), or,
//!                                   with one reduction block and several slices,
//!                                   once for all tasks before they start
//!       for ir over MR panels       pack A panel on first use; it stays in L1 ...
//!         for jr over NR panels     ... while B micro-panels stream from L2
//!           microkernel -> C tile
//! ```
//!
//! The A micro-panel (the broadcast operand, 14 lanes) is the smaller of the
//! two, so it is the one kept in L1; this measured a few percent faster than the
//! opposite (classic BLIS) order on Sapphire Rapids. When A has at most two
//! panels, an f32 B with contiguous rows is read in place instead of packed.

use super::kernels::{KernelSpec, MAX_TILE};
use super::pack::{pack_for, PanelSrc};
use super::scratch::{with_scratch, SHARED_SCRATCH, TASK_SCRATCH};
use super::{Elem, Load, MatRef};
use rayon::prelude::*;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU8, Ordering};

/// A strided output matrix behind a raw pointer, so disjoint tiles of it can be
/// written from several threads.
#[derive(Clone, Copy)]
struct COut<T> {
    ptr: *mut T,
    rs: usize,
    cs: usize,
}

// SAFETY: COut is only a pointer into a `&mut [T]` the driver holds exclusively for
// the whole call; the parallel tasks write pairwise disjoint sets of elements
// (distinct column blocks or distinct row slices), so sharing it is race-free.
unsafe impl<T: Send> Send for COut<T> {}
// SAFETY: see the Send impl.
unsafe impl<T: Send> Sync for COut<T> {}

impl<T> COut<T> {
    /// The view shifted to start at element (i, j).
    ///
    /// # Safety
    /// (i, j) must be inside the matrix.
    unsafe fn at(self, i: usize, j: usize) -> Self {
        // SAFETY: forwarded to the caller.
        COut {
            ptr: unsafe { self.ptr.add(i * self.rs + j * self.cs) },
            ..self
        }
    }
}

/// A block of C whose values are final: rows `first_row..first_row + rows` and
/// columns `first_col..first_col + cols` of a row-major C.
pub(crate) struct FinalBlock<'a, T> {
    /// The block's first row.
    pub first_row: usize,
    /// How many rows it has.
    pub rows: usize,
    /// The block's first column.
    pub first_col: usize,
    /// How many columns it has.
    pub cols: usize,
    c: COut<T>,
    _c: PhantomData<&'a [T]>,
}

impl<'a, T> FinalBlock<'a, T> {
    /// All of the row-major `m x n` matrix `c`, final.
    pub(crate) fn whole(c: &'a mut [T], m: usize, n: usize) -> Self {
        assert_eq!(c.len(), m * n, "a whole block covers C");
        FinalBlock {
            first_row: 0,
            rows: m,
            first_col: 0,
            cols: n,
            c: COut {
                ptr: c.as_mut_ptr(),
                rs: n,
                cs: 1,
            },
            _c: PhantomData,
        }
    }

    /// Row `r` of the block (`r < rows`), its `cols` values.
    pub(crate) fn row(&self, r: usize) -> &[T] {
        assert!(
            r < self.rows && self.c.cs == 1,
            "a row of a row-major block"
        );
        // SAFETY: the block lies inside C (the driver hands out its tasks' blocks, or
        // `whole` one C), its rows are contiguous (cs == 1), and no task writes them
        // any more: they are final.
        unsafe {
            std::slice::from_raw_parts(
                self.c
                    .ptr
                    .add((self.first_row + r) * self.c.rs + self.first_col),
                self.cols,
            )
        }
    }
}

/// What a product calls for each block of C once its values are final: from the task
/// that finished the block, while it is still in that core's cache (a bf16 product
/// rounds it there). The blocks cover C once.
pub(crate) type Finish<'a, T = f32> = &'a (dyn Fn(&FinalBlock<'_, T>) + Sync);

/// Computes c (row-major m x n) (+)= a·b, either directly or as cᵀ = bᵀ·aᵀ when
/// that transposed problem wastes much less of the register tile (e.g. n = 10,
/// where 10 of 32 columns would be used but 10 of 14 rows are). `finish`, where given,
/// sees C in final blocks (all of it at the end in the transposed orientation).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_oriented<T: Elem, A: Load<T>, B: Load<T>>(
    spec: &KernelSpec<T>,
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<A>,
    b: MatRef<B>,
    c: &mut [T],
    accumulate: bool,
    threads: usize,
    finish: Option<Finish<'_, T>>,
) {
    debug_assert_eq!(c.len(), m * n);
    let padded = |m: usize, n: usize| m.next_multiple_of(spec.mr) * n.next_multiple_of(spec.nr);
    let row_major = COut {
        ptr: c.as_mut_ptr(),
        rs: n,
        cs: 1,
    };
    let transposed = COut {
        ptr: c.as_mut_ptr(),
        rs: 1,
        cs: n,
    };
    let run = move || {
        // Use the views whole, so the closure captures the Send/Sync `COut`s
        // rather than their raw-pointer fields.
        let (row_major, transposed) = (row_major, transposed);
        // The transposed orientation writes C through a temporary tile (C is
        // column-strided for it), so only take it for a clear win.
        if padded(n, m) * 3 < padded(m, n) * 2 {
            gemm(
                spec,
                n,
                m,
                k,
                b.t(),
                a.t(),
                transposed,
                accumulate,
                threads,
                None,
            );
            false
        } else {
            gemm(spec, m, n, k, a, b, row_major, accumulate, threads, finish);
            true
        }
    };
    let finished = if threads > 1 {
        // Drive the loop nest from a pool thread: its parallel loops then start
        // by pushing work locally instead of waking a sleeping caller each time.
        rayon::scope(|_| run())
    } else {
        run()
    };
    // The transposed orientation's blocks are columns of C: it is finished whole.
    if let (Some(f), false) = (finish, finished) {
        f(&FinalBlock::whole(c, m, n));
    }
}

/// How the compute phase of one (ic, pc) block is cut into parallel tasks.
#[derive(Debug, PartialEq)]
struct Partition {
    /// Columns of C per task (a multiple of NR).
    cols: usize,
    /// Number of slices the A panels are cut into (each slice re-packs the same B block).
    slices: usize,
}

/// Tasks per thread to aim for: more, smaller tasks let rayon's work stealing
/// even out threads that the OS deschedules for a while (the machine is shared),
/// at the cost of reusing each packed A panel across fewer B panels.
fn tasks_per_thread() -> usize {
    use std::sync::OnceLock;
    static V: OnceLock<usize> = OnceLock::new();
    *V.get_or_init(|| {
        std::env::var("KILN_GEMM_TPT")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(4)
    })
}

/// The most f32 values of packed A (8 MiB) for which one block takes all of A's rows
/// (4,096 rows take one block for reduction blocks of up to 511 steps): measured on a Zen 4,
/// 4096x128x128 went from 165 to 184 GFLOP/s and 4096x128x256 from 171 to 185.
const WHOLE_A_FLOATS: usize = 1 << 21;

/// Smallest column block (in B panels) worth a task of its own: below this the
/// A panel brought into L1 is reused across too few B panels.
const MIN_BLOCK_PANELS: usize = 4;

/// Smallest slice of A panels worth re-packing a B block for.
const MIN_SLICE_PANELS: usize = 4;

/// Cuts `n` columns (B panels of `nr`) and `mpanels` A panels into tasks: column
/// blocks no wider than `nc` (so a thread's B block fits its L2), and enough
/// tasks for dynamic load balancing, slicing the A panels too when there are
/// too few column blocks.
fn partition(n: usize, mpanels: usize, nr: usize, nc: usize, threads: usize) -> Partition {
    let npanels = n.div_ceil(nr);
    let nmin = n.div_ceil(nc).max(1);
    let target = if threads <= 1 {
        1
    } else {
        threads * tasks_per_thread()
    };
    let nblocks = target.min(npanels / MIN_BLOCK_PANELS).max(nmin);
    let per_n = npanels.div_ceil(nblocks);
    let nblocks = npanels.div_ceil(per_n);
    let slices = if nblocks >= target {
        1
    } else {
        // Never fewer tasks than threads; beyond that, only while slices stay big.
        let want = target.div_ceil(nblocks);
        let need = threads.div_ceil(nblocks);
        want.min(mpanels / MIN_SLICE_PANELS)
            .max(need)
            .min(mpanels)
            .max(1)
    };
    // Equal slices, none empty.
    let slices = mpanels.div_ceil(mpanels.div_ceil(slices));
    Partition {
        cols: per_n * nr,
        slices,
    }
}

/// `x` split into equal blocks of at most `max` (rounded up to `mult`), so the
/// last block is not a sliver.
fn balanced_block(x: usize, max: usize, mult: usize) -> usize {
    x.div_ceil(x.div_ceil(max).max(1)).next_multiple_of(mult)
}

#[allow(clippy::too_many_arguments)]
fn gemm<T: Elem, A: Load<T>, B: Load<T>>(
    spec: &KernelSpec<T>,
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<A>,
    b: MatRef<B>,
    c: COut<T>,
    accumulate: bool,
    threads: usize,
    finish: Option<Finish<'_, T>>,
) {
    let (mr, nr) = (spec.mr, spec.nr);
    let kc_blk = balanced_block(k, spec.kc, 1);
    // A tall product with a short reduction (a linear layer over a batch of tokens)
    // keeps all of A in one block when its panels are small enough: one parallel phase
    // instead of several, B packed once per task instead of once per task and block,
    // and the tasks balanced over all rows.
    let whole = m.next_multiple_of(mr);
    let mc_blk = if whole * kc_blk <= WHOLE_A_FLOATS {
        whole
    } else {
        balanced_block(m, spec.mc, mr)
    };
    let asrc = PanelSrc {
        data: a.data,
        off: a.offset,
        ls: a.row_stride,
        ks: a.col_stride,
    };
    let bsrc = PanelSrc {
        data: b.data,
        off: b.offset,
        ls: b.col_stride,
        ks: b.row_stride,
    };

    // With at most two A panels, each B element is used at most twice: reading
    // an f32 B in place (rows contiguous) beats copying it into panels first.
    let b_native = B::as_native(b.data).filter(|_| b.col_stride == 1 && m <= 2 * mr && n >= nr);
    // Where several slices of A panels multiply the same B block in one reduction
    // block, B is packed once for all of them (in parallel, before the tasks) instead
    // of by every task: a linear layer's weight over 4,096 tokens was packed eight
    // times. With several reduction blocks (a weight gradient's), the packing phase
    // per block cost more than it saved.
    let may_share_b = b_native.is_none() && threads > 1 && k <= kc_blk;
    let shared_b_len = if may_share_b {
        n.next_multiple_of(nr) * kc_blk
    } else {
        0
    };
    with_scratch(&SHARED_SCRATCH, |shared| {
        let (abuf, bshared) = shared
            .slice::<T>(kc_blk * mc_blk + shared_b_len)
            .split_at_mut(kc_blk * mc_blk);
        // Panel states, kept between calls (steady-state products allocate nothing).
        let mut states = STATES.with(|s| s.take());
        if states.len() < mc_blk / mr {
            states.resize_with(mc_blk / mr, || AtomicU8::new(EMPTY));
        }
        for ic in (0..m).step_by(mc_blk) {
            let mc = mc_blk.min(m - ic);
            let apanels = mc.div_ceil(mr);
            let part = partition(n, apanels, nr, spec.nc, threads);
            let per_slice = apanels.div_ceil(part.slices);
            let nblocks = n.div_ceil(part.cols);
            let ntasks = nblocks * part.slices;
            for pc in (0..k).step_by(kc_blk) {
                let kc = kc_blk.min(k - pc);
                let load_c = accumulate || pc > 0;
                for st in &states {
                    st.store(EMPTY, Ordering::Relaxed);
                }
                let apack =
                    LazyPanels::new(&mut abuf[..apanels * mr * kc], mr * kc, &states[..apanels]);
                let share_b = may_share_b && part.slices > 1;
                if share_b {
                    pack_b_shared(spec, bsrc, n, pc, kc, threads, &mut bshared[..]);
                }
                let bshared = &*bshared;
                let pack_a = |q: usize, dst: &mut [T]| {
                    let l0 = ic + q * mr;
                    pack_for(spec, asrc, l0, mr.min(ic + mc - l0), pc, kc, mr, dst);
                };
                let task = |t: usize| {
                    let (bj, bi) = (t / part.slices, t % part.slices);
                    let jc = bj * part.cols;
                    let nc = part.cols.min(n - jc);
                    let q0 = bi * per_slice;
                    let q1 = (q0 + per_slice).min(apanels);
                    // Tasks sharing A panels start at different ones, so that each
                    // packs its own share instead of waiting on the same panel.
                    let start = bj * (q1 - q0) / nblocks;
                    with_scratch(&TASK_SCRATCH, |own| {
                        let bsize = if b_native.is_some() {
                            nr * kc
                        } else {
                            nc.next_multiple_of(nr) * kc
                        };
                        let (bbuf, private_a) = own.slice::<T>(bsize + mr * kc).split_at_mut(bsize);
                        let bblock = match b_native {
                            Some(data) => {
                                // Full panels straight from the source; only the
                                // partial last one is packed (zero-padded).
                                let full = nc / nr * nr;
                                if full < nc {
                                    let (j0, w) = (jc + full, nc - full);
                                    pack_for(spec, bsrc, j0, w, pc, kc, nr, bbuf);
                                }
                                let base = &data[b.offset + pc * b.row_stride + jc..];
                                BBlock::Direct {
                                    base,
                                    ldb: b.row_stride,
                                    full,
                                    tail: bbuf,
                                }
                            }
                            None if share_b => BBlock::Packed(
                                &bshared[jc * kc..(jc + nc.next_multiple_of(nr)) * kc],
                            ),
                            None => {
                                pack_for(spec, bsrc, jc, nc, pc, kc, nr, bbuf);
                                BBlock::Packed(bbuf)
                            }
                        };
                        let row_of_tiles = |q: usize, ap: &[T]| {
                            let rows = mr.min(mc - q * mr);
                            // SAFETY: row ic + q*mr < m and column jc < n.
                            let ct = unsafe { c.at(ic + q * mr, jc) };
                            panel_row(spec, rows, nc, kc, ap, &bblock, ct, load_c);
                        };
                        // Panels another task is packing right now, for later: on the
                        // stack (whether any are busy depends on timing, and a steady-state
                        // step must not allocate), spilling to the heap past 32.
                        let (mut deferred, mut n_deferred) = ([0usize; 32], 0);
                        let mut spilled = Vec::new();
                        for s in 0..q1 - q0 {
                            let q = q0 + (start + s) % (q1 - q0);
                            match apack.try_get(q, pack_a) {
                                Some(ap) => row_of_tiles(q, ap),
                                None if n_deferred < deferred.len() => {
                                    deferred[n_deferred] = q;
                                    n_deferred += 1;
                                }
                                None => spilled.push(q),
                            }
                        }
                        for &q in deferred[..n_deferred].iter().chain(&spilled) {
                            match apack.try_get(q, pack_a) {
                                Some(ap) => row_of_tiles(q, ap),
                                None => {
                                    pack_a(q, &mut *private_a);
                                    row_of_tiles(q, private_a);
                                }
                            }
                        }
                    });
                    // After the last reduction block the task's rows and columns
                    // are final: handed on while they are in this core's cache.
                    if let (Some(f), true) = (finish, pc + kc == k && q0 < q1) {
                        let first_row = ic + q0 * mr;
                        f(&FinalBlock {
                            first_row,
                            rows: (ic + mc).min(ic + q1 * mr) - first_row,
                            first_col: jc,
                            cols: nc,
                            c,
                            _c: PhantomData,
                        });
                    }
                };
                if threads > 1 && ntasks > 1 {
                    (0..ntasks).into_par_iter().with_max_len(1).for_each(task);
                } else {
                    (0..ntasks).for_each(task);
                }
            }
        }
        STATES.with(|s| s.set(states));
    });
}

/// Packs all `n` columns of B for reduction steps `pc..pc + kc` into `dst` (panel `q`
/// at `q · nr · kc`, as [`BBlock::Packed`] reads them), the columns split over
/// `threads` tasks.
#[allow(clippy::too_many_arguments)]
fn pack_b_shared<T: Elem, B: Load<T>>(
    spec: &KernelSpec<T>,
    bsrc: PanelSrc<'_, B>,
    n: usize,
    pc: usize,
    kc: usize,
    threads: usize,
    dst: &mut [T],
) {
    let nr = spec.nr;
    let cols = n.div_ceil(nr).div_ceil(threads).max(1) * nr;
    let dst = &mut dst[..n.next_multiple_of(nr) * kc];
    dst.par_chunks_mut(cols * kc)
        .enumerate()
        .for_each(|(i, d)| {
            let j0 = i * cols;
            pack_for(spec, bsrc, j0, cols.min(n - j0), pc, kc, nr, d);
        });
}

thread_local! {
    /// Panel states of this thread's products (a nested call gets an empty list).
    static STATES: std::cell::Cell<Vec<AtomicU8>> = const { std::cell::Cell::new(Vec::new()) };
}

const EMPTY: u8 = 0;
const BUSY: u8 = 1;
const READY: u8 = 2;

/// The shared packed A block of one (ic, pc) step. Each MR panel is packed on
/// first use by whichever task reaches it first; the others reuse it. This needs
/// no separate packing phase (one fork/join less per block) and packs each
/// panel right before the packing thread multiplies with it, while it is in L1.
/// A task that finds a panel still being packed defers it, and at the end packs
/// a private copy if it is still not ready, so no task ever waits on another.
struct LazyPanels<'a, T> {
    ptr: *mut T,
    panel_len: usize,
    states: &'a [AtomicU8],
    _buf: PhantomData<&'a mut [T]>,
}

// SAFETY: panel contents are only written by the single task that won the
// EMPTY -> BUSY exchange for that panel, and only read after READY was published
// with Release and observed with Acquire, so shared use never races.
unsafe impl<T: Send + Sync> Sync for LazyPanels<'_, T> {}

impl<'a, T> LazyPanels<'a, T> {
    fn new(buf: &'a mut [T], panel_len: usize, states: &'a [AtomicU8]) -> Self {
        assert!(buf.len() >= panel_len * states.len());
        LazyPanels {
            ptr: buf.as_mut_ptr(),
            panel_len,
            states,
            _buf: PhantomData,
        }
    }

    /// Panel `q`, packed by `pack(q, dst)` if no task has started packing it yet;
    /// `None` while another task is packing it. Callers never wait for that task:
    /// on a busy machine it may be descheduled for a whole time slice.
    fn try_get(&self, q: usize, pack: impl FnOnce(usize, &mut [T])) -> Option<&[T]> {
        #[cfg(test)]
        if tests::FORCE_BUSY.load(Ordering::Relaxed) && q % 2 == 1 {
            return None;
        }
        let st = &self.states[q];
        if st.load(Ordering::Acquire) != READY {
            if st
                .compare_exchange(EMPTY, BUSY, Ordering::Acquire, Ordering::Acquire)
                .is_err()
            {
                return None;
            }
            // SAFETY: winning the exchange gives this task exclusive access to
            // panel q (in bounds: q < states.len()) until READY is published.
            let dst = unsafe {
                std::slice::from_raw_parts_mut(self.ptr.add(q * self.panel_len), self.panel_len)
            };
            pack(q, dst);
            st.store(READY, Ordering::Release);
        }
        // SAFETY: READY was observed with Acquire (or set by this task), so the
        // packing writes are visible, and nobody writes panel q again while
        // `self` is alive.
        Some(unsafe {
            std::slice::from_raw_parts(self.ptr.add(q * self.panel_len), self.panel_len)
        })
    }
}

/// Where the B micro-panels of a task's column block live.
enum BBlock<'a, T> {
    /// Packed: panel `q` at `q * NR * kc`, rows NR apart.
    Packed(&'a [T]),
    /// Read in place: block element (p, j) at `base[p * ldb + j]` for the first
    /// `full` columns (whole panels); the partial last panel is packed in `tail`.
    Direct {
        base: &'a [T],
        ldb: usize,
        full: usize,
        tail: &'a [T],
    },
}

impl<T> BBlock<'_, T> {
    /// Pointer to and row stride of the panel starting at column `jr`, checking
    /// that the `kc` rows of NR elements it addresses are inside the slice.
    fn panel(&self, jr: usize, nr: usize, kc: usize) -> (*const T, usize) {
        match *self {
            BBlock::Packed(buf) => (buf[jr * kc..][..nr * kc].as_ptr(), nr),
            BBlock::Direct {
                base,
                ldb,
                full,
                tail,
            } => {
                if jr < full {
                    assert!((kc - 1) * ldb + jr + nr <= base.len());
                    (base[jr..].as_ptr(), ldb)
                } else {
                    (tail[..nr * kc].as_ptr(), nr)
                }
            }
        }
    }
}

/// Multiplies one packed A panel (`rows <= MR` valid rows) with every B panel
/// of the packed block: one row of tiles of C.
#[allow(clippy::too_many_arguments)]
fn panel_row<T: Elem>(
    spec: &KernelSpec<T>,
    rows: usize,
    nc: usize,
    kc: usize,
    ap: &[T],
    bblock: &BBlock<'_, T>,
    c: COut<T>,
    load_c: bool,
) {
    let (mr, nr) = (spec.mr, spec.nr);
    assert!(mr * nr <= MAX_TILE && ap.len() >= mr * kc);
    for jr in (0..nc).step_by(nr) {
        let cols = nr.min(nc - jr);
        let (bp, rs_b) = bblock.panel(jr, nr, kc);
        if c.cs == 1 {
            // SAFETY: `ap` holds mr*kc elements and `panel` checked the B panel's
            // extent; the rows x cols tile at (0, jr) lies inside this task's block
            // of C with contiguous columns; the spec's ISA was checked against the CPU.
            unsafe {
                (spec.func)(
                    kc,
                    ap.as_ptr(),
                    bp,
                    rs_b,
                    c.ptr.add(jr),
                    c.rs,
                    rows,
                    cols,
                    load_c,
                )
            };
        } else {
            // Column-strided C (transposed orientation): compute the tile into
            // `tmp`, then scatter the part that exists.
            let mut tmp = [T::ZERO; MAX_TILE];
            // SAFETY: as above, with `tmp` (MAX_TILE >= mr*nr elements, row stride nr) as C.
            unsafe {
                (spec.func)(
                    kc,
                    ap.as_ptr(),
                    bp,
                    rs_b,
                    tmp.as_mut_ptr(),
                    nr,
                    rows,
                    cols,
                    false,
                )
            };
            for i in 0..rows {
                for j in 0..cols {
                    let v = tmp[i * nr + j];
                    // SAFETY: (i, jr + j) is inside this task's block of C.
                    unsafe {
                        let d = c.ptr.add(i * c.rs + (jr + j) * c.cs);
                        *d = if load_c { *d + v } else { v };
                    }
                }
            }
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// Makes every odd A panel look permanently busy, so tasks take the private
    /// packing fallback (results must not change; other tests only slow down).
    pub(crate) static FORCE_BUSY: std::sync::atomic::AtomicBool =
        std::sync::atomic::AtomicBool::new(false);

    #[test]
    fn partition_covers_and_splits() {
        for &(n, mpanels, threads) in &[
            (1024, 74, 2),
            (1024, 19, 2),
            (10, 19, 2),
            (32, 1, 2),
            (10, 8, 4),
            (784, 19, 2),
            (5000, 3, 3),
        ] {
            let p = partition(n, mpanels, 32, 512, threads);
            assert!(
                p.cols.is_multiple_of(32) && p.cols > 0 && p.cols <= 512,
                "{n} {mpanels} {p:?}"
            );
            assert!(p.slices >= 1 && p.slices <= mpanels);
            // every A slice non-empty
            let per = mpanels.div_ceil(p.slices);
            assert!((p.slices - 1) * per < mpanels);
            // enough tasks for the threads whenever the shape allows it
            let tasks = n.div_ceil(p.cols) * p.slices;
            assert!(
                tasks >= threads.min(mpanels * n.div_ceil(32)),
                "{n} {mpanels} {p:?}"
            );
        }
        assert_eq!(
            partition(1024, 74, 32, 512, 1),
            Partition {
                cols: 512,
                slices: 1
            }
        );
        // A single column block is split across the A panels instead.
        assert!(partition(32, 19, 32, 512, 2).slices >= 2);
    }
}
