//! Choosing a backend and device at run time (what a binary's `--device` takes):
//! [`DeviceChoice`] parses `cpu`, `wgpu`, `wgpu:N`, `cuda` or `cuda:N`; [`run_on`] opens
//! the device and runs backend-generic work ([`OnDevice`]) on it. Backends this build
//! of `kiln` lacks (the `wgpu` and `cuda` features) are refused with the build line
//! that adds them; a device that does not open says what to install.

use kiln_tensor::{Backend, Error, Result};
use std::fmt;
use std::str::FromStr;

/// A backend and the index of its device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceChoice {
    /// The CPU backend (all cores, through rayon).
    Cpu,
    /// wgpu's `N`-th adapter (hardware adapters first, then software ones: lavapipe).
    Wgpu(usize),
    /// CUDA device `N`.
    Cuda(usize),
}

impl FromStr for DeviceChoice {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let usage = "use cpu, wgpu, wgpu:N (the N-th adapter, GPUs first), cuda or cuda:N";
        let (name, index) = match s.split_once(':') {
            Some((name, n)) => {
                let i = n.parse::<usize>().map_err(|_| {
                    format!("`{s}`: the device index `{n}` is not a whole number; {usage}")
                })?;
                (name, Some(i))
            }
            None => (s, None),
        };
        match (name, index) {
            ("cpu", None) => Ok(DeviceChoice::Cpu),
            ("cpu", Some(_)) => Err(format!("`{s}`: the CPU has no device index; {usage}")),
            ("wgpu", i) => Ok(DeviceChoice::Wgpu(i.unwrap_or(0))),
            ("cuda", i) => Ok(DeviceChoice::Cuda(i.unwrap_or(0))),
            _ => Err(format!("unknown device `{s}`: {usage}")),
        }
    }
}

impl fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceChoice::Cpu => write!(f, "cpu"),
            DeviceChoice::Wgpu(i) => write!(f, "wgpu:{i}"),
            DeviceChoice::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

/// Work generic over the backend, for [`run_on`] (Rust has no generic closures).
pub trait OnDevice {
    /// What the work returns.
    type Output;

    /// Runs on `device` of backend `B`; `name` is the device in words.
    fn run<B: Backend>(self, device: &B::Device, name: &str) -> Result<Self::Output>;
}

/// The backends this build of `kiln` has (its features), as `--device` names them.
pub fn built_backends() -> Vec<&'static str> {
    let mut out = Vec::new();
    if cfg!(feature = "cpu") {
        out.push("cpu");
    }
    if cfg!(feature = "wgpu") {
        out.push("wgpu");
    }
    if cfg!(feature = "cuda") {
        out.push("cuda");
    }
    out
}

/// Opens the device `choice` names and runs `work` on it.
pub fn run_on<W: OnDevice>(choice: DeviceChoice, work: W) -> Result<W::Output> {
    match choice {
        DeviceChoice::Cpu => {
            #[cfg(feature = "cpu")]
            {
                work.run::<kiln_cpu::Cpu>(&kiln_cpu::CpuDevice, "the CPU")
            }
            #[cfg(not(feature = "cpu"))]
            {
                Err(not_built("cpu"))
            }
        }
        DeviceChoice::Wgpu(i) => {
            #[cfg(feature = "wgpu")]
            {
                let d = kiln_cubecl::WgpuDevice::new(i)?;
                let name = d.name().to_string();
                work.run::<kiln_cubecl::Wgpu>(&d, &name)
            }
            #[cfg(not(feature = "wgpu"))]
            {
                let _ = (i, work);
                Err(not_built("wgpu"))
            }
        }
        DeviceChoice::Cuda(i) => {
            #[cfg(feature = "cuda")]
            {
                let d = kiln_cubecl::CudaDevice::new(i)?;
                let name = d.name().to_string();
                work.run::<kiln_cubecl::Cuda>(&d, &name)
            }
            #[cfg(not(feature = "cuda"))]
            {
                let _ = (i, work);
                Err(not_built("cuda"))
            }
        }
    }
}

/// The error for a backend this build lacks.
#[allow(dead_code)]
fn not_built(feature: &str) -> Error {
    // The zoo's binaries are named in the example; another program gets kiln-train's.
    let program = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .filter(|name| name.starts_with("kiln-"))
        .unwrap_or_else(|| "kiln-train".into());
    Error::invalid(
        "device",
        format!(
            "this program was built without the `{feature}` backend (it has: {}); rebuild it with `--features {feature}`, e.g. `cargo run --release -p kiln-models --features {feature} --bin {program} -- --device {feature}`",
            built_backends().join(", ")
        ),
    )
}

/// Joins this process's rank of a data-parallel job, on `device`, wherever its
/// starter placed it ([`kiln_train::rank_env::RankEnv`]): through NCCL between CUDA
/// devices (rank 0 makes the group's id and hands it out where the ranks meet, over
/// TCP or MPI), through MPI between CPU ranks that an MPI launcher started, and through
/// TCP otherwise. Waits at most `timeout` for the other ranks, to meet and in every
/// exchange. Ranks that meet over TCP compare their `settings` (what decides the
/// values of the steps: a learning rate, a batch size, a seed) and stop, naming those
/// that differ; MPI ranks, which one command line starts, do not.
pub fn join_ranks<B: Backend>(
    device: &B::Device,
    env: &kiln_train::rank_env::RankEnv,
    timeout: std::time::Duration,
    settings: &std::collections::BTreeMap<String, String>,
) -> Result<Box<dyn kiln_tensor::Collective<B>>> {
    use kiln_train::rank_env::Meeting;
    let timeout = kiln_train::launch::check_timeout("the rank timeout", timeout)?;
    #[cfg(feature = "cuda")]
    {
        use std::any::Any;
        if let Some(cuda) = (device as &dyn Any).downcast_ref::<kiln_cubecl::CudaDevice>() {
            use kiln_cubecl::nccl::{NcclId, NcclRank};
            let made = match env.rank {
                0 => NcclId::new()?.to_bytes(),
                _ => Vec::new(),
            };
            let shared = match env.meeting {
                Meeting::Mpi => {
                    #[cfg(feature = "mpi")]
                    {
                        kiln_train::mpi_rank::MpiRank::join(env, timeout)?.share_from_root(&made)?
                    }
                    #[cfg(not(feature = "mpi"))]
                    {
                        return Err(mpi_not_built(env));
                    }
                }
                _ => kiln_train::tcp::meet(env, timeout, settings, &made)?.shared,
            };
            let rank = NcclRank::join(
                cuda,
                &NcclId::from_bytes(&shared)?,
                env.rank,
                env.world,
                timeout,
            )?;
            let boxed: Box<dyn kiln_tensor::Collective<kiln_cubecl::Cuda>> = Box::new(rank);
            let any: Box<dyn Any> = Box::new(boxed);
            return any
                .downcast::<Box<dyn kiln_tensor::Collective<B>>>()
                .map(|b| *b)
                .map_err(|_| Error::invalid("join_ranks", "a CUDA device of another backend"));
        }
    }
    let _ = device;
    match env.meeting {
        Meeting::Mpi => {
            #[cfg(feature = "mpi")]
            {
                Ok(Box::new(kiln_train::mpi_rank::MpiRank::join(env, timeout)?))
            }
            #[cfg(not(feature = "mpi"))]
            {
                Err(mpi_not_built(env))
            }
        }
        _ => Ok(Box::new(kiln_train::tcp::TcpRank::join(
            env, timeout, settings,
        )?)),
    }
}

/// The error for a rank that an MPI launcher started, in a build without MPI.
#[cfg(not(feature = "mpi"))]
fn mpi_not_built(env: &kiln_train::rank_env::RankEnv) -> Error {
    Error::invalid(
        "ranks",
        format!(
            "{} was started by an MPI launcher, but this program was built without MPI: rebuild it with `--features mpi` (it needs Open MPI or MPICH with its development files, and libclang), or start the ranks with torchrun or srun",
            env.describe()
        ),
    )
}

/// Ends this process's part in a job of ranks: an MPI job is finalised when the rank
/// succeeded and aborted (every rank of it) when it failed; nothing otherwise.
pub fn end_ranks(succeeded: bool) {
    #[cfg(feature = "mpi")]
    kiln_train::mpi_rank::end_job(succeeded);
    let _ = succeeded;
}

#[cfg(test)]
mod tests {
    use super::DeviceChoice;

    #[test]
    fn device_names_parse_and_print_back() {
        for (s, want) in [
            ("cpu", DeviceChoice::Cpu),
            ("wgpu", DeviceChoice::Wgpu(0)),
            ("wgpu:1", DeviceChoice::Wgpu(1)),
            ("cuda", DeviceChoice::Cuda(0)),
            ("cuda:3", DeviceChoice::Cuda(3)),
        ] {
            let got: DeviceChoice = s.parse().unwrap();
            assert_eq!(got, want);
            assert_eq!(got.to_string().parse::<DeviceChoice>().unwrap(), want);
        }
        for bad in ["gpu", "cpu:0", "cuda:x", "cuda:-1", "", "wgpu:"] {
            assert!(bad.parse::<DeviceChoice>().is_err(), "{bad}");
        }
    }
}
