//! Data sets: an IDX (gzip'd) reader for MNIST and Fashion-MNIST, and seeded
//! shuffling into batches. Files are read from the copies vendored in `models/data/`.

use flate2::read::GzDecoder;
use kiln::tensor::{rng, Error, Result};
use std::io::Read;
use std::path::{Path, PathBuf};

/// The folder holding the vendored data sets.
pub fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("data")
}

/// Reads a whole IDX file, un-gzipping it when its name ends in `.gz`.
fn read_file(path: &Path) -> Result<Vec<u8>> {
    let raw = std::fs::read(path)
        .map_err(|e| Error::Format(format!("cannot read {}: {e}", path.display())))?;
    if path.extension().is_some_and(|e| e == "gz") {
        let mut out = Vec::new();
        GzDecoder::new(&raw[..])
            .read_to_end(&mut out)
            .map_err(|e| Error::Format(format!("{} is not valid gzip: {e}", path.display())))?;
        Ok(out)
    } else {
        Ok(raw)
    }
}

/// Parses an IDX buffer: checks the magic number (unsigned bytes, `ndim` dims) and
/// that the payload has exactly the size the header announces.
pub fn parse_idx(bytes: &[u8], ndim: usize, what: &str) -> Result<(Vec<usize>, Vec<u8>)> {
    let header = 4 + 4 * ndim;
    if bytes.len() < header {
        return Err(Error::Format(format!(
            "{what}: {} bytes is too short for an IDX header",
            bytes.len()
        )));
    }
    let be = |i: usize| {
        u32::from_be_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]) as usize
    };
    let magic = be(0);
    let want = 0x0800 | ndim;
    if magic != want {
        return Err(Error::Format(format!(
            "{what}: IDX magic {magic:#010x}, expected {want:#010x}"
        )));
    }
    let dims: Vec<usize> = (0..ndim).map(|i| be(4 + 4 * i)).collect();
    let n: usize = dims.iter().product();
    if bytes.len() - header != n {
        return Err(Error::Format(format!(
            "{what}: header says {dims:?} ({n} bytes) but the payload has {} bytes",
            bytes.len() - header
        )));
    }
    Ok((dims, bytes[header..].to_vec()))
}

/// Images and labels of one split.
#[derive(Clone, Debug)]
pub struct Split {
    /// Pixels scaled to [0, 1] and normalised, row-major `[n, rows·cols]`.
    pub images: Vec<f32>,
    /// Class labels.
    pub labels: Vec<i32>,
    /// Pixels per image.
    pub pixels: usize,
    /// Image height and width.
    pub hw: [usize; 2],
}

impl Split {
    /// The number of examples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether the split is empty.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The first `n` examples (all when `n` is larger).
    pub fn take(&self, n: usize) -> Split {
        let n = n.min(self.len());
        Split {
            images: self.images[..n * self.pixels].to_vec(),
            labels: self.labels[..n].to_vec(),
            pixels: self.pixels,
            hw: self.hw,
        }
    }
}

/// A data set in MNIST's layout (MNIST itself, Fashion-MNIST).
#[derive(Clone, Debug)]
pub struct ImageDataset {
    /// The training split.
    pub train: Split,
    /// The test split.
    pub test: Split,
}

/// Normalisation constants (mean, std) of MNIST's training pixels.
pub const MNIST_NORM: (f32, f32) = (0.1307, 0.3081);
/// Normalisation constants (mean, std) of Fashion-MNIST's training pixels.
pub const FASHION_NORM: (f32, f32) = (0.2860, 0.3530);

impl ImageDataset {
    /// Loads the four IDX files of an MNIST-style folder, normalising with `norm`.
    pub fn load(dir: &Path, norm: (f32, f32)) -> Result<Self> {
        let split = |image_file: &str, label_file: &str| -> Result<Split> {
            let (idims, pixels) = parse_idx(&read_file(&dir.join(image_file))?, 3, image_file)?;
            let (ldims, labels) = parse_idx(&read_file(&dir.join(label_file))?, 1, label_file)?;
            if idims[0] != ldims[0] {
                return Err(Error::Format(format!(
                    "{image_file} has {} images but {label_file} has {} labels",
                    idims[0], ldims[0]
                )));
            }
            if let Some(bad) = labels.iter().find(|&&l| l > 9) {
                return Err(Error::Format(format!(
                    "{label_file}: label {bad} is not a class 0-9"
                )));
            }
            let (mean, std) = norm;
            Ok(Split {
                images: pixels
                    .iter()
                    .map(|&p| (p as f32 / 255.0 - mean) / std)
                    .collect(),
                labels: labels.iter().map(|&l| l as i32).collect(),
                pixels: idims[1] * idims[2],
                hw: [idims[1], idims[2]],
            })
        };
        Ok(ImageDataset {
            train: split("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz")?,
            test: split("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")?,
        })
    }

    /// MNIST from `models/data/mnist`.
    pub fn mnist() -> Result<Self> {
        Self::load(&data_dir().join("mnist"), MNIST_NORM)
    }
}

/// A seeded permutation of `0..n` (Fisher–Yates over the counter-based generator),
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

/// One batch on the host: images `[n, pixels]` and labels `[n]`.
#[derive(Clone, Debug)]
pub struct Batch {
    /// Row-major pixels.
    pub images: Vec<f32>,
    /// Labels.
    pub labels: Vec<i32>,
}

/// Batches of `split` in the order `order`, `size` at a time (the last may be short).
pub fn batches<'a>(
    split: &'a Split,
    order: &'a [usize],
    size: usize,
) -> impl Iterator<Item = Batch> + 'a {
    order.chunks(size.max(1)).map(move |ids| {
        let mut images = Vec::with_capacity(ids.len() * split.pixels);
        for &i in ids {
            images.extend_from_slice(&split.images[i * split.pixels..(i + 1) * split.pixels]);
        }
        Batch {
            images,
            labels: ids.iter().map(|&i| split.labels[i]).collect(),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idx_errors_are_clear() {
        assert!(parse_idx(&[0, 0, 8], 1, "x")
            .unwrap_err()
            .to_string()
            .contains("too short"));
        let bad_magic = [0, 0, 8, 3, 0, 0, 0, 1, 7];
        assert!(parse_idx(&bad_magic, 1, "x")
            .unwrap_err()
            .to_string()
            .contains("magic"));
        let short = [0, 0, 8, 1, 0, 0, 0, 2, 7];
        assert!(parse_idx(&short, 1, "x")
            .unwrap_err()
            .to_string()
            .contains("payload"));
        let ok = [0, 0, 8, 1, 0, 0, 0, 2, 7, 9];
        assert_eq!(parse_idx(&ok, 1, "x").unwrap(), (vec![2], vec![7, 9]));
    }

    #[test]
    fn shuffle_is_a_seeded_permutation() {
        let a = shuffled(1000, 1, 0);
        let mut s = a.clone();
        s.sort_unstable();
        assert_eq!(s, (0..1000).collect::<Vec<_>>());
        assert_eq!(a, shuffled(1000, 1, 0));
        assert_ne!(a, shuffled(1000, 1, 1));
    }

    #[test]
    fn mnist_loads() {
        let d = ImageDataset::mnist().unwrap();
        assert_eq!(
            (d.train.len(), d.test.len(), d.train.pixels),
            (60_000, 10_000, 784)
        );
        let mean: f32 = d.train.images.iter().sum::<f32>() / d.train.images.len() as f32;
        assert!(mean.abs() < 1e-3, "normalised mean {mean}");
    }
}
