//! The DataLoader: every example once per epoch, seeded orders a resumed run repeats,
//! workers and prefetch that change nothing but speed, bounded read-ahead, and one
//! clear error (never a hang) from a dataset that fails or panics.

use kiln_data::{
    collate, shuffled, DataLoader, Dataset, Example, Field, HostBatch, InMemory, LastBatch,
    LoaderConfig, Values,
};
use kiln_tensor::{Error, Result};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// `n` examples: input `[i, i]` as f32, target the class `i % 3`.
fn numbered(n: usize) -> InMemory {
    let xs = Field::new(
        vec![n, 2],
        Values::F32((0..n).flat_map(|i| [i as f32, i as f32]).collect()),
    )
    .unwrap();
    let ys = Field::new(
        vec![n],
        Values::I32((0..n).map(|i| (i % 3) as i32).collect()),
    )
    .unwrap();
    InMemory::new(xs, ys).unwrap()
}

fn config(batch_size: usize, workers: usize) -> LoaderConfig {
    LoaderConfig {
        batch_size,
        workers,
        seed: 11,
        ..LoaderConfig::default()
    }
}

fn all(loader_batches: impl Iterator<Item = Result<HostBatch>>) -> Vec<HostBatch> {
    loader_batches.collect::<Result<Vec<_>>>().unwrap()
}

#[test]
fn an_epoch_visits_every_example_once_in_a_seeded_order() {
    let loader = DataLoader::new(numbered(23), config(5, 2)).unwrap();
    assert_eq!(loader.batches_per_epoch(), 5);
    let epoch0 = all(loader.epoch(0));
    assert_eq!(
        epoch0.iter().map(HostBatch::len).collect::<Vec<_>>(),
        [5, 5, 5, 5, 3]
    );
    let mut seen: Vec<usize> = epoch0.iter().flat_map(|b| b.indices.clone()).collect();
    assert_ne!(seen, (0..23).collect::<Vec<_>>(), "shuffled");
    seen.sort();
    assert_eq!(seen, (0..23).collect::<Vec<_>>());
    // Inputs and targets follow the indices.
    for b in &epoch0 {
        let Values::F32(x) = &b.input.values else {
            panic!()
        };
        let Values::I32(y) = &b.target.values else {
            panic!()
        };
        assert_eq!(b.input.dims, [b.len(), 2]);
        assert_eq!(b.target.dims, [b.len()]);
        for (k, &i) in b.indices.iter().enumerate() {
            assert_eq!(x[2 * k], i as f32);
            assert_eq!(y[k], (i % 3) as i32);
        }
    }
    // The same seed and epoch: the same order, in another loader too; another epoch
    // or seed: another order.
    let again = DataLoader::new(numbered(23), config(5, 0)).unwrap();
    assert_eq!(all(again.epoch(0)), epoch0);
    assert_ne!(all(loader.epoch(1)), epoch0);
    let other_seed = DataLoader::new(
        numbered(23),
        LoaderConfig {
            seed: 12,
            ..config(5, 2)
        },
    )
    .unwrap();
    assert_ne!(all(other_seed.epoch(0)), epoch0);
    // For evaluation: in index order, the short last batch kept whatever the training
    // settings say.
    let training = LoaderConfig {
        last_batch: LastBatch::Drop,
        ..config(3, 1)
    };
    let plain = DataLoader::new(numbered(7), training.for_evaluation()).unwrap();
    assert_eq!(plain.batches_per_epoch(), 3);
    let order: Vec<usize> = all(plain.epoch(4))
        .iter()
        .flat_map(|b| b.indices.clone())
        .collect();
    assert_eq!(order, (0..7).collect::<Vec<_>>());
}

#[test]
fn the_last_batch_is_dropped_when_asked() {
    let loader = DataLoader::new(
        numbered(23),
        LoaderConfig {
            last_batch: LastBatch::Drop,
            ..config(5, 2)
        },
    )
    .unwrap();
    assert_eq!(loader.batches_per_epoch(), 4);
    let batches = all(loader.epoch(3));
    assert_eq!(batches.len(), 4);
    assert!(batches.iter().all(|b| b.len() == 5));
}

#[test]
fn workers_and_prefetch_change_nothing_but_speed() {
    let reference = all(DataLoader::new(numbered(101), config(8, 0))
        .unwrap()
        .epoch(2));
    for (workers, prefetch) in [(1, 1), (3, 2), (8, 5), (20, 1)] {
        let loader = DataLoader::new(
            numbered(101),
            LoaderConfig {
                prefetch,
                ..config(8, workers)
            },
        )
        .unwrap();
        assert_eq!(
            all(loader.epoch(2)),
            reference,
            "{workers} workers, prefetch {prefetch}"
        );
    }
}

#[test]
fn a_resumed_epoch_sees_the_batches_it_had_left() {
    let loader = DataLoader::new(numbered(40), config(6, 2)).unwrap();
    let full = all(loader.epoch(5));
    for first in [0, 1, 4, 7] {
        let rest = all(loader.epoch_from(5, first).unwrap());
        assert_eq!(rest, full[first..].to_vec(), "from batch {first}");
    }
    let e = loader.epoch_from(5, 8).err().unwrap().to_string();
    assert!(e.contains("batch 8 of an epoch of 7 batches"), "{e}");
}

/// A dataset that counts its reads and can be told to fail or panic at one index.
struct Counting {
    inner: InMemory,
    reads: Arc<AtomicUsize>,
    fail_at: Option<usize>,
    panic_at: Option<usize>,
}

impl Dataset for Counting {
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn get(&self, index: usize) -> Result<Example> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        if Some(index) == self.fail_at {
            return Err(Error::Format(format!(
                "row {index} of the test file is bad"
            )));
        }
        if Some(index) == self.panic_at {
            panic!("the user's dataset panicked at {index}");
        }
        self.inner.get(index)
    }
}

fn counting(
    n: usize,
    fail_at: Option<usize>,
    panic_at: Option<usize>,
) -> (Counting, Arc<AtomicUsize>) {
    let reads = Arc::new(AtomicUsize::new(0));
    (
        Counting {
            inner: numbered(n),
            reads: reads.clone(),
            fail_at,
            panic_at,
        },
        reads,
    )
}

#[test]
fn workers_read_at_most_prefetch_batches_ahead() {
    let (data, reads) = counting(200, None, None);
    let loader = DataLoader::new(
        data,
        LoaderConfig {
            prefetch: 3,
            shuffle: false,
            ..config(4, 4)
        },
    )
    .unwrap();
    let mut batches = loader.epoch(0);
    for taken in 1..=5 {
        batches.next().unwrap().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        let read = reads.load(Ordering::SeqCst);
        assert!(
            read <= (taken + 3) * 4,
            "{read} examples read after {taken} batches handed out, prefetch 3 of 4"
        );
        assert!(read >= taken * 4);
    }
    drop(batches);
    // Dropped mid-epoch: the workers stop rather than read the rest.
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(reads.load(Ordering::SeqCst) <= 9 * 4);
}

#[test]
fn a_failing_or_panicking_dataset_gives_one_error_and_ends_the_epoch() {
    for workers in [0, 3] {
        let (data, _) = counting(30, Some(13), None);
        let loader = DataLoader::new(
            data,
            LoaderConfig {
                shuffle: false,
                ..config(4, workers)
            },
        )
        .unwrap();
        let results: Vec<_> = loader.epoch(0).collect();
        assert_eq!(results.len(), 4, "three good batches, then the error");
        assert!(results[..3].iter().all(|r| r.is_ok()));
        let e = results[3].as_ref().unwrap_err().to_string();
        assert!(e.contains("row 13 of the test file is bad"), "{e}");

        let (data, _) = counting(30, None, Some(2));
        let loader = DataLoader::new(
            data,
            LoaderConfig {
                shuffle: false,
                ..config(4, workers)
            },
        )
        .unwrap();
        let mut epoch = loader.epoch(0);
        let e = epoch.next().unwrap().unwrap_err().to_string();
        assert!(
            e.contains("panicked: the user's dataset panicked at 2"),
            "{e}"
        );
        assert!(epoch.next().is_none());
    }
}

#[test]
fn examples_of_different_shapes_are_refused_naming_both() {
    let a = Example {
        input: Field::features(vec![1.0, 2.0]),
        target: Field::class(0),
    };
    let b = Example {
        input: Field::features(vec![1.0, 2.0, 3.0]),
        target: Field::class(1),
    };
    let e = collate(vec![a.clone(), b], vec![4, 9])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("example 9's input is f32 [3] but example 4's is f32 [2]"),
        "{e}"
    );
    let c = Example {
        input: Field::features(vec![1.0, 2.0]),
        target: Field::features(vec![0.5]),
    };
    let e = collate(vec![a, c], vec![0, 1]).unwrap_err().to_string();
    assert!(
        e.contains("example 1's target is f32 [1] but example 0's is i32 []"),
        "{e}"
    );
}

#[test]
fn nonsense_settings_are_refused() {
    let cases: [(LoaderConfig, &str); 3] = [
        (config(0, 1), "batch size must be at least 1"),
        (
            LoaderConfig {
                prefetch: 0,
                ..config(2, 1)
            },
            "prefetch must be at least 1",
        ),
        (config(2, 100_000), "at most 256"),
    ];
    for (c, want) in cases {
        let e = DataLoader::new(numbered(5), c).err().unwrap().to_string();
        assert!(e.contains(want), "{e}");
    }
    let e = DataLoader::new(
        numbered(5),
        LoaderConfig {
            last_batch: LastBatch::Drop,
            ..config(8, 1)
        },
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("5 examples make no full batch of 8"), "{e}");
    let xs = Field::new(vec![2, 2], Values::F32(vec![0.0; 4])).unwrap();
    let ys = Field::new(vec![3], Values::I32(vec![0; 3])).unwrap();
    let e = InMemory::new(xs, ys).unwrap_err().to_string();
    assert!(e.contains("2 inputs"), "{e}");
    let e = Field::new(vec![2, 3], Values::F32(vec![0.0; 5]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("hold Some(6) values but 5 were given"), "{e}");
    let e = numbered(3).get(3).unwrap_err().to_string();
    assert!(e.contains("example 3 of a dataset of 3"), "{e}");
}

#[test]
fn batches_reach_the_device_as_typed_tensors() {
    use kiln_cpu::{Cpu, CpuDevice};
    use kiln_tensor::{Dyn, Rank1};
    let loader = DataLoader::new(
        numbered(6),
        LoaderConfig {
            shuffle: false,
            ..config(4, 1)
        },
    )
    .unwrap();
    let batch = loader
        .epoch(0)
        .next()
        .unwrap()
        .unwrap()
        .to_device::<Cpu>(&CpuDevice)
        .unwrap();
    let x = batch.input_as::<kiln_tensor::Batch<2>, f32>().unwrap();
    assert_eq!(x.to_vec().unwrap(), vec![0., 0., 1., 1., 2., 2., 3., 3.]);
    let y = batch.target_as::<Rank1<4>, i32>().unwrap();
    assert_eq!(y.to_vec().unwrap(), vec![0, 1, 2, 0]);
    let e = batch
        .input_as::<kiln_tensor::Batch<3>, f32>()
        .unwrap_err()
        .to_string();
    assert!(e.contains("the batch's inputs"), "{e}");
    let e = batch.target_as::<(Dyn,), f32>().unwrap_err().to_string();
    assert!(
        e.contains("i32") && e.contains("the batch's targets"),
        "{e}"
    );
}

#[test]
fn random_split_parts_are_disjoint_seeded_and_checked() {
    use kiln_data::random_split;
    let parts = random_split(numbered(10), &[7, 3], 5).unwrap();
    let mut all: Vec<usize> = parts.iter().flat_map(|p| p.indices().to_vec()).collect();
    assert_eq!((parts[0].len(), parts[1].len()), (7, 3));
    assert_ne!(parts[0].indices(), &[0, 1, 2, 3, 4, 5, 6], "shuffled");
    let again = random_split(numbered(10), &[7, 3], 5).unwrap();
    assert_eq!(again[1].indices(), parts[1].indices());
    // The subset reads the whole dataset's examples.
    let i = parts[1].indices()[2];
    let Values::F32(x) = parts[1].get(2).unwrap().input.values else {
        panic!()
    };
    assert_eq!(x[0], i as f32);
    all.sort();
    assert_eq!(all, (0..10).collect::<Vec<_>>());
    let e = random_split(numbered(10), &[usize::MAX, 2], 5)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("more than a usize holds"), "{e}");
    let e = random_split(numbered(10), &[7, 4], 5)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("add up to 11, not the dataset's 10"), "{e}");
    let e = kiln_data::Subset::new(Arc::new(numbered(3)), vec![0, 3])
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("index 3 of a dataset of 3"), "{e}");
}

/// The shuffled orders are pinned: `scripts/gpt_torch.py` ports them (its `shuffled`
/// printed these), so that PyTorch's side of the GPT comparison trains on the windows
/// kiln-train does, in the same order.
#[test]
fn a_shuffled_order_is_a_seeded_permutation_of_each_epoch() {
    let a = shuffled(1000, 1, 0);
    let mut s = a.clone();
    s.sort_unstable();
    assert_eq!(s, (0..1000).collect::<Vec<_>>());
    assert_eq!(a, shuffled(1000, 1, 0));
    assert_ne!(a, shuffled(1000, 1, 1));
}

#[test]
fn shuffled_orders_are_those_the_pytorch_script_ports() {
    assert_eq!(shuffled(10, 1, 0), [0, 6, 3, 4, 7, 2, 5, 8, 1, 9]);
    assert_eq!(shuffled(10, 1, 1), [7, 0, 4, 5, 9, 6, 1, 2, 8, 3]);
    assert_eq!(shuffled(12, 7, 3), [1, 7, 0, 10, 9, 4, 6, 11, 2, 8, 3, 5]);
}
