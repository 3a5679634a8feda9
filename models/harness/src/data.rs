//! Data sets: an IDX (gzip'd) reader for MNIST and Fashion-MNIST and their splits
//! (batched and shuffled by `kiln::data::DataLoader` through
//! [`Examples`](crate::classify::Examples)). Files are read from the copies vendored in
//! `models/data/`.

use flate2::read::MultiGzDecoder;
use kiln::tensor::{Error, Result};
use std::io::Read;
use std::path::{Path, PathBuf};

/// The folder holding the vendored data sets (`models/data/`, beside this crate).
pub fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("data")
}

/// The largest IDX payload read, in bytes (2 GiB): a header declaring more is refused
/// before anything is allocated or decompressed.
pub const MAX_IDX_BYTES: usize = 1 << 31;

/// Reads an IDX file of `ndim` dims, un-gzipping it on the fly when its name ends in
/// `.gz`: the header first, then exactly the payload it declares (see
/// [`read_idx_from`]), so decompression stops where the header says the data ends.
/// Every gzip member is part of the stream (as `gunzip` reads them), so data in a
/// second member is data past the payload, refused like any other.
pub fn read_idx(path: &Path, ndim: usize) -> Result<(Vec<usize>, Vec<u8>)> {
    let file = std::fs::File::open(path)
        .map_err(|e| Error::Format(format!("cannot read {}: {e}", path.display())))?;
    let reader = std::io::BufReader::new(file);
    let what = path.display().to_string();
    if path.extension().is_some_and(|e| e == "gz") {
        read_idx_from(MultiGzDecoder::new(reader), ndim, &format!("{what} (gzip)"))
    } else {
        read_idx_from(reader, ndim, &what)
    }
}

/// Reads an IDX stream: the magic number (unsigned bytes, `ndim` dims), the dims, and
/// exactly the payload they declare. The declared size is computed with
/// overflow-checked arithmetic and bounded by [`MAX_IDX_BYTES`] before reading; the
/// payload grows with the bytes that actually arrive (a header that lies about a short
/// stream allocates only what the stream holds), and a byte past it is an error.
pub fn read_idx_from(mut r: impl Read, ndim: usize, what: &str) -> Result<(Vec<usize>, Vec<u8>)> {
    let io = |e: std::io::Error| Error::Format(format!("{what}: {e}"));
    let mut header = vec![0u8; 4 + 4 * ndim];
    let got = read_up_to(&mut r, &mut header).map_err(io)?;
    if got < header.len() {
        return Err(Error::Format(format!(
            "{what}: {got} bytes is too short for an IDX header"
        )));
    }
    let be = |i: usize| {
        u32::from_be_bytes([header[i], header[i + 1], header[i + 2], header[i + 3]]) as usize
    };
    let magic = be(0);
    let want = 0x0800 | ndim;
    if magic != want {
        return Err(Error::Format(format!(
            "{what}: IDX magic {magic:#010x}, expected {want:#010x}"
        )));
    }
    let dims: Vec<usize> = (0..ndim).map(|i| be(4 + 4 * i)).collect();
    let n = dims
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .filter(|&n| n <= MAX_IDX_BYTES)
        .ok_or_else(|| {
            Error::Format(format!(
                "{what}: the header declares dims {dims:?}, more than the {MAX_IDX_BYTES} bytes an IDX file may hold"
            ))
        })?;
    let mut payload = Vec::new();
    r.by_ref()
        .take(n as u64)
        .read_to_end(&mut payload)
        .map_err(io)?;
    if payload.len() != n {
        return Err(Error::Format(format!(
            "{what}: header says {dims:?} ({n} bytes) but the payload has {} bytes",
            payload.len()
        )));
    }
    if read_up_to(&mut r, &mut [0u8; 1]).map_err(io)? > 0 {
        return Err(Error::Format(format!(
            "{what}: header says {dims:?} ({n} bytes) but the payload has more"
        )));
    }
    Ok((dims, payload))
}

/// Reads until `buf` is full or the stream ends; the bytes read.
fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(k) => got += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Parses an IDX buffer held in memory ([`read_idx_from`] over its bytes).
pub fn parse_idx(bytes: &[u8], ndim: usize, what: &str) -> Result<(Vec<usize>, Vec<u8>)> {
    read_idx_from(bytes, ndim, what)
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
    /// A fingerprint of the examples, their order included: their count and a CRC-32
    /// of their pixels and labels (what a training state records of its data).
    pub fn fingerprint(&self) -> String {
        let mut crc = crc32fast::Hasher::new();
        let mut bytes = Vec::with_capacity(4 * 4096);
        let words = self.images.iter().map(|x| x.to_bits());
        let words = words.chain(self.labels.iter().map(|&y| y as u32));
        for w in words {
            bytes.extend_from_slice(&w.to_le_bytes());
            if bytes.len() == bytes.capacity() {
                crc.update(&bytes);
                bytes.clear();
            }
        }
        crc.update(&bytes);
        format!("{} examples, crc32 {:08x}", self.len(), crc.finalize())
    }

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

/// The class names of MNIST (the digits).
pub const MNIST_CLASSES: [&str; 10] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"];

/// The class names of Fashion-MNIST.
pub const FASHION_CLASSES: [&str; 10] = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
];

/// Normalisation constants (mean, std) of MNIST's training pixels.
pub const MNIST_NORM: (f32, f32) = (0.1307, 0.3081);
/// Normalisation constants (mean, std) of Fashion-MNIST's training pixels.
pub const FASHION_NORM: (f32, f32) = (0.2860, 0.3530);

/// One of a data set's two splits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SplitName {
    /// The training images (`train-*-ubyte.gz`).
    Train,
    /// The test images (`t10k-*-ubyte.gz`).
    Test,
}

impl Split {
    /// Loads one split of an MNIST-style folder (its image and label IDX files),
    /// normalising with `norm`: evaluation reads the test split alone.
    pub fn load(dir: &Path, which: SplitName, norm: (f32, f32)) -> Result<Split> {
        let prefix = match which {
            SplitName::Train => "train",
            SplitName::Test => "t10k",
        };
        let (image_file, label_file) = (
            format!("{prefix}-images-idx3-ubyte.gz"),
            format!("{prefix}-labels-idx1-ubyte.gz"),
        );
        let (idims, pixels) = read_idx(&dir.join(&image_file), 3)?;
        let (ldims, labels) = read_idx(&dir.join(&label_file), 1)?;
        if idims[0] != ldims[0] {
            return Err(Error::Format(format!(
                "{image_file} has {} images but {label_file} has {} labels",
                idims[0], ldims[0]
            )));
        }
        if idims[0] == 0 || idims[1] * idims[2] == 0 {
            return Err(Error::Format(format!(
                "{}: holds no images ({} of {}×{} pixels): nothing to train on or measure",
                dir.join(&image_file).display(),
                idims[0],
                idims[1],
                idims[2]
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
    }
}

impl ImageDataset {
    /// Loads both splits of an MNIST-style folder, normalising with `norm`.
    pub fn load(dir: &Path, norm: (f32, f32)) -> Result<Self> {
        Ok(ImageDataset {
            train: Split::load(dir, SplitName::Train, norm)?,
            test: Split::load(dir, SplitName::Test, norm)?,
        })
    }

    /// MNIST from `models/data/mnist`.
    pub fn mnist() -> Result<Self> {
        Self::load(&data_dir().join("mnist"), MNIST_NORM)
    }
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
    fn idx_sizes_are_checked_before_anything_is_read() {
        // Dims whose product overflows usize: refused from the header alone.
        let mut h = vec![0, 0, 8, 3];
        for d in [u32::MAX; 3] {
            h.extend(d.to_be_bytes());
        }
        let e = parse_idx(&h, 3, "x").unwrap_err().to_string();
        assert!(e.contains("more than the"), "{e}");
        // A header declaring 1 GiB over 3 bytes of payload holds only what arrived.
        let mut h = vec![0, 0, 8, 1];
        h.extend((1u32 << 30).to_be_bytes());
        h.extend([1, 2, 3]);
        let e = parse_idx(&h, 1, "x").unwrap_err().to_string();
        assert!(e.contains("the payload has 3 bytes"), "{e}");
        let long = [0, 0, 8, 1, 0, 0, 0, 1, 7, 9];
        let e = parse_idx(&long, 1, "x").unwrap_err().to_string();
        assert!(e.contains("the payload has more"), "{e}");
    }

    #[test]
    fn a_gzip_bomb_is_decompressed_only_as_far_as_its_header_declares() {
        use flate2::{write::GzEncoder, Compression};
        use std::io::Write;
        // One 28x28 image declared, 64 MiB of zeros behind it (64 KiB compressed).
        let mut enc = GzEncoder::new(Vec::new(), Compression::best());
        enc.write_all(&[0, 0, 8, 3, 0, 0, 0, 1, 0, 0, 0, 28, 0, 0, 0, 28])
            .unwrap();
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..64 {
            enc.write_all(&zeros).unwrap();
        }
        let bomb = enc.finish().unwrap();
        assert!(bomb.len() < 1 << 20, "{} bytes", bomb.len());
        /// Counts the decompressed bytes the reader pulls.
        struct Counted<R>(R, usize);
        impl<R: Read> Read for Counted<R> {
            fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
                let k = self.0.read(b)?;
                self.1 += k;
                Ok(k)
            }
        }
        let mut counted = Counted(MultiGzDecoder::new(&bomb[..]), 0);
        let e = read_idx_from(&mut counted, 3, "bomb")
            .unwrap_err()
            .to_string();
        assert!(e.contains("the payload has more"), "{e}");
        assert!(
            counted.1 <= 16 + 784 + 1,
            "decompressed {} bytes",
            counted.1
        );
    }

    #[test]
    fn data_in_a_second_gzip_member_is_refused() {
        use flate2::{write::GzEncoder, Compression};
        use std::io::Write;
        let member = |bytes: &[u8]| {
            let mut enc = GzEncoder::new(Vec::new(), Compression::fast());
            enc.write_all(bytes).unwrap();
            enc.finish().unwrap()
        };
        let one = member(&[0, 0, 8, 1, 0, 0, 0, 2, 7, 9]);
        let path = std::env::temp_dir().join(format!("kiln-idx-{}.gz", std::process::id()));
        std::fs::write(&path, &one).unwrap();
        assert_eq!(read_idx(&path, 1).unwrap().1, vec![7, 9]);
        let two = [one, member(&[5, 5, 5])].concat();
        std::fs::write(&path, &two).unwrap();
        let e = read_idx(&path, 1).unwrap_err().to_string();
        assert!(e.contains("the payload has more"), "{e}");
        std::fs::remove_file(&path).unwrap();
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
