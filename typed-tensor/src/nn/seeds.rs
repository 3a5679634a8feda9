//! The seeds a `#[model]`'s training steps draw random values (dropout masks) with: a
//! step counter on the host, or, for a step captured as a graph, a seed in device
//! memory that the host rewrites before each replay.

use crate::backend::Backend;
use crate::dtype::HostData;
use crate::error::{Error, Result};
use crate::raw::RawTensor;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// The seed of a model's `n`-th training step (what `#[model]`'s `_and_grad` methods
/// draw dropout masks from: the mask of the `i`-th dropout layer uses `step_seed(n) ^ i`).
pub fn step_seed(n: u64) -> u64 {
    n.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x6b69_6c6e
}

/// Where one training step's random draws get their seed.
#[derive(Clone, Debug)]
pub enum StepSeed<B: Backend> {
    /// This seed, known on the host and passed to each draw.
    Host(u64),
    /// The seed in this device buffer (`i32` of dims `[2]`, low word first), read by
    /// the kernels that draw ([`Backend::draw_with_device_seed`]).
    Device(RawTensor<B>),
}

impl<B: Backend> StepSeed<B> {
    /// The seed on the host, or an error naming `what` needs it there.
    pub fn on_host(&self, what: &str) -> Result<u64> {
        match self {
            StepSeed::Host(seed) => Ok(*seed),
            StepSeed::Device(_) => Err(Error::invalid(
                "seed",
                format!("{what} draws with a seed on the host, but this step's seed is in device memory (a captured step)"),
            )),
        }
    }
}

/// A model's training-step counter, from which each step's seed derives
/// ([`step_seed`]), and, while a captured step runs, that seed's copy in device memory.
#[derive(Debug)]
pub struct StepSeeds<B: Backend> {
    /// Where the counter started: the model's initialisation seed.
    start: u64,
    steps: AtomicU64,
    /// Mixed into every seed: a data-parallel rank's own draws (0: none).
    rank: AtomicU64,
    on_device: Mutex<Option<RawTensor<B>>>,
}

impl<B: Backend> StepSeeds<B> {
    /// A counter starting at `start` (a model starts at its initialisation seed).
    pub fn new(start: u64) -> Self {
        StepSeeds {
            start,
            steps: AtomicU64::new(start),
            rank: AtomicU64::new(0),
            on_device: Mutex::new(None),
        }
    }

    /// The counter: the step number the next seed is taken for.
    pub fn steps(&self) -> u64 {
        self.steps.load(Ordering::Relaxed)
    }

    /// Sets the counter (a resumed run goes on from its step count).
    pub fn set_steps(&self, n: u64) {
        self.steps.store(n, Ordering::Relaxed);
    }

    /// Makes the draws those of data-parallel rank `rank`: ranks that count the same
    /// steps draw different masks over their different examples, as one rank drawing
    /// for the whole batch would. Rank 0 draws what a run without ranks draws.
    pub fn set_rank(&self, rank: u64) {
        self.rank.store(rank, Ordering::Relaxed);
    }

    /// The seed of step `n` on this counter's rank.
    fn seed_at(&self, n: u64) -> u64 {
        let rank = self.rank.load(Ordering::Relaxed);
        step_seed(n) ^ rank.wrapping_mul(0xd1b5_4a32_d192_ed03)
    }

    /// The training steps taken since the counter started (what a checkpoint records
    /// as batch norm's `num_batches_tracked`).
    pub fn taken(&self) -> u64 {
        self.steps().wrapping_sub(self.start)
    }

    /// Sets the counter to `n` training steps past its start (a model loaded from a
    /// checkpoint that recorded them).
    pub fn set_taken(&self, n: u64) {
        self.set_steps(self.start.wrapping_add(n));
    }

    /// The seed the next training step draws with. On the host: the next step's,
    /// advancing the counter. In device memory: the buffer that
    /// [`StepSeeds::advance_on_device`] last wrote (the counter is left alone).
    pub fn next(&self) -> StepSeed<B> {
        match &*self.on_device.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(buffer) => StepSeed::Device(buffer.clone()),
            None => StepSeed::Host(self.seed_at(self.steps.fetch_add(1, Ordering::Relaxed))),
        }
    }

    /// Takes the next step's seed (advancing the counter) and writes it into device
    /// memory on `device`, where every training step reads it until the next call:
    /// call it before each step of a captured loop, outside the capture. A backend
    /// that captures has the value written into the same buffer each time (the one a
    /// captured step reads); others get a fresh buffer.
    #[inline(never)]
    pub fn advance_on_device(&self, device: &B::Device) -> Result<()> {
        let mut on_device = self.on_device.lock().unwrap_or_else(|e| e.into_inner());
        let seed = self.seed_at(self.steps.fetch_add(1, Ordering::Relaxed));
        let words = vec![seed as u32 as i32, (seed >> 32) as u32 as i32];
        match &*on_device {
            Some(buffer) if buffer.device() == device && B::captures(device) => {
                B::write_host(buffer, &HostData::I32(words))
            }
            _ => {
                *on_device = Some(RawTensor::from_vec(words, &[2], device)?);
                Ok(())
            }
        }
    }

    /// Returns to seeds on the host; later steps go on counting from where the
    /// device's left off.
    pub fn keep_on_host(&self) {
        *self.on_device.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}
