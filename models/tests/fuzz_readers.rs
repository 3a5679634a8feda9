//! A bounded, seeded mutation fuzz of the readers a user's files reach: IDX (plain and
//! gzip'd), safetensors checkpoints and training states. Each case mutates a valid file (bit flips, byte
//! overwrites, cuts, insertions, a header length or a dim set to an extreme) and reads
//! it: an error or a value, never a panic, and the process's peak memory stays within
//! a stated bound. `KILN_FUZZ_CASES` sets the case count per reader (default 4,000,
//! so 16,000 per CI run); the seed is fixed.

use flate2::{write::GzEncoder, Compression};
use kiln::cpu::{Cpu, CpuDevice};
use kiln::prelude::*;
use kiln::tensor::rng::bits;
use kiln::train::checkpoint::{load, read_tensors, save};
use kiln::train::optim::{AdamW, AdamWConfig, Optimizer};
use kiln::train::state;
use kiln_models::data::read_idx_from;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// A small model with what a checkpoint can hold: weights, biases, batch-norm buffers.
#[model]
struct Small {
    conv: Conv2d<1, 4, 3, 1, 1>,
    bn: BatchNorm2d<4>,
    fc: Linear<64, 10>,
}

#[model]
impl Small {
    /// Mean cross-entropy of 4×4 images' logits.
    pub fn loss<const B: usize>(&self, x: Tensor<B, 1, 4, 4>, y: Tensor<B, i32>) -> Tensor {
        self.fc(self.bn(self.conv(x)).relu().flatten())
            .cross_entropy(y)
    }
}

/// How much the process's peak resident memory may grow over all cases.
const MEMORY_BOUND_KIB: u64 = 512 << 10;

fn cases() -> u32 {
    std::env::var("KILN_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4_000)
}

/// A seeded stream of random words.
struct Rng(u32, u32);

impl Rng {
    fn next(&mut self) -> u32 {
        self.1 += 1;
        bits(self.0, self.1)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() as usize) % n.max(1)
    }
}

/// `valid` with one to four random mutations.
fn mutate(valid: &[u8], rng: &mut Rng) -> Vec<u8> {
    let mut b = valid.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(b.len());
        match rng.below(7) {
            0 => b[at] ^= 1 << rng.below(8),
            1 => b[at] = rng.next() as u8,
            2 => b.truncate(at),
            3 => b.insert(at, rng.next() as u8),
            // A length field or a dim at an extreme: all ones, or a huge power of two.
            4 => {
                let at = at.min(b.len().saturating_sub(4));
                let n = (b.len() - at).min(4);
                b[at..at + n].fill(0xff);
            }
            5 => {
                let at = at.min(b.len().saturating_sub(8));
                let huge = (1u64 << (30 + rng.below(34))).to_le_bytes();
                let n = (b.len() - at).min(8);
                b[at..at + n].copy_from_slice(&huge[..n]);
            }
            _ => b.extend((0..rng.below(64)).map(|_| rng.next() as u8)),
        }
        if b.is_empty() {
            break;
        }
    }
    b
}

/// The process's peak resident memory in KiB (Linux's `VmHWM`), where it can be read.
fn peak_memory_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut gz = GzEncoder::new(Vec::new(), Compression::fast());
    gz.write_all(bytes).unwrap();
    gz.finish().unwrap()
}

/// Runs `read` on `n` mutations of `valid`; the number that read without an error.
fn fuzz(name: &str, valid: &[u8], seed: u32, read: &dyn Fn(&[u8]) -> bool) -> u32 {
    let mut rng = Rng(seed, 0);
    let mut ok = 0;
    for case in 0..cases() {
        let bytes = mutate(valid, &mut rng);
        match catch_unwind(AssertUnwindSafe(|| read(&bytes))) {
            Ok(true) => ok += 1,
            Ok(false) => {}
            Err(_) => panic!(
                "{name}: case {case} panicked on {} bytes: {bytes:?}",
                bytes.len()
            ),
        }
    }
    ok
}

#[test]
fn mutated_files_are_errors_or_values_never_panics() {
    let before = peak_memory_kib();
    // IDX: 3 images of 4x5, plain and gzip'd (the gzip stream is mutated, so the
    // decompressor meets the damage).
    let mut idx = vec![0, 0, 8, 3, 0, 0, 0, 3, 0, 0, 0, 4, 0, 0, 0, 5];
    idx.extend((0..60).map(|i| i as u8));
    let plain = fuzz("idx", &idx, 1, &|b| read_idx_from(b, 3, "fuzz").is_ok());
    let gz = fuzz("idx.gz", &gzip(&idx), 2, &|b| {
        read_idx_from(flate2::read::GzDecoder::new(b), 3, "fuzz").is_ok()
    });
    // Safetensors: a checkpoint with weights, biases, batch-norm buffers and counter.
    let dir = std::env::temp_dir().join(format!("kiln-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("small.safetensors");
    save(&Small::<Cpu>::init(&CpuDevice, 1).unwrap(), &path).unwrap();
    let valid = std::fs::read(&path).unwrap();
    let file = dir.join("case.safetensors");
    // One model takes every load (a failed load leaves it as it was).
    let target = RefCell::new(Small::<Cpu>::init(&CpuDevice, 2).unwrap());
    let st = fuzz("safetensors", &valid, 3, &|b| {
        std::fs::write(&file, b).unwrap();
        let read = read_tensors::<Cpu>(&file, &CpuDevice).is_ok();
        read && load(&mut *target.borrow_mut(), &file).is_ok()
    });
    // A training state: the model with AdamW's moments and step counts after one step.
    let mut model = Small::<Cpu>::init(&CpuDevice, 1).unwrap();
    let mut opt = AdamW::<Cpu>::new(AdamWConfig::default()).unwrap();
    let x = Tensor::from_vec(vec![0.5; 2 * 16], &[2, 1, 4, 4], &CpuDevice).unwrap();
    let y = Tensor::from_vec(vec![3i32; 2], &[2], &CpuDevice).unwrap();
    let (_, grads) = model.loss_and_grad::<2>(&x, &y).unwrap();
    opt.step(&mut model, &grads).unwrap();
    let run = BTreeMap::from([("--seed".to_string(), "1".to_string())]);
    state::save(&path, &model, &opt, 1, &run).unwrap();
    let valid = std::fs::read(&path).unwrap();
    let target_opt = RefCell::new(AdamW::<Cpu>::new(AdamWConfig::default()).unwrap());
    let ts = fuzz("training state", &valid, 4, &|b| {
        std::fs::write(&file, b).unwrap();
        let complete = state::verify(&file).is_ok();
        let (mut model, mut opt) = (target.borrow_mut(), target_opt.borrow_mut());
        // A load needs a complete file (and the run's settings besides).
        let loaded = state::load(&file, &mut *model, &mut *opt, &run).is_ok();
        assert!(complete || !loaded, "an incomplete state loaded");
        loaded
    });
    std::fs::remove_dir_all(&dir).unwrap();
    println!(
        "{} cases per reader: {plain} IDX, {gz} gzip'd IDX, {st} checkpoint and {ts} training-state mutations read as values, the rest were errors",
        cases()
    );
    if let (Some(before), Some(after)) = (before, peak_memory_kib()) {
        println!("peak memory grew by {} KiB", after - before);
        assert!(
            after - before < MEMORY_BOUND_KIB,
            "peak memory grew by {} KiB (bound {MEMORY_BOUND_KIB})",
            after - before
        );
    }
}

/// The same for the files a user's own data comes in: PNG, JPEG and PGM images (read
/// by `kiln::data::image`, as an image folder reads them) and CSV tables (opened and
/// every row read, as the loader reads them).
#[test]
fn mutated_images_and_tables_are_errors_or_values_never_panics() {
    use kiln::data::{image::read_image, CsvConfig, CsvDataset, Dataset};
    let before = peak_memory_kib();
    let dir = std::env::temp_dir().join(format!("kiln-fuzz-data-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("case");
    let image = |b: &[u8]| {
        std::fs::write(&file, b).unwrap();
        match read_image(&file) {
            Ok(img) => {
                // What it read is what it says it read.
                assert_eq!(img.pixels.len(), img.width * img.height * img.channels);
                true
            }
            Err(_) => false,
        }
    };
    let mut png_bytes = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut png_bytes, 5, 4);
        enc.set_color(png::ColorType::Rgba);
        let data: Vec<u8> = (0..80).map(|i| (i * 3) as u8).collect();
        enc.write_header().unwrap().write_image_data(&data).unwrap();
    }
    let png_ok = fuzz("png", &png_bytes, 5, &image);
    let jpeg = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../data/tests/fixtures/gradient.jpg"
    ))
    .unwrap();
    let jpeg_ok = fuzz("jpeg", &jpeg, 6, &image);
    let mut pgm = b"P5 4 3 255\n".to_vec();
    pgm.extend((0..12).map(|i| (i * 20) as u8));
    let pgm_ok = fuzz("pgm", &pgm, 7, &image);
    let csv = b"a,b,label\n1.5,2,cat\n-3,4e2,dog\n0.25,\"7\",cat\n";
    let table = |b: &[u8]| {
        std::fs::write(&file, b).unwrap();
        let Ok(data) = CsvDataset::open(&file, &CsvConfig::classes_in("label")) else {
            return false;
        };
        // A file that opened reads every row.
        (0..data.len()).all(|i| data.get(i).is_ok())
    };
    let csv_ok = fuzz("csv", csv, 8, &table);
    std::fs::remove_dir_all(&dir).unwrap();
    println!(
        "{} cases per reader: {png_ok} PNG, {jpeg_ok} JPEG, {pgm_ok} PGM and {csv_ok} CSV mutations read as values, the rest were errors",
        cases()
    );
    if let (Some(before), Some(after)) = (before, peak_memory_kib()) {
        assert!(
            after - before < MEMORY_BOUND_KIB,
            "peak memory grew by {} KiB (bound {MEMORY_BOUND_KIB})",
            after - before
        );
    }
}
