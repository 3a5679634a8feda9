//! [`DataLoader`]: a [`Dataset`] read in batches — seeded shuffling that a resumed run
//! repeats, examples stacked into `[batch, ..]` tensors, background reading on worker
//! threads with at most [`LoaderConfig::prefetch`] batches ahead, and the final short
//! batch kept or dropped.
//!
//! The epoch iterator is not generic over the dataset (it reads a `dyn Dataset`), so a
//! program compiles it once, whatever its datasets.

use crate::dataset::{Dataset, Example, Field, Values};
use kiln_tensor::{rng, Backend, Element, Error, RawTensor, Result, Shape, Tensor};
use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// What happens to the examples left over when the dataset's size is not a multiple
/// of the batch size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LastBatch {
    /// They form a last, shorter batch (PyTorch's `drop_last=False`).
    Keep,
    /// They are left out of this epoch (`drop_last=True`); a shuffled epoch leaves out
    /// different ones each time.
    Drop,
}

/// How a [`DataLoader`] reads its dataset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoaderConfig {
    /// Examples per batch (at least 1).
    pub batch_size: usize,
    /// Whether each epoch visits the examples in a new order.
    pub shuffle: bool,
    /// The seed of the orders: epoch `e` of seed `s` has the same order in every run.
    pub seed: u64,
    /// The final short batch kept or dropped.
    pub last_batch: LastBatch,
    /// Threads reading examples in the background (0: read on the caller's thread
    /// when it asks for a batch).
    pub workers: usize,
    /// The most batches read ahead of the one handed out (at least 1): the loader's
    /// memory is bounded by that many batches.
    pub prefetch: usize,
}

impl Default for LoaderConfig {
    /// Batches of 32, shuffled with seed 0, the last batch kept, two worker threads,
    /// two batches ahead.
    fn default() -> Self {
        LoaderConfig {
            batch_size: 32,
            shuffle: true,
            seed: 0,
            last_batch: LastBatch::Keep,
            workers: 2,
            prefetch: 2,
        }
    }
}

impl LoaderConfig {
    /// The same settings for evaluation data: every example once, in index order (no
    /// shuffling, the last batch kept).
    pub fn for_evaluation(self) -> Self {
        LoaderConfig {
            shuffle: false,
            last_batch: LastBatch::Keep,
            ..self
        }
    }
}

/// The most worker threads a loader starts.
pub const MAX_WORKERS: usize = 256;

/// A seeded permutation of `0..n` (Fisher–Yates over Kiln's counter-based generator),
/// different for every `(seed, epoch)`.
pub fn shuffled(n: usize, seed: u64, epoch: u64) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..n).collect();
    let key = rng::stream_key(seed ^ epoch.wrapping_mul(0x9e37_79b9_7f4a_7c15), 7);
    for i in (1..n).rev() {
        let j = ((rng::bits(key, i as u32) as u64 * (i as u64 + 1)) >> 32) as usize;
        idx.swap(i, j);
    }
    idx
}

/// One batch on the host: inputs and targets stacked along a first axis of examples.
#[derive(Clone, Debug, PartialEq)]
pub struct HostBatch {
    /// Inputs, dims `[n, ..]`.
    pub input: Field,
    /// Targets, dims `[n, ..]`.
    pub target: Field,
    /// The dataset's indices of the examples, in batch order.
    pub indices: Vec<usize>,
}

impl HostBatch {
    /// Examples in the batch.
    pub fn len(&self) -> usize {
        self.indices.len()
    }

    /// Whether it has none.
    pub fn is_empty(&self) -> bool {
        self.indices.is_empty()
    }

    /// The batch on `device` (its host values moved, not copied, into the upload).
    pub fn to_device<B: Backend>(self, device: &B::Device) -> Result<DeviceBatch<B>> {
        Ok(DeviceBatch {
            input: to_raw(self.input, device)?,
            target: to_raw(self.target, device)?,
        })
    }
}

fn to_raw<B: Backend>(field: Field, device: &B::Device) -> Result<RawTensor<B>> {
    match field.values {
        Values::F32(v) => RawTensor::from_vec(v, &field.dims, device),
        Values::I32(v) => RawTensor::from_vec(v, &field.dims, device),
    }
}

/// One batch on a device.
#[derive(Clone, Debug)]
pub struct DeviceBatch<B: Backend> {
    /// Inputs, dims `[n, ..]`.
    pub input: RawTensor<B>,
    /// Targets, dims `[n, ..]`.
    pub target: RawTensor<B>,
}

impl<B: Backend> DeviceBatch<B> {
    /// The inputs as a typed tensor (`Tensor<B, Batch<784>>`): an error naming
    /// both shapes when the data does not fit the type.
    pub fn input_as<S: Shape, E: Element>(&self) -> Result<Tensor<B, S, E>> {
        Tensor::from_raw(self.input.clone()).map_err(|e| e.with_context("the batch's inputs"))
    }

    /// The targets as a typed tensor (`Tensor<B, (Dyn,), i32>` for class labels).
    pub fn target_as<S: Shape, E: Element>(&self) -> Result<Tensor<B, S, E>> {
        Tensor::from_raw(self.target.clone()).map_err(|e| e.with_context("the batch's targets"))
    }
}

/// Examples stacked into a batch; an error naming the first example whose dims or
/// dtype differ from the batch's first.
pub fn collate(examples: Vec<Example>, indices: Vec<usize>) -> Result<HostBatch> {
    let (inputs, targets): (Vec<Field>, Vec<Field>) =
        examples.into_iter().map(|e| (e.input, e.target)).unzip();
    Ok(HostBatch {
        input: stack("input", inputs, &indices)?,
        target: stack("target", targets, &indices)?,
        indices,
    })
}

fn stack(what: &str, fields: Vec<Field>, indices: &[usize]) -> Result<Field> {
    let Some(first) = fields.first() else {
        return Err(Error::invalid("collate", "a batch of no examples"));
    };
    let (dims, dtype) = (first.dims.clone(), first.values.dtype());
    let per = first.values.len();
    for (k, f) in fields.iter().enumerate() {
        if f.dims != dims || f.values.dtype() != dtype || f.values.len() != per {
            return Err(Error::shape(
                "collate",
                format!(
                    "example {}'s {what} is {} {:?} but example {}'s is {dtype} {dims:?}; \
                     examples of a batch must have one shape",
                    indices[k],
                    f.values.dtype(),
                    f.dims,
                    indices[0]
                ),
            ));
        }
    }
    let n = fields.len();
    let values = match dtype {
        kiln_tensor::DType::I32 => Values::I32(
            fields
                .into_iter()
                .flat_map(|f| match f.values {
                    Values::I32(v) => v,
                    Values::F32(_) => unreachable!("dtypes checked above"),
                })
                .collect(),
        ),
        _ => Values::F32(
            fields
                .into_iter()
                .flat_map(|f| match f.values {
                    Values::F32(v) => v,
                    Values::I32(_) => unreachable!("dtypes checked above"),
                })
                .collect(),
        ),
    };
    Ok(Field {
        dims: std::iter::once(n).chain(dims).collect(),
        values,
    })
}

/// A dataset read in batches (see the module docs).
///
/// ```
/// use kiln_data::{DataLoader, Field, InMemory, LoaderConfig, Values};
/// let inputs = Field::new(vec![5, 2], Values::F32((0..10).map(|v| v as f32).collect()))?;
/// let labels = Field::new(vec![5], Values::I32(vec![0, 1, 0, 1, 1]))?;
/// let loader = DataLoader::new(InMemory::new(inputs, labels)?, LoaderConfig {
///     batch_size: 2,
///     ..LoaderConfig::default()
/// })?;
/// let sizes: Vec<usize> = loader.epoch(0).map(|b| b.map(|b| b.len())).collect::<Result<_, _>>()?;
/// assert_eq!(sizes, [2, 2, 1]);
/// # Ok::<(), kiln_tensor::Error>(())
/// ```
pub struct DataLoader<D> {
    data: Arc<D>,
    config: LoaderConfig,
}

impl<D: Dataset + 'static> DataLoader<D> {
    /// A loader of `data`: an error for a batch size or prefetch of 0, more than
    /// [`MAX_WORKERS`] workers, an empty dataset, or one too small for a single batch
    /// when the last batch is dropped.
    pub fn new(data: D, config: LoaderConfig) -> Result<Self> {
        const OP: &str = "DataLoader";
        if config.batch_size == 0 {
            return Err(Error::invalid(OP, "the batch size must be at least 1"));
        }
        if config.prefetch == 0 {
            return Err(Error::invalid(OP, "prefetch must be at least 1 batch"));
        }
        if config.workers > MAX_WORKERS {
            return Err(Error::invalid(
                OP,
                format!("{} workers asked, at most {MAX_WORKERS}", config.workers),
            ));
        }
        if data.is_empty() {
            return Err(Error::invalid(OP, "the dataset has no examples"));
        }
        let loader = DataLoader {
            data: Arc::new(data),
            config,
        };
        if loader.batches_per_epoch() == 0 {
            return Err(Error::invalid(
                OP,
                format!(
                    "{} examples make no full batch of {} and the last batch is dropped",
                    loader.data.len(),
                    config.batch_size
                ),
            ));
        }
        Ok(loader)
    }

    /// The dataset.
    pub fn dataset(&self) -> &D {
        &self.data
    }

    /// How it reads.
    pub fn config(&self) -> &LoaderConfig {
        &self.config
    }

    /// Batches in one epoch.
    pub fn batches_per_epoch(&self) -> usize {
        let (n, b) = (self.data.len(), self.config.batch_size);
        match self.config.last_batch {
            LastBatch::Keep => n.div_ceil(b),
            LastBatch::Drop => n / b,
        }
    }

    /// The order epoch `epoch` visits the examples in.
    pub fn order(&self, epoch: u64) -> Vec<usize> {
        let n = self.data.len();
        match self.config.shuffle {
            true => shuffled(n, self.config.seed, epoch),
            false => (0..n).collect(),
        }
    }

    /// The batches of epoch `epoch` (counted from 0), in order.
    pub fn epoch(&self, epoch: u64) -> Batches {
        self.start(epoch, 0)
    }

    /// The batches of epoch `epoch` from batch `first` on, as a run resumed after
    /// `first` batches of that epoch sees them (the same examples in the same order);
    /// an error if the epoch has fewer batches.
    pub fn epoch_from(&self, epoch: u64, first: usize) -> Result<Batches> {
        let total = self.batches_per_epoch();
        if first > total {
            return Err(Error::invalid(
                "DataLoader::epoch_from",
                format!("batch {first} of an epoch of {total} batches"),
            ));
        }
        Ok(self.start(epoch, first))
    }

    fn start(&self, epoch: u64, first: usize) -> Batches {
        let data: Arc<dyn Dataset> = self.data.clone();
        Batches::new(
            data,
            self.order(epoch),
            self.config,
            self.batches_per_epoch(),
            first,
        )
    }
}

/// The batches of one epoch (from [`DataLoader::epoch`]): `Ok` batches in order, or
/// the first error, after which it ends. Dropping it stops its workers.
pub struct Batches {
    reader: Arc<Reader>,
    next: usize,
    end: usize,
    workers: Vec<JoinHandle<()>>,
    failed: bool,
}

/// What the workers and the consumer of one epoch share.
struct Reader {
    data: Arc<dyn Dataset>,
    order: Vec<usize>,
    batch_size: usize,
    prefetch: usize,
    end: usize,
    state: Mutex<Progress>,
    changed: Condvar,
}

/// Which batches are taken, handed out and waiting.
struct Progress {
    /// The next batch a worker takes.
    next_taken: usize,
    /// The next batch handed out.
    next_out: usize,
    /// Batches read and not yet handed out.
    ready: BTreeMap<usize, Result<HostBatch>>,
    /// Set when the epoch is dropped or has failed.
    stop: bool,
}

impl Reader {
    fn lock(&self) -> MutexGuard<'_, Progress> {
        // A worker's panic is caught before it could poison the lock; this is belt
        // and braces.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Batch `k` read from the dataset; a panic in the dataset becomes an error.
    fn read(&self, k: usize) -> Result<HostBatch> {
        let lo = k * self.batch_size;
        let hi = (lo + self.batch_size).min(self.order.len());
        let indices = self.order[lo..hi].to_vec();
        let read = catch_unwind(AssertUnwindSafe(|| {
            let examples = indices
                .iter()
                .map(|&i| self.data.get(i))
                .collect::<Result<Vec<_>>>()?;
            collate(examples, indices.clone())
        }));
        read.unwrap_or_else(|panic| {
            let why = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("a panic");
            Err(Error::invalid(
                "DataLoader",
                format!("reading examples {indices:?} panicked: {why}"),
            ))
        })
    }

    /// A worker: takes the next batch while it is within `prefetch` of the one handed
    /// out, reads it, and leaves it ready.
    fn work(&self) {
        loop {
            let k = {
                let mut s = self.lock();
                loop {
                    if s.stop || s.next_taken >= self.end {
                        return;
                    }
                    if s.next_taken < s.next_out + self.prefetch {
                        break;
                    }
                    s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
                }
                s.next_taken += 1;
                s.next_taken - 1
            };
            let batch = self.read(k);
            self.lock().ready.insert(k, batch);
            self.changed.notify_all();
        }
    }
}

impl Batches {
    fn new(
        data: Arc<dyn Dataset>,
        order: Vec<usize>,
        config: LoaderConfig,
        end: usize,
        first: usize,
    ) -> Self {
        let reader = Arc::new(Reader {
            data,
            order,
            batch_size: config.batch_size,
            prefetch: config.prefetch,
            end,
            state: Mutex::new(Progress {
                next_taken: first,
                next_out: first,
                ready: BTreeMap::new(),
                stop: false,
            }),
            changed: Condvar::new(),
        });
        let workers = (0..config.workers.min(end - first))
            .map(|_| {
                let reader = reader.clone();
                std::thread::spawn(move || reader.work())
            })
            .collect();
        Batches {
            reader,
            next: first,
            end,
            workers,
            failed: false,
        }
    }

    /// Batches left to hand out.
    pub fn remaining(&self) -> usize {
        if self.failed {
            0
        } else {
            self.end - self.next
        }
    }
}

impl Iterator for Batches {
    type Item = Result<HostBatch>;

    fn next(&mut self) -> Option<Result<HostBatch>> {
        if self.failed || self.next >= self.end {
            return None;
        }
        let k = self.next;
        let batch = if self.workers.is_empty() {
            self.reader.read(k)
        } else {
            let mut s = self.reader.lock();
            let batch = loop {
                if let Some(b) = s.ready.remove(&k) {
                    break b;
                }
                s = self
                    .reader
                    .changed
                    .wait(s)
                    .unwrap_or_else(|e| e.into_inner());
            };
            s.next_out = k + 1;
            s.stop |= batch.is_err();
            drop(s);
            self.reader.changed.notify_all();
            batch
        };
        self.next += 1;
        self.failed = batch.is_err();
        Some(batch)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, Some(self.remaining()))
    }
}

impl Drop for Batches {
    fn drop(&mut self) {
        self.reader.lock().stop = true;
        self.reader.changed.notify_all();
        for w in self.workers.drain(..) {
            // A worker catches its dataset's panics; one that still panicked has
            // nothing left to report here.
            let _ = w.join();
        }
    }
}
