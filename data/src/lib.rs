//! # kiln-data
//!
//! Owns getting a user's data into a model: the [`Dataset`] trait (a length and an
//! example by index) and its [`Example`]s, ready datasets — [`ImageFolder`] (one
//! folder per class; PNG, JPEG, PGM), [`CsvDataset`] (numeric columns and a label,
//! read a row at a time), [`TextWindows`] (bytes or token ids for next-token
//! prediction) and [`InMemory`] (tensors) — and the [`DataLoader`] that reads one in
//! seeded, resumable, prefetched batches onto a device. The image files' readers
//! ([`image`]) are bounded: a hostile file is an error naming it, never an allocation
//! its header asked for.
//!
//! ```
//! use kiln_data::{DataLoader, Dataset, Field, InMemory, LoaderConfig, Values};
//! use kiln_cpu::{Cpu, CpuDevice};
//! use kiln_tensor::{Batch, Dyn};
//!
//! let xs = Field::new(vec![4, 3], Values::F32((0..12).map(|v| v as f32).collect()))?;
//! let ys = Field::new(vec![4], Values::I32(vec![0, 1, 1, 0]))?;
//! let loader = DataLoader::new(InMemory::new(xs, ys)?, LoaderConfig {
//!     batch_size: 2,
//!     seed: 7,
//!     ..LoaderConfig::default()
//! })?;
//! for batch in loader.epoch(0) {
//!     let batch = batch?.to_device::<Cpu>(&CpuDevice)?;
//!     let x = batch.input_as::<Batch<3>, f32>()?;
//!     let y = batch.target_as::<(Dyn,), i32>()?;
//!     assert_eq!(x.dims()[0], y.dims()[0]);
//! }
//! # Ok::<(), kiln_tensor::Error>(())
//! ```

#![warn(missing_docs)]

pub mod csv;
pub mod dataset;
pub mod folder;
pub mod image;
pub mod loader;
pub mod text;

pub use csv::{Column, CsvConfig, CsvDataset, LabelKind};
pub use dataset::{random_split, Dataset, Example, Field, InMemory, Subset, Values};
pub use folder::{Channels, ImageFolder, ImageFolderConfig};
pub use loader::{
    collate, shuffled, Batches, DataLoader, DeviceBatch, HostBatch, LastBatch, LoaderConfig,
};
pub use text::TextWindows;
