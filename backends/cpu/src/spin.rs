//! A small pool of helper threads that spin for a moment between jobs, for parallel
//! work too short to pay for waking a sleeping thread (a batch-1 product reads its
//! weights in about 0.1 ms; waking one of rayon's parked workers through a futex costs
//! tens of microseconds, and the products of one forward pass come microseconds apart).
//!
//! [`split`] hands a job's tasks out one at a time to the calling thread and the
//! helpers, so a core that is slower today (another process, an interrupt) takes fewer
//! of them; helpers that see no job for `SPIN` go to sleep on a condition variable,
//! so an idle program does not burn its cores. One job runs at a time: a caller that
//! finds the pool busy (another thread's job, or a job nested inside a task) gets
//! `false` back and runs its work some other way.

use std::cell::UnsafeCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long a helper keeps looking for the next job before it sleeps: longer than the
/// gap between the products of one forward pass, short enough that a helper does not
/// hold a core from other work for long.
const SPIN: Duration = Duration::from_micros(200);

/// A job's tasks, erased to a raw pointer: [`split`] waits for every task to finish
/// before the closure it points at goes out of scope.
#[derive(Clone, Copy)]
struct Job {
    task: *const (dyn Fn(usize) + Sync),
    tasks: usize,
}

/// State shared by the caller and the helpers.
struct Shared {
    /// Taken by the caller for the length of a job.
    busy: AtomicBool,
    /// Bumped once per job; a helper runs a job when this moves past what it saw.
    epoch: AtomicU64,
    /// The current job, written by the caller (holding `busy`) before it bumps `epoch`.
    job: UnsafeCell<Job>,
    /// The next task of the current job to hand out.
    next: AtomicUsize,
    /// Helpers still working on the current job.
    pending: AtomicUsize,
    /// Whether a helper's task panicked during the current job.
    panicked: AtomicBool,
    /// Helpers asleep (or about to sleep) on `wake`.
    sleeping: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is written only by the thread holding `busy`, before the `epoch` bump
// (release) that helpers acquire before reading it, and not again until every helper
// has reported its task done through `pending`.
unsafe impl Sync for Shared {}

/// The pool: `helpers` threads, started on first use.
struct Pool {
    shared: &'static Shared,
    helpers: usize,
}

/// The job a fresh pool points at (never run: it has no tasks).
fn no_task(_: usize) {}

/// The pool, sized to rayon's thread count (the caller is one of the workers).
fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let shared: &'static Shared = Box::leak(Box::new(Shared {
            busy: AtomicBool::new(false),
            epoch: AtomicU64::new(0),
            job: UnsafeCell::new(Job {
                task: &no_task as &(dyn Fn(usize) + Sync),
                tasks: 0,
            }),
            next: AtomicUsize::new(0),
            pending: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            sleeping: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        }));
        let wanted = rayon::current_num_threads().saturating_sub(1);
        let mut helpers = 0;
        for index in 1..=wanted {
            let spawned = std::thread::Builder::new()
                .name(format!("kiln-spin-{index}"))
                .spawn(move || helper(shared));
            if spawned.is_err() {
                break;
            }
            helpers += 1;
        }
        Pool { shared, helpers }
    })
}

/// How many threads run [`split`]'s tasks (the caller and the helpers).
pub fn width() -> usize {
    pool().helpers + 1
}

/// Runs `task(0)`, …, `task(tasks - 1)` on this thread and the helpers, each task once,
/// and returns `true` when they have all finished. Returns `false` without running
/// anything when the pool is running another job. A panicking task panics here once
/// the others have finished.
pub fn split(tasks: usize, task: &(dyn Fn(usize) + Sync)) -> bool {
    let pool = pool();
    let s = pool.shared;
    if s.busy
        .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        return false;
    }
    // SAFETY: only this call changes the lifetime: every use of the pointer ends
    // before `Finish` below returns, which waits for the helpers.
    let task_ptr: *const (dyn Fn(usize) + Sync) = unsafe { std::mem::transmute(task) };
    // SAFETY: we hold `busy`, and every helper finished the previous job.
    unsafe {
        *s.job.get() = Job {
            task: task_ptr,
            tasks,
        }
    };
    s.panicked.store(false, Ordering::Relaxed);
    s.next.store(0, Ordering::Relaxed);
    s.pending.store(pool.helpers, Ordering::Relaxed);
    s.epoch.fetch_add(1, Ordering::SeqCst);
    if s.sleeping.load(Ordering::SeqCst) > 0 {
        let _guard = s.lock.lock().unwrap_or_else(|e| e.into_inner());
        s.wake.notify_all();
    }
    /// Waits for the helpers even when task 0 unwinds, so the closure outlives them.
    struct Finish(&'static Shared);
    impl Drop for Finish {
        fn drop(&mut self) {
            let mut spins = 0u32;
            while self.0.pending.load(Ordering::Acquire) > 0 {
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(1024) {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
            self.0.busy.store(false, Ordering::Release);
        }
    }
    let finish = Finish(s);
    run_tasks(s, task, tasks);
    drop(finish);
    if s.panicked.load(Ordering::Relaxed) {
        panic!("a task of a parallel product panicked on a helper thread");
    }
    true
}

/// A helper's loop: wait for a job (spinning, then asleep), take tasks until none is
/// left, report done.
fn helper(s: &'static Shared) {
    let mut seen = 0u64;
    loop {
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            if s.epoch.load(Ordering::Acquire) != seen {
                break;
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(256) && start.elapsed() > SPIN {
                let mut guard = s.lock.lock().unwrap_or_else(|e| e.into_inner());
                s.sleeping.fetch_add(1, Ordering::SeqCst);
                while s.epoch.load(Ordering::SeqCst) == seen {
                    guard = s.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
                }
                s.sleeping.fetch_sub(1, Ordering::SeqCst);
                break;
            }
            std::hint::spin_loop();
        }
        seen = s.epoch.load(Ordering::Acquire);
        // SAFETY: the epoch moved, so the caller wrote this job before bumping it and
        // will not write another until this helper decrements `pending`.
        let job = unsafe { *s.job.get() };
        // SAFETY: the caller keeps the closure alive until `pending` reaches zero.
        let task = unsafe { &*job.task };
        if catch_unwind(AssertUnwindSafe(|| run_tasks(s, task, job.tasks))).is_err() {
            s.panicked.store(true, Ordering::Relaxed);
        }
        s.pending.fetch_sub(1, Ordering::Release);
    }
}

/// Takes the job's tasks one at a time until none is left.
fn run_tasks(s: &Shared, task: &(dyn Fn(usize) + Sync), tasks: usize) {
    loop {
        let t = s.next.fetch_add(1, Ordering::Relaxed);
        if t >= tasks {
            return;
        }
        task(t);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn every_task_runs_once_per_job() {
        let n = 4 * width() + 1;
        for round in 0..2000 {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            let ran = split(n, &|t| {
                hits[t].fetch_add(round + 1, Ordering::Relaxed);
            });
            if !ran {
                // Another test holds the pool: nothing may have run.
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 0));
                continue;
            }
            for h in &hits {
                assert_eq!(h.load(Ordering::Relaxed), round + 1);
            }
            if round % 500 == 0 {
                // Let the helpers fall asleep, so waking them is tested too.
                std::thread::sleep(SPIN * 3);
            }
        }
    }

    #[test]
    fn a_nested_job_is_declined() {
        let nested = AtomicBool::new(true);
        let ran = split(1, &|_| nested.store(split(1, &|_| {}), Ordering::Relaxed));
        if ran {
            assert!(!nested.load(Ordering::Relaxed));
        }
    }

    #[test]
    fn a_panicking_task_panics_in_the_caller_and_the_pool_recovers() {
        let n = 3 * width();
        let r = catch_unwind(|| split(n, &|t| assert!(t != n - 1, "task {t} fails")));
        if let Ok(ran) = r {
            assert!(!ran, "only a declined job returns");
        }
        let count = AtomicUsize::new(0);
        let mut ran = false;
        for _ in 0..1000 {
            ran = split(n, &|_| {
                count.fetch_add(1, Ordering::Relaxed);
            });
            if ran {
                break;
            }
            std::thread::yield_now();
        }
        assert!(ran);
        assert_eq!(count.load(Ordering::Relaxed), n);
    }
}
