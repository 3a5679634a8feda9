//! The character-level corpus: the vendored Shakespeare text as bytes (a vocabulary of
//! 256), a fixed split (the last 10% held out), and seeded batches of windows at
//! random positions with their next-byte targets (what the step benchmarks and the
//! PyTorch script's `bench` time; training reads `TextWindows` through the Learner).

use crate::data::data_dir;
use kiln::tensor::{rng, Error, Result};

/// A text as bytes, split into a training and a held-out part.
#[derive(Clone, Debug)]
pub struct Corpus {
    /// The first 90% of the bytes.
    pub train: Vec<u8>,
    /// The last 10%.
    pub held_out: Vec<u8>,
}

impl Corpus {
    /// Splits `bytes`: the last 10% held out.
    pub fn new(bytes: Vec<u8>) -> Result<Self> {
        if bytes.len() < 20 {
            return Err(Error::Format(format!(
                "a corpus of {} bytes is too short to split",
                bytes.len()
            )));
        }
        let cut = bytes.len() - bytes.len() / 10;
        Ok(Corpus {
            held_out: bytes[cut..].to_vec(),
            train: bytes[..cut].to_vec(),
        })
    }

    /// The seven Shakespeare plays vendored in `models/data/shakespeare/`.
    pub fn shakespeare() -> Result<Self> {
        Self::shakespeare_in(&data_dir())
    }

    /// The seven Shakespeare plays in the data folder `root` (`shakespeare/`).
    pub fn shakespeare_in(root: &std::path::Path) -> Result<Self> {
        let path = root.join("shakespeare").join("shakespeare_7plays.txt");
        let bytes = std::fs::read(&path)
            .map_err(|e| Error::Format(format!("cannot read {}: {e}", path.display())))?;
        Self::new(bytes)
    }
}

/// `batch` windows of `len` bytes of `text` starting at seeded positions, as i32 ids
/// (row-major `[batch, len]`), and the byte after each position (the targets).
pub fn windows(text: &[u8], batch: usize, len: usize, seed: u64) -> Result<(Vec<i32>, Vec<i32>)> {
    if text.len() <= len {
        return Err(Error::invalid(
            "windows",
            format!(
                "windows of {len} bytes need a text longer than {} bytes",
                text.len()
            ),
        ));
    }
    let starts = (text.len() - len) as u64;
    let key = rng::stream_key(seed, 0);
    let (mut ids, mut next) = (
        Vec::with_capacity(batch * len),
        Vec::with_capacity(batch * len),
    );
    for b in 0..batch {
        let start = ((rng::bits(key, b as u32) as u64 * starts) >> 32) as usize;
        ids.extend(text[start..start + len].iter().map(|&c| c as i32));
        next.extend(text[start + 1..start + len + 1].iter().map(|&c| c as i32));
    }
    Ok((ids, next))
}

#[cfg(test)]
mod tests {
    use super::windows;

    /// scripts/gpt_torch.py ports `windows` to train PyTorch on the same data order:
    /// these are its draws (`python3 -c "import gpt_torch as g; ..."`), so a change on
    /// either side fails here.
    #[test]
    fn windows_match_the_pytorch_scripts_port() {
        let text: Vec<u8> = (0..1000u32).map(|i| ((i * 7 + 3) % 251) as u8).collect();
        let (ids, _) = windows(&text, 3, 4, 12345).unwrap();
        assert_eq!(ids, [63, 70, 77, 84, 76, 83, 90, 97, 75, 82, 89, 96]);
        let (ids, _) = windows(&text, 2, 4, 1_000_003 ^ 5).unwrap();
        assert_eq!(ids, [133, 140, 147, 154, 6, 13, 20, 27]);
    }
}
