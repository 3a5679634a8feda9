//! Cached programs replayed as captured graphs, on backends that capture (CUDA): the
//! host work of a cache hit's run — a launch per kernel — becomes one graph launch.
//!
//! A graph fixes what a program's run leaves open: the sizes and strides of its inputs,
//! the buffers it reads and the buffers it writes. So the cache keeps, per program, one
//! length for each set of input layouts it has run with (a batch size, a sequence
//! length; at most [`MAX_LENGTHS`], least recently used dropped). A length seen once
//! runs plainly and notes which buffers its inputs were in; seen again, it is captured
//! on a program of its own, whose buffers nobody else writes:
//! - an input found in the same buffer both times (a parameter updated in place) is
//!   read where it is by every replay, which checks first that it is still there;
//! - any other input (a new batch each step) is copied into a buffer of the capture's
//!   own before each replay;
//! - the outputs are the capture's buffers, handed out again by each replay: a replay
//!   only runs when the caller has let go of the last one's outputs (an output that
//!   is a view of an input, a reshape, is handed out as a view of the caller's input).
//!
//! Each captured length keeps a program's worth of buffers of its own (activations and
//! gradients), which is what bounds the lengths kept.
//!
//! Anything else runs plainly, never wrongly: outputs still held (a loss kept in a
//! list), another thread, a capture in progress (the program is then part of the outer
//! one), a graph that draws random numbers (a replay would repeat its draws), a
//! capture the backend refused. An input found in another buffer undoes the capture,
//! and the length is captured again with that input copied, at most [`MAX_CAPTURES`]
//! times.

use crate::jit::{run_plain, CacheStats};
use kiln_fusion::{Program, RunContext, Seeds};
use kiln_tensor::{Backend, DType, Error, Layout, RawTensor, Replay, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::ThreadId;

/// The input layouts a program keeps captures for, beyond which the least recently
/// used is dropped (each holds its own buffers).
pub const MAX_LENGTHS: usize = 8;

/// How many times one length is captured before it runs plainly for good.
pub const MAX_CAPTURES: u32 = 4;

static ENABLED: AtomicBool = AtomicBool::new(true);

/// Turns the replay of cached programs on or off for every backend (on by default;
/// it only happens where the backend captures, see [`kiln_tensor::Backend::captures`]).
/// Off, every run launches its kernels one by one; captures already made are kept
/// for when it is turned on again.
pub fn set_replay(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// Whether cached programs are replayed where the backend captures (see
/// [`set_replay`]).
pub fn replay_enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Whether a run on `device` now may be captured or replayed.
pub(crate) fn applies<B: Backend>(device: &B::Device) -> bool {
    replay_enabled() && B::captures(device) && !B::capturing(device)
}

/// The lengths of one cached program.
pub(crate) struct Lengths<B: Backend> {
    list: Vec<Length<B>>,
    clock: u64,
}

impl<B: Backend> Default for Lengths<B> {
    fn default() -> Self {
        Lengths {
            list: Vec::new(),
            clock: 0,
        }
    }
}

/// One set of input layouts of a program, and what the cache did with it.
struct Length<B: Backend> {
    layouts: Vec<(Layout, DType)>,
    last_used: u64,
    captures: u32,
    state: State<B>,
}

enum State<B: Backend> {
    /// Ran once, with its inputs in these buffers.
    Seen(Vec<Option<u64>>),
    Captured(Captured<B>),
    /// Runs plainly: the backend refused to capture it, or it was captured too often.
    Plain,
}

/// A length's program captured as a graph.
struct Captured<B: Backend> {
    replay: Box<dyn Replay>,
    thread: ThreadId,
    inputs: Vec<Input<B>>,
    /// The run's outputs, in order.
    outputs: Vec<Output<B>>,
}

/// Where a captured graph's output is.
enum Output<B: Backend> {
    /// In a buffer each replay writes, handed out again; nobody else holds it when
    /// `free` counts its holders (this and the other outputs in it).
    Written { value: RawTensor<B>, free: usize },
    /// In input `k`'s buffer, seen through `layout` (a view of the input, which the
    /// graph never writes): handed out as a view of the caller's input.
    InInput { k: usize, layout: Layout },
}

/// How a captured graph reads one input.
enum Input<B: Backend> {
    /// In the caller's buffer with this id, where it was when captured.
    Shared(u64),
    /// In this buffer of the capture's own, the caller's value copied in first.
    Copied(RawTensor<B>),
}

/// Whether a captured graph can replay for a run's inputs.
enum Ready {
    Yes,
    /// A shared input is in another buffer: the capture no longer reads it.
    Moved,
    /// Not now (outputs of the last replay still held, another thread): run plainly.
    Busy,
}

impl<B: Backend> Captured<B> {
    fn ready(&self, inputs: &[&RawTensor<B>]) -> Ready {
        for (input, t) in self.inputs.iter().zip(inputs) {
            if let Input::Shared(id) = input {
                if B::buffer_id(t.storage()) != Some(*id) {
                    return Ready::Moved;
                }
            }
        }
        let held = self.outputs.iter().any(|o| match o {
            Output::Written { value, free } => Arc::strong_count(value.storage()) != *free,
            Output::InInput { .. } => false,
        });
        if held || std::thread::current().id() != self.thread {
            return Ready::Busy;
        }
        Ready::Yes
    }

    fn replay(&self, inputs: &[&RawTensor<B>]) -> Result<Vec<RawTensor<B>>> {
        for (input, t) in self.inputs.iter().zip(inputs) {
            if let Input::Copied(own) = input {
                if !B::assign(own, t)? {
                    return Err(Error::invalid(
                        "replay",
                        format!("the {} backend stopped writing buffers in place", B::NAME),
                    ));
                }
            }
        }
        self.replay.replay()?;
        self.outputs(inputs)
    }

    /// The outputs, the views of inputs seen in the caller's `inputs`.
    fn outputs(&self, inputs: &[&RawTensor<B>]) -> Result<Vec<RawTensor<B>>> {
        (self.outputs.iter())
            .map(|o| match o {
                Output::Written { value, .. } => Ok(value.clone()),
                Output::InInput { k, layout } => {
                    let t = inputs[*k];
                    RawTensor::from_arc(t.storage().clone(), *layout, t.device().clone())
                }
            })
            .collect()
    }
}

/// Runs `program` on `inputs`: replayed where a capture of it at these layouts holds,
/// captured the second time they are seen, else plainly.
pub(crate) fn run<B: Backend>(
    lengths: &mut Lengths<B>,
    program: &mut Program<B>,
    stats: &mut CacheStats,
    device: &B::Device,
    inputs: &[&RawTensor<B>],
) -> Result<Vec<RawTensor<B>>> {
    lengths.clock += 1;
    let clock = lengths.clock;
    let buffers =
        || -> Vec<Option<u64>> { inputs.iter().map(|t| B::buffer_id(t.storage())).collect() };
    let layouts: Vec<(Layout, DType)> = inputs.iter().map(|t| (*t.layout(), t.dtype())).collect();
    let Some(at) = lengths.list.iter().position(|l| l.layouts == layouts) else {
        if lengths.list.len() >= MAX_LENGTHS {
            let oldest = (0..lengths.list.len())
                .min_by_key(|&i| lengths.list[i].last_used)
                .expect("not empty");
            lengths.list.swap_remove(oldest);
        }
        lengths.list.push(Length {
            layouts,
            last_used: clock,
            captures: 0,
            state: State::Seen(buffers()),
        });
        return run_plain(program, device, &[], inputs);
    };
    let length = &mut lengths.list[at];
    length.last_used = clock;
    match &length.state {
        State::Plain => run_plain(program, device, &[], inputs),
        State::Seen(seen) => {
            let shared: Vec<bool> = (seen.iter().zip(buffers()))
                .map(|(&then, now)| then.is_some() && then == now)
                .collect();
            length.captures += 1;
            match capture(program, device, inputs, &shared)? {
                Capture::Made(captured, outputs) => {
                    stats.captures += 1;
                    length.state = State::Captured(captured);
                    // The capture's own program does this length's work now.
                    program.release_buffers();
                    Ok(outputs)
                }
                Capture::RanOnly(outputs) => {
                    length.state = State::Plain;
                    Ok(outputs)
                }
                Capture::Refused => {
                    length.state = State::Plain;
                    run_plain(program, device, &[], inputs)
                }
            }
        }
        State::Captured(captured) => match captured.ready(inputs) {
            Ready::Yes => {
                stats.replays += 1;
                captured.replay(inputs)
            }
            Ready::Busy => run_plain(program, device, &[], inputs),
            Ready::Moved => {
                length.state = if length.captures >= MAX_CAPTURES {
                    State::Plain
                } else {
                    State::Seen(buffers())
                };
                run_plain(program, device, &[], inputs)
            }
        },
    }
}

/// What capturing a length gave.
enum Capture<B: Backend> {
    /// A graph, and the outputs of the run that made it.
    Made(Captured<B>, Vec<RawTensor<B>>),
    /// The outputs of a run that cannot be replayed (an output in an input's buffer).
    RanOnly(Vec<RawTensor<B>>),
    /// The backend refused: nothing ran.
    Refused,
}

/// Captures a copy of `program` run on `inputs`, reading the `shared` ones where they
/// are and copies of the others.
fn capture<B: Backend>(
    program: &Program<B>,
    device: &B::Device,
    inputs: &[&RawTensor<B>],
    shared: &[bool],
) -> Result<Capture<B>> {
    // Errors of earlier work are the caller's: reported here, not taken for a refusal.
    B::synchronize(device)?;
    let mut bound = Vec::with_capacity(inputs.len());
    let mut read = Vec::with_capacity(inputs.len());
    for (&t, &shared) in inputs.iter().zip(shared) {
        if let (true, Some(id)) = (shared, B::buffer_id(t.storage())) {
            bound.push(Input::Shared(id));
            read.push(t.clone());
            continue;
        }
        let own = RawTensor::from_storage(
            B::alloc(device, t.dtype(), t.numel())?,
            *t.dims(),
            device.clone(),
        )?;
        if !B::assign(&own, t)? {
            return Ok(Capture::Refused);
        }
        bound.push(Input::Copied(own.clone()));
        read.push(own);
    }
    let read: Vec<&RawTensor<B>> = read.iter().collect();
    let mut copy = Program::new(program.plan().clone(), program.natives());
    // Run once before capturing, as a captured step must be: its buffers allocated, and
    // whatever the backend caches for them (kernel metadata) made outside the capture.
    drop(run_plain(&mut copy, device, &[], &read)?);
    let mut outputs = None;
    let replay = B::capture(device, &mut || {
        let mut cx = RunContext::new(device).seeds(Seeds::Table(&[]));
        let ran = copy.run(&mut cx, &read)?.ok_or_else(|| {
            Error::invalid(
                "replay",
                "the program does not describe these inputs' sizes",
            )
        })?;
        outputs = Some(ran.collect::<Vec<_>>());
        Ok(())
    });
    let replay = match replay {
        Ok(replay) => replay,
        Err(e) => {
            log::debug!(
                "kiln-dynamic: a program on {} runs without replay: {e}",
                B::device_name(device)
            );
            return Ok(Capture::Refused);
        }
    };
    let ran = outputs.ok_or_else(|| Error::invalid("replay", "a captured run gave no outputs"))?;
    // The graph keeps the buffers it writes; the outputs are all it hands out.
    drop(copy);
    let mut outputs = Vec::with_capacity(ran.len());
    for o in &ran {
        let Some(k) = read
            .iter()
            .position(|t| Arc::ptr_eq(t.storage(), o.storage()))
        else {
            outputs.push(Output::Written {
                value: o.clone(),
                free: 0,
            });
            continue;
        };
        // A view of an input copied into another layout would not be the caller's.
        if read[k].layout() != inputs[k].layout() {
            return Ok(Capture::RanOnly(ran));
        }
        outputs.push(Output::InInput {
            k,
            layout: *o.layout(),
        });
    }
    drop(ran);
    for o in &mut outputs {
        if let Output::Written { value, free } = o {
            *free = Arc::strong_count(value.storage());
        }
    }
    let captured = Captured {
        replay,
        thread: std::thread::current().id(),
        inputs: bound,
        outputs,
    };
    let outputs = captured.outputs(inputs)?;
    Ok(Capture::Made(captured, outputs))
}
