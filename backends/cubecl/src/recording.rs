//! The rules of a graph capture, kept while a step runs on one thread: which buffers
//! its launches bind (a graph keeps them alive and replays on them), which error flags
//! they leave, and the first thing the step did that a replay could not repeat. A CUDA
//! graph capture (`graph::CudaGraph`) records under these rules; on any runtime,
//! [`CubeDevice::check_capturable`] runs a step under them without capturing it, so
//! that the rules are tested where no CUDA device is (CI's lavapipe).
//!
//! What a replay cannot repeat: a copy from the host (an upload, a new kernel metadata
//! buffer), a read or a synchronisation, and releasing a buffer made before the capture
//! whose first use in the step was a read: the step then carried state in it (a
//! parameter, an optimizer buffer) and replaced it with a new buffer, so replays would
//! keep reading the old value. A buffer the step wrote before reading (a program's
//! scratch slot) may be released: each replay writes it again first.

use crate::device::{DeviceState, KilnRuntime, Report};
use crate::storage::CubeStorage;
use crate::CubeDevice;
use cubecl::server::Handle;
use kiln_tensor::{Error, Result};
use std::collections::HashMap;
use std::sync::atomic::Ordering;

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

impl<R: KilnRuntime> DeviceState<R> {
    /// Starts recording the calling thread's launches (`graph`: for a CUDA graph).
    /// Threads record independently (each has its own stream).
    pub(crate) fn begin_recording(&self, graph: bool) -> Result<()> {
        let thread = std::thread::current().id();
        let mut recordings = self.recording.lock().expect("recording");
        if recordings.contains_key(&thread) {
            return Err(Error::Device(format!(
                "{}: this thread is already capturing (or checking) a step",
                self.name
            )));
        }
        recordings.insert(
            thread,
            Recording {
                graph,
                first_buffer: self.next_buffer.load(Ordering::Relaxed),
                bound: HashMap::new(),
                checks: Vec::new(),
                refused: None,
            },
        );
        self.recording_active.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// Stops the calling thread's recording and returns what was recorded.
    pub(crate) fn end_recording(&self) -> Recording {
        let mut recordings = self.recording.lock().expect("recording");
        let r = recordings
            .remove(&std::thread::current().id())
            .expect("a recording in progress on this thread");
        self.recording_active.fetch_sub(1, Ordering::AcqRel);
        r
    }

    /// The calling thread's recording, if it has one, under the lock.
    fn with_mine<T>(&self, f: impl FnOnce(&mut Recording) -> T) -> Option<T> {
        if self.recording_active.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut recordings = self.recording.lock().expect("recording");
        recordings.get_mut(&std::thread::current().id()).map(f)
    }

    /// Whether a CUDA graph is being captured on the calling thread.
    pub(crate) fn capturing_graph_here(&self) -> bool {
        self.with_mine(|r| r.graph).unwrap_or(false)
    }

    /// An error if the calling thread is recording: `what` (a host copy, a read, a
    /// synchronisation) cannot be replayed by a graph. The recording remembers it, so
    /// it fails even if the step swallowed the error.
    pub(crate) fn refuse_in_capture(&self, what: &str) -> Result<()> {
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

    /// Notes that a launch binds `s` (reading it, or writing part of it).
    pub(crate) fn note_bound(&self, s: &CubeStorage<R>) {
        self.with_mine(|r| {
            r.bound.entry(s.id).or_insert_with(|| Bound {
                handle: s.handle.clone(),
                read_first: true,
            });
        });
    }

    /// Notes that a launch overwrites the whole of `s` without reading it.
    pub(crate) fn note_overwritten(&self, s: &CubeStorage<R>) {
        self.with_mine(|r| {
            r.bound.entry(s.id).or_insert_with(|| Bound {
                handle: s.handle.clone(),
                read_first: false,
            });
        });
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

impl<R: KilnRuntime> CubeDevice<R> {
    /// Runs `step` (for real) under the rules of a CUDA graph capture, on any runtime:
    /// an error where capturing it would fail (a host copy, a read, state replaced
    /// instead of updated in place), else what `step` returned. Kernel errors of the
    /// step are reported as usual, at the next read.
    pub fn check_capturable<T>(&self, step: impl FnOnce() -> Result<T>) -> Result<T> {
        let state = &self.state;
        state.check_pending()?;
        state.begin_recording(false)?;
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(step));
        let recording = state.end_recording();
        let out = out.unwrap_or_else(|p| std::panic::resume_unwind(p));
        state.defer_checks(recording.checks)?;
        match recording.refused {
            Some(msg) => Err(Error::Device(msg)),
            None => out,
        }
    }
}
