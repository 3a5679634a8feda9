//! A watchdog over queued device work that waits on other processes (NCCL's
//! exchanges): work that has not ended within a timeout of being queued makes it run
//! its abort (NCCL's `ncclCommAbort`, which ends the waiting kernels) and fail the
//! group, so that a rank whose peer died mid-exchange fails with an error instead of
//! waiting forever. What PyTorch's NCCL watchdog does for its process groups.
//!
//! Written over a [`Mark`] (a point in a stream's work that has ended or not) so that
//! its timing is tested without a device.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A point in queued device work (a recorded CUDA event).
pub trait Mark: Send {
    /// Whether the work queued before it has ended; an error where the device failed.
    fn ended(&self) -> Result<bool, String>;
}

/// What the watchdog's thread and its owner share.
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

/// Marks not yet ended, each with when it was queued, and how the watch ended.
struct State {
    marks: VecDeque<(Box<dyn Mark>, Instant)>,
    /// Why the group failed, once it has.
    failed: Option<String>,
    stop: bool,
}

/// Watches the marks handed to it from a thread of its own.
pub struct Watchdog {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// How often marks are asked whether they have ended.
const POLL: Duration = Duration::from_millis(50);

impl Watchdog {
    /// A watchdog that fails the group, naming `who`, when a mark has not ended
    /// `timeout` after it was handed over: it runs `abort` once, then. Its thread runs
    /// `setup` first (making a device's context current).
    pub fn spawn(
        who: String,
        timeout: Duration,
        setup: impl FnOnce() + Send + 'static,
        abort: impl FnOnce() + Send + 'static,
    ) -> Watchdog {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                marks: VecDeque::new(),
                failed: None,
                stop: false,
            }),
            changed: Condvar::new(),
        });
        let theirs = shared.clone();
        let thread = std::thread::spawn(move || {
            setup();
            watch(&theirs, &who, timeout, abort)
        });
        Watchdog {
            shared,
            thread: Some(thread),
        }
    }

    /// Puts the work queued before `mark` under the timeout, from now.
    pub fn watch(&self, mark: Box<dyn Mark>) {
        let mut state = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        state.marks.push_back((mark, Instant::now()));
        self.shared.changed.notify_all();
    }

    /// Why the group failed, if it has.
    pub fn failed(&self) -> Option<String> {
        let state = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        state.failed.clone()
    }
}

/// The watchdog thread: drops marks as they end, and fails the group (running
/// `abort`) at the first that outlives `timeout` or whose device failed.
fn watch(shared: &Shared, who: &str, timeout: Duration, abort: impl FnOnce()) {
    let mut state = shared.state.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        if state.stop || state.failed.is_some() {
            return;
        }
        let mut why = None;
        while let Some((mark, since)) = state.marks.front() {
            match mark.ended() {
                Ok(true) => {
                    state.marks.pop_front();
                }
                Ok(false) if since.elapsed() >= timeout => {
                    why = Some(format!(
                        "{who}: an exchange queued {:.0} s ago has not ended (a peer rank died \
                         or stalled mid-exchange); the group was aborted",
                        since.elapsed().as_secs_f64()
                    ));
                    break;
                }
                Ok(false) => break,
                Err(e) => {
                    why = Some(format!("{who}: the device failed under an exchange: {e}"));
                    break;
                }
            }
        }
        if let Some(why) = why {
            state.failed = Some(why);
            state.marks.clear();
            // The owner's next call sees `failed` before touching the group again.
            drop(state);
            abort();
            return;
        }
        let wait = if state.marks.is_empty() {
            Duration::from_secs(3600)
        } else {
            POLL
        };
        state = shared
            .changed
            .wait_timeout(state, wait)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        {
            let mut state = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
            state.stop = true;
            self.shared.changed.notify_all();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    /// A mark that ends when its flag is set.
    struct Flag(Arc<AtomicBool>);
    impl Mark for Flag {
        fn ended(&self) -> Result<bool, String> {
            Ok(self.0.load(Ordering::SeqCst))
        }
    }

    /// A watchdog over `timeout` that counts its aborts.
    fn counting(timeout: Duration) -> (Watchdog, Arc<AtomicUsize>) {
        let aborts = Arc::new(AtomicUsize::new(0));
        let counted = aborts.clone();
        let dog = Watchdog::spawn(
            "rank 1".into(),
            timeout,
            || {},
            move || {
                counted.fetch_add(1, Ordering::SeqCst);
            },
        );
        (dog, aborts)
    }

    #[test]
    fn work_that_ends_in_time_is_left_alone() {
        let (dog, aborts) = counting(Duration::from_millis(300));
        for _ in 0..20 {
            let flag = Arc::new(AtomicBool::new(false));
            dog.watch(Box::new(Flag(flag.clone())));
            std::thread::sleep(Duration::from_millis(20));
            flag.store(true, Ordering::SeqCst);
        }
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(dog.failed(), None);
        assert_eq!(aborts.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn work_that_never_ends_aborts_the_group_once_after_the_timeout() {
        let (dog, aborts) = counting(Duration::from_millis(300));
        let start = Instant::now();
        dog.watch(Box::new(Flag(Arc::new(AtomicBool::new(false)))));
        dog.watch(Box::new(Flag(Arc::new(AtomicBool::new(false)))));
        while dog.failed().is_none() {
            assert!(start.elapsed() < Duration::from_secs(10), "never fired");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(start.elapsed() >= Duration::from_millis(300), "fired early");
        let why = dog.failed().unwrap();
        assert!(
            why.starts_with("rank 1: an exchange queued 0 s ago has not ended (a peer rank died"),
            "{why}"
        );
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(aborts.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_device_failure_under_an_exchange_fails_the_group_at_once() {
        struct Broken;
        impl Mark for Broken {
            fn ended(&self) -> Result<bool, String> {
                Err("CUDA_ERROR_ILLEGAL_ADDRESS".into())
            }
        }
        let (dog, aborts) = counting(Duration::from_secs(600));
        dog.watch(Box::new(Broken));
        let start = Instant::now();
        while dog.failed().is_none() {
            assert!(start.elapsed() < Duration::from_secs(10), "never fired");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(
            dog.failed().unwrap(),
            "rank 1: the device failed under an exchange: CUDA_ERROR_ILLEGAL_ADDRESS"
        );
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(aborts.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn dropping_a_watchdog_ends_its_thread_without_aborting() {
        let (dog, aborts) = counting(Duration::from_millis(100));
        dog.watch(Box::new(Flag(Arc::new(AtomicBool::new(false)))));
        drop(dog);
        assert_eq!(aborts.load(Ordering::SeqCst), 0);
    }
}
