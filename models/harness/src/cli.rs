//! What the binaries' command lines share: `--device`, `--data`, `--foreign`,
//! `--detect-anomaly` and where checkpoints go by default.

use crate::data::data_dir;
use clap::Args;
use kiln::device::DeviceChoice;
use kiln::tensor::nn::Module;
use kiln::tensor::{Backend, Error, Result};
use kiln::train::checkpoint;
use std::path::{Path, PathBuf};

/// `--device`, flattened into each binary's arguments.
#[derive(Args, Clone, Copy, Debug)]
pub struct DeviceArg {
    /// Where to run: cpu, wgpu, wgpu:N (the N-th adapter, GPUs first), cuda or cuda:N
    /// (the GPU backends need a build with the `wgpu` / `cuda` feature).
    #[arg(long, default_value = "cpu")]
    pub device: DeviceChoice,
}

/// `--data`, flattened into the binaries that read data sets.
#[derive(Args, Clone, Debug)]
pub struct DataArg {
    /// The folder holding the data sets (mnist/, fashion-mnist/, shakespeare/; default:
    /// the copies vendored with kiln-models).
    #[arg(long, env = "KILN_DATA", value_name = "DIR")]
    pub data: Option<PathBuf>,
}

impl DataArg {
    /// The data folder: `--data`, else `KILN_DATA`, else the vendored one; an error
    /// naming it when it is not a folder.
    pub fn dir(&self) -> Result<PathBuf> {
        let dir = self.data.clone().unwrap_or_else(data_dir);
        if !dir.is_dir() {
            return Err(Error::invalid(
                "data",
                format!(
                    "the data folder {} does not exist (--data DIR or KILN_DATA names it)",
                    dir.display()
                ),
            ));
        }
        Ok(dir)
    }
}

/// Where a checkpoint named `file` goes when no path is given: `runs/` in the current
/// folder (kiln-train writes there, kiln-infer and kiln-generate read from there), not
/// the source tree.
pub fn default_checkpoint(file: &str) -> PathBuf {
    PathBuf::from("runs").join(file)
}

/// `--foreign`, flattened into the binaries that load checkpoints.
#[derive(Args, Clone, Copy, Debug)]
pub struct ForeignArg {
    /// The checkpoint was written by another tool (PyTorch's save_file) and has no
    /// Kiln checksums: load it unverified (checksums it has are still verified).
    #[arg(long)]
    pub foreign: bool,
}

impl ForeignArg {
    /// A new model on `device` holding the checkpoint at `path`, its checksums verified
    /// unless `--foreign` was given; built without drawing values it would replace.
    /// A parameter holding NaN or an infinity (a run that diverged, saved with valid
    /// checksums) is refused, naming it: such a model answers nothing but NaN.
    pub fn load_new<B: Backend, M: Module<B>>(&self, path: &Path, device: &B::Device) -> Result<M> {
        let model: M = checkpoint::load_new(path, device, self.foreign)?;
        let mut bad = Ok(());
        model.visit_params("", &mut |slot| {
            if bad.is_err() {
                return;
            }
            bad = match kiln::tensor::anomaly::first_non_finite(slot.value) {
                Ok(Some(value)) => Err(Error::Format(format!(
                    "{} holds `{}` with {value}: the run that wrote it diverged; retrain, or resume from an earlier training state",
                    path.display(),
                    slot.name
                ))),
                Ok(None) => Ok(()),
                Err(e) => Err(e),
            };
        });
        bad.map(|()| model)
    }
}

/// `--detect-anomaly`, flattened into the training binaries.
#[derive(Args, Clone, Copy, Debug)]
pub struct AnomalyArg {
    /// Check every op's output and stop at the first that is not finite (NaN, inf),
    /// naming the op and the parameters of its layer; slow, for finding where a NaN
    /// comes from (also KILN_ANOMALY=1).
    #[arg(long)]
    pub detect_anomaly: bool,
}

impl AnomalyArg {
    /// Turns anomaly mode on when asked ([`kiln::tensor::anomaly`]).
    pub fn apply(&self) {
        if self.detect_anomaly {
            kiln::tensor::anomaly::set_detect(true);
        }
    }
}

/// The message of a training loss that is not finite at `step`, pointing at anomaly
/// mode unless it is on.
pub fn non_finite_loss(loss: f32, step: u64) -> Error {
    let hint = if kiln::tensor::anomaly::detecting() {
        ""
    } else {
        " (--detect-anomaly finds the op that first made a value that is not finite)"
    };
    Error::invalid(
        "train",
        format!("the loss became {loss} at step {step}{hint}"),
    )
}

/// Which classifier a checkpoint holds (`--model` of the inference binaries).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClassifierKind {
    /// MLP 784-1024-1024-10.
    Mlp,
    /// LeNet-style CNN.
    Cnn,
}

/// Which image data set (`--dataset` of the inference binaries).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageData {
    /// Handwritten digits.
    Mnist,
    /// Clothing images.
    Fashion,
}

impl ImageData {
    /// Its folder under the data folder.
    pub fn folder(self) -> &'static str {
        match self {
            ImageData::Mnist => "mnist",
            ImageData::Fashion => "fashion-mnist",
        }
    }

    /// The normalisation (mean, std) of its training pixels.
    pub fn norm(self) -> (f32, f32) {
        match self {
            ImageData::Mnist => crate::data::MNIST_NORM,
            ImageData::Fashion => crate::data::FASHION_NORM,
        }
    }

    /// How it frames an image in its 28×28 square (digits centred by mass, clothes
    /// fitted).
    pub fn framing(self) -> crate::image::Framing {
        match self {
            ImageData::Mnist => crate::image::Framing::CentredByMass,
            ImageData::Fashion => crate::image::Framing::Fitted,
        }
    }

    /// Its class names.
    pub fn classes(self) -> &'static [&'static str; 10] {
        match self {
            ImageData::Mnist => &crate::data::MNIST_CLASSES,
            ImageData::Fashion => &crate::data::FASHION_CLASSES,
        }
    }
}

/// An image classifier's checkpoint (`--model`, `--dataset`, `--checkpoint`,
/// `--foreign`), flattened into the inference binaries.
#[derive(Args, Clone, Debug)]
pub struct ClassifierCheckpoint {
    /// The model.
    #[arg(long, value_enum, default_value = "mlp")]
    pub model: ClassifierKind,
    /// The data set it was trained on (its normalisation and class names).
    #[arg(long, value_enum, default_value = "mnist")]
    pub dataset: ImageData,
    /// The checkpoint (default: runs/MODEL-DATASET.safetensors in the current
    /// folder, where kiln-train saves it).
    #[arg(long)]
    pub checkpoint: Option<PathBuf>,
    #[command(flatten)]
    pub foreign: ForeignArg,
}

impl ClassifierCheckpoint {
    /// The checkpoint's path: `--checkpoint`, or where `kiln-train` saves it.
    pub fn path(&self) -> PathBuf {
        self.checkpoint.clone().unwrap_or_else(|| {
            default_checkpoint(
                &format!("{:?}-{:?}.safetensors", self.model, self.dataset).to_lowercase(),
            )
        })
    }

    /// An error unless what `kiln-train` recorded in the checkpoint (model, data set)
    /// agrees with the flags.
    pub fn check_recorded(&self) -> Result<()> {
        check_recorded(&self.path(), self.model, self.dataset)
    }

    /// The model it holds, on `device`, once what `kiln-train` recorded (model, data
    /// set) agrees with the flags.
    pub fn load<B: Backend, M: Module<B>>(&self, device: &B::Device) -> Result<M> {
        let path = self.path();
        check_recorded(&path, self.model, self.dataset)?;
        self.foreign.load_new(&path, device)
    }
}

/// Refuses a checkpoint whose recorded model or data set (what `kiln-train` writes in
/// its metadata) differs from the command line's, naming the flag that would fit.
fn check_recorded(path: &Path, model: ClassifierKind, data: ImageData) -> Result<()> {
    let meta = checkpoint::read_metadata(path)?;
    for (key, flag, asked) in [
        ("model", "--model", format!("{model:?}").to_lowercase()),
        ("dataset", "--dataset", format!("{data:?}").to_lowercase()),
    ] {
        if let Some(recorded) = meta.get(key).filter(|r| **r != asked) {
            return Err(Error::invalid(
                "checkpoint",
                format!(
                    "{} was trained as {key} {recorded}, not {asked}: pass {flag} {recorded}",
                    path.display()
                ),
            ));
        }
    }
    Ok(())
}
