//! The rules of a graph capture, kept while a step runs on one thread: which buffers
//! its launches bind (a graph keeps them alive and replays on them), which error flags
//! they leave, and the first thing the step did that a replay could not repeat. A CUDA
//! graph capture (`graph::CudaGraph`) records under these rules; on any runtime,
//! [`crate::CubeDevice::check_capturable`] runs a step under them without capturing it, so
//! that the rules are tested where no CUDA device is (CI's lavapipe).
//!
//! What a replay cannot repeat: a copy from the host (an upload, a new kernel metadata
//! buffer), a read or a synchronisation, and releasing a buffer made before the capture
//! whose first use in the step was a read: the step then carried state in it (a
//! parameter, an optimizer buffer) and replaced it with a new buffer, so replays would
//! keep reading the old value. A buffer the step wrote before reading (a program's
//! scratch slot) may be released: each replay writes it again first.

use cubecl::server::Handle;
use kiln_tensor::{Error, Result};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

/// How a failed launch is reported: its error, from the code and detail in its flag.
pub(crate) type Report = Arc<dyn Fn(u32, u32) -> Error + Send + Sync>;

/// A buffer a recorded launch binds.
pub(crate) struct Bound {
    /// Kept alive for the graph (and, when only checking, until the check ends).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) handle: Handle,
    /// Whether its first use in the step read it (rather than overwrote it whole).
    pub(crate) read_first: bool,
}

/// What the rules collect while the step runs on one thread (only that thread's
/// launches count).
pub(crate) struct Recording {
    /// Whether a CUDA graph is being captured (otherwise the step runs, checked only).
    pub(crate) graph: bool,
    /// Buffers made before the recording have ids below this one.
    pub(crate) first_buffer: u64,
    /// Every buffer a recorded launch binds, by id.
    pub(crate) bound: HashMap<u64, Bound>,
    /// The error flags of recorded launches, with their reports.
    pub(crate) checks: Vec<(u64, Handle, Report)>,
    /// The first thing the step did that a replay could not repeat.
    pub(crate) refused: Option<String>,
}

/// The recordings of one device, one per recording thread (threads record
/// independently: each has its own stream). It owns its state; the device calls it
/// with buffer ids and handles, so the rules depend on nothing else in the crate.
#[derive(Default)]
pub(crate) struct Recorder {
    recordings: Mutex<HashMap<ThreadId, Recording>>,
    /// How many threads are recording (read on every launch and buffer drop, without a
    /// lock).
    active: AtomicUsize,
}

impl Recorder {
    /// Starts recording the calling thread's launches on device `device` (`graph`: for
    /// a CUDA graph); buffers with ids below `first_buffer` were made before.
    pub(crate) fn begin(&self, device: &str, graph: bool, first_buffer: u64) -> Result<()> {
        let thread = std::thread::current().id();
        let mut recordings = self.recordings.lock().expect("recording");
        if recordings.contains_key(&thread) {
            return Err(Error::Device(format!(
                "{device}: this thread is already capturing (or checking) a step"
            )));
        }
        recordings.insert(
            thread,
            Recording {
                graph,
                first_buffer,
                bound: HashMap::new(),
                checks: Vec::new(),
                refused: None,
            },
        );
        self.active.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// Stops the calling thread's recording and returns what was recorded.
    pub(crate) fn end(&self) -> Recording {
        let mut recordings = self.recordings.lock().expect("recording");
        let r = recordings
            .remove(&std::thread::current().id())
            .expect("a recording in progress on this thread");
        self.active.fetch_sub(1, Ordering::AcqRel);
        r
    }

    /// Whether any thread is recording (a lock-free test for the hot paths).
    pub(crate) fn is_active(&self) -> bool {
        self.active.load(Ordering::Acquire) > 0
    }

    /// The calling thread's recording, if it has one, under the lock.
    fn with_mine<T>(&self, f: impl FnOnce(&mut Recording) -> T) -> Option<T> {
        if !self.is_active() {
            return None;
        }
        let mut recordings = self.recordings.lock().expect("recording");
        recordings.get_mut(&std::thread::current().id()).map(f)
    }

    /// Whether the calling thread records (captures a graph or checks a capture's rules).
    pub(crate) fn recording_here(&self) -> bool {
        self.with_mine(|_| ()).is_some()
    }

    /// Whether the calling thread captures a CUDA graph (not only checks the rules).
    pub(crate) fn capturing_graph_here(&self) -> bool {
        self.with_mine(|r| r.graph).unwrap_or(false)
    }

    /// An error if the calling thread is recording: `what` (a host copy, a read, a
    /// synchronisation) cannot be replayed by a graph. The recording remembers it, so
    /// it fails even if the step swallowed the error.
    pub(crate) fn refuse(&self, what: &str) -> Result<()> {
        match self.with_mine(|r| {
            let msg = format!(
                "{what} cannot be captured into a CUDA graph: a replay repeats only device \
                 work; move it out of the captured step (upload inputs before capturing and \
                 write new values into them between replays, read results after a replay)"
            );
            r.refused.get_or_insert_with(|| msg.clone());
            msg
        }) {
            Some(msg) => Err(Error::Device(msg)),
            None => Ok(()),
        }
    }

    /// Notes that a launch binds buffer `id` (reading it, or writing part of it).
    pub(crate) fn note_bound(&self, id: u64, handle: &Handle) {
        self.note(id, handle, true);
    }

    /// Notes that a launch overwrites the whole of buffer `id` without reading it.
    pub(crate) fn note_overwritten(&self, id: u64, handle: &Handle) {
        self.note(id, handle, false);
    }

    fn note(&self, id: u64, handle: &Handle, read_first: bool) {
        self.with_mine(|r| {
            r.bound.entry(id).or_insert_with(|| Bound {
                handle: handle.clone(),
                read_first,
            });
        });
    }

    /// Keeps a launch's error flag with the calling thread's recording, if it has one
    /// (the flag is read after the recording ends); `false` when it has none.
    pub(crate) fn keep_check(&self, id: u64, flag: &Handle, report: &Report) -> bool {
        self.with_mine(|r| r.checks.push((id, flag.clone(), report.clone())))
            .is_some()
    }

    /// Notes that buffer `id` is no longer referenced (see the module docs).
    pub(crate) fn note_released(&self, id: u64) {
        self.with_mine(|r| {
            let carried_state =
                id < r.first_buffer && r.bound.get(&id).is_some_and(|b| b.read_first);
            if carried_state && r.refused.is_none() {
                r.refused = Some(
                    "the captured step read a buffer made before the capture and then replaced \
                     it with a new one (a parameter or an optimizer buffer not updated in place), \
                     so replays would keep reading the old value. Run the step once before \
                     capturing (optimizers create their buffers on the first step) and use an \
                     optimizer that updates in place (SGD with momentum)"
                        .to_string(),
                );
            }
        });
    }
}
