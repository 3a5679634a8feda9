//! Cache-line aligned, thread-local packing buffers that live across calls, so a
//! GEMM does not pay for allocation and page faults every time it runs.

use super::Elem;
use std::cell::RefCell;
use std::thread::LocalKey;

#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Line([u8; 64]);

/// A growable, 64-byte aligned buffer of f32 or f64.
pub(crate) struct Scratch {
    lines: Vec<Line>,
}

impl Scratch {
    const fn new() -> Self {
        Scratch { lines: Vec::new() }
    }

    /// A buffer of at least `len` elements (contents unspecified but initialized).
    pub(crate) fn slice<T: Elem>(&mut self, len: usize) -> &mut [T] {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .expect("gemm scratch size overflow");
        let nlines = bytes.div_ceil(64);
        if self.lines.len() < nlines {
            self.lines.resize(nlines, Line([0; 64]));
        }
        // SAFETY: `Elem` is sealed to f32 and f64: every bit pattern is a valid value,
        // and their alignment (4 or 8) divides `Line`'s 64. The lines are initialized
        // (zeroed on growth) and span at least `len * size_of::<T>()` bytes, and the
        // returned borrow is tied to `&mut self`, so nothing else aliases it.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast::<T>(), len) }
    }
}

thread_local! {
    /// Per-task packed blocks (one buffer per worker thread).
    pub(crate) static TASK_SCRATCH: RefCell<Scratch> = const { RefCell::new(Scratch::new()) };
    /// Blocks packed once per call and shared read-only with the workers, owned by the calling thread.
    pub(crate) static SHARED_SCRATCH: RefCell<Scratch> = const { RefCell::new(Scratch::new()) };
    /// The partial products of a reduction split into parts, owned by the calling thread.
    pub(crate) static PARTS_SCRATCH: RefCell<Scratch> = const { RefCell::new(Scratch::new()) };
}

/// Runs `f` with this thread's buffer from `key`.
///
/// A rayon worker that waits inside a parallel loop may steal and run another GEMM
/// on the same thread while the buffer is still borrowed; that nested call gets a
/// fresh temporary buffer instead of panicking or aliasing.
pub(crate) fn with_scratch<R>(
    key: &'static LocalKey<RefCell<Scratch>>,
    f: impl FnOnce(&mut Scratch) -> R,
) -> R {
    let mut f = Some(f);
    let r = key.try_with(|cell| match cell.try_borrow_mut() {
        Ok(mut s) => Some((f.take().unwrap())(&mut s)),
        Err(_) => None,
    });
    match r {
        Ok(Some(r)) => r,
        // Busy (re-entrant) or thread-local already destroyed (thread exit).
        _ => (f.take().unwrap())(&mut Scratch::new()),
    }
}
