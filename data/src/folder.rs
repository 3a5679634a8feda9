//! [`ImageFolder`]: a folder of images, one sub-folder per class (PyTorch's
//! `ImageFolder` layout), each image read when asked for, sized and normalised as
//! configured.

use crate::dataset::{check_index, Dataset, Example, Field, Values};
use crate::image::{read_image, resize_bilinear, MAX_PIXELS};
use kiln_tensor::{Error, Result};
use std::path::{Path, PathBuf};

/// The extensions read as images (PNG, JPEG, PGM), in any case.
pub const IMAGE_EXTENSIONS: [&str; 4] = ["png", "jpg", "jpeg", "pgm"];

/// Which channels an image is read into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Channels {
    /// One: luminance, transparency over white.
    Grey,
    /// Three: red, green, blue (grey repeated, alpha dropped).
    Rgb,
}

impl Channels {
    /// How many.
    pub fn count(self) -> usize {
        match self {
            Channels::Grey => 1,
            Channels::Rgb => 3,
        }
    }
}

/// How an image folder's images become inputs.
#[derive(Clone, Debug, PartialEq)]
pub struct ImageFolderConfig {
    /// Every image is resized to `(height, width)`.
    pub size: (usize, usize),
    /// The channels read.
    pub channels: Channels,
    /// Per channel, subtracted from intensities in [0, 1]...
    pub mean: Vec<f32>,
    /// ...then divided by this (PyTorch's `Normalize(mean, std)`).
    pub std: Vec<f32>,
}

impl ImageFolderConfig {
    /// Images resized to `height × width` with `channels`, intensities in [0, 1]
    /// (mean 0, std 1).
    pub fn new(height: usize, width: usize, channels: Channels) -> Self {
        ImageFolderConfig {
            size: (height, width),
            channels,
            mean: vec![0.0; channels.count()],
            std: vec![1.0; channels.count()],
        }
    }

    fn check(&self) -> Result<()> {
        const OP: &str = "ImageFolder";
        let (h, w) = self.size;
        if h == 0 || w == 0 || h.saturating_mul(w) > MAX_PIXELS {
            return Err(Error::invalid(
                OP,
                format!("a size of {h}×{w}: each side at least 1, at most {MAX_PIXELS} pixels"),
            ));
        }
        let c = self.channels.count();
        if self.mean.len() != c || self.std.len() != c {
            return Err(Error::invalid(
                OP,
                format!(
                    "{c} channel(s) need {c} means and stds, got {} and {}",
                    self.mean.len(),
                    self.std.len()
                ),
            ));
        }
        if let Some(s) = self.std.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
            return Err(Error::invalid(
                OP,
                format!("a std of {s}: each must be finite and > 0"),
            ));
        }
        if let Some(m) = self.mean.iter().find(|m| !m.is_finite()) {
            return Err(Error::invalid(
                OP,
                format!("a mean of {m}: each must be finite"),
            ));
        }
        Ok(())
    }
}

/// Images under `root/<class>/`, classes numbered in the sorted order of their folder
/// names; each example's input is `f32 [channels, height, width]` and its target the
/// class, an `i32` scalar.
#[derive(Clone, Debug)]
pub struct ImageFolder {
    root: PathBuf,
    classes: Vec<String>,
    files: Vec<(PathBuf, i32)>,
    config: ImageFolderConfig,
}

impl ImageFolder {
    /// Lists the images under `root`: an error when it is not a folder, has no class
    /// folders, or a class folder holds no image (hidden files and folders, and files
    /// of other extensions, are passed over).
    pub fn open(root: impl AsRef<Path>, config: ImageFolderConfig) -> Result<Self> {
        config.check()?;
        let root = root.as_ref().to_path_buf();
        let bad = |msg: String| Error::Format(format!("{}: {msg}", root.display()));
        let classes: Vec<(String, PathBuf)> = sorted_entries(&root)
            .map_err(|e| bad(format!("cannot list it: {e}")))?
            .into_iter()
            .filter(|(_, p)| p.is_dir())
            .collect();
        if classes.is_empty() {
            return Err(bad(
                "it holds no class folders (images go in <root>/<class>/<image>)".into(),
            ));
        }
        let mut files = Vec::new();
        for (k, (name, dir)) in classes.iter().enumerate() {
            let before = files.len();
            let entries = sorted_entries(dir)
                .map_err(|e| bad(format!("cannot list class folder `{name}`: {e}")))?;
            for (_, path) in entries {
                let is_image = path.is_file()
                    && path.extension().and_then(|e| e.to_str()).is_some_and(|e| {
                        IMAGE_EXTENSIONS.contains(&e.to_ascii_lowercase().as_str())
                    });
                if is_image {
                    files.push((path, k as i32));
                }
            }
            if files.len() == before {
                return Err(bad(format!(
                    "class folder `{name}` holds no image ({})",
                    IMAGE_EXTENSIONS.join(", ")
                )));
            }
        }
        Ok(ImageFolder {
            root,
            classes: classes.into_iter().map(|(n, _)| n).collect(),
            files,
            config,
        })
    }

    /// The class names, numbered in this order.
    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    /// The folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Each image's path and class, in example order.
    pub fn files(&self) -> &[(PathBuf, i32)] {
        &self.files
    }
}

/// A folder's entries other than hidden ones (names starting with `.`), sorted by name.
fn sorted_entries(dir: &Path) -> std::io::Result<Vec<(String, PathBuf)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with('.') {
            out.push((name, entry.path()));
        }
    }
    out.sort();
    Ok(out)
}

impl Dataset for ImageFolder {
    fn len(&self) -> usize {
        self.files.len()
    }

    fn get(&self, index: usize) -> Result<Example> {
        check_index("ImageFolder", index, self.files.len())?;
        let (path, class) = &self.files[index];
        let image = read_image(path)?;
        let c = self.config.channels.count();
        let planes = match self.config.channels {
            Channels::Grey => image.grey().pixels,
            Channels::Rgb => image.rgb(),
        };
        let (h, w) = self.config.size;
        let mut planes = resize_bilinear(&planes, c, (image.height, image.width), (h, w));
        for (k, plane) in planes.chunks_exact_mut(h * w).enumerate() {
            let (mean, std) = (self.config.mean[k], self.config.std[k]);
            plane.iter_mut().for_each(|v| *v = (*v - mean) / std);
        }
        Ok(Example {
            input: Field {
                dims: vec![c, h, w],
                values: Values::F32(planes),
            },
            target: Field::class(*class),
        })
    }
}
