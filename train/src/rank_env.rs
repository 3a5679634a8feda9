//! Where a rank learns its place: the variables that Kiln's own launcher
//! ([`crate::launch`]), torchrun, Slurm's `srun` and MPI's `mpirun` give each process
//! they start, read into one [`RankEnv`] (its rank, the world size, its rank on its
//! machine, which picks its GPU, and where the ranks meet).

use crate::launch::check_timeout;
use kiln_tensor::{Error, Result};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The environment variable holding a rank's number, set by Kiln's launcher.
pub const RANK_VAR: &str = "KILN_RANK";
/// The environment variable holding the number of ranks, set by Kiln's launcher.
pub const WORLD_VAR: &str = "KILN_WORLD";
/// The environment variable naming the folder the ranks meet in, set by Kiln's launcher.
pub const RENDEZVOUS_VAR: &str = "KILN_RENDEZVOUS";
/// The environment variable Kiln's launcher sets (to 1): its ranks leave their errors
/// to it.
pub const LAUNCHER_VAR: &str = "KILN_LAUNCHER";
/// The environment variable Kiln's launcher sets to its own process id: its ranks stop
/// when it dies ([`RankEnv::watch_launcher`]).
pub const LAUNCHER_PID_VAR: &str = "KILN_LAUNCHER_PID";

/// The port ranks started by `srun` meet on when `MASTER_PORT` is not set is
/// `SLURM_PORT_BASE` plus the job id modulo [`SLURM_PORT_SPAN`], so that two jobs
/// sharing a node do not take one port.
pub const SLURM_PORT_BASE: u16 = 20000;
/// See [`SLURM_PORT_BASE`].
pub const SLURM_PORT_SPAN: u16 = 10000;

/// The rendezvous file a failing rank leaves its error in (`failure-<rank>`).
pub(crate) const FAILURE_FILE: &str = "failure";

/// What started the ranks of a job, and so which variables told this rank its place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Starter {
    /// `kiln-train --ranks N` ([`crate::launch::launch`]): `KILN_RANK`, `KILN_WORLD`.
    Kiln,
    /// torchrun, or anything setting PyTorch's variables: `RANK`, `WORLD_SIZE`,
    /// `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`.
    Torchrun,
    /// Slurm's `srun`: `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`, the node list.
    Slurm,
    /// An MPI launcher (`mpirun`, `mpiexec`, or `srun` with PMI): the MPI library knows
    /// the peers.
    Mpi,
}

impl Starter {
    /// The launcher as users know it.
    pub fn name(self) -> &'static str {
        match self {
            Starter::Kiln => "kiln-train --ranks",
            Starter::Torchrun => "torchrun",
            Starter::Slurm => "srun",
            Starter::Mpi => "mpirun",
        }
    }

    /// The variables holding the rank and the world size.
    pub fn variables(self) -> &'static str {
        match self {
            Starter::Kiln => "KILN_RANK, KILN_WORLD",
            Starter::Torchrun => "RANK, WORLD_SIZE",
            Starter::Slurm => "SLURM_PROCID, SLURM_NTASKS",
            Starter::Mpi => "the MPI launcher's variables",
        }
    }
}

/// Where the ranks of a job meet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Meeting {
    /// A folder of this machine ([`crate::launch::launch`]'s): rank 0 publishes the
    /// loopback port it listens on there.
    Folder(PathBuf),
    /// Rank 0 listens on `port` of the machine called `host` (`MASTER_ADDR`,
    /// `MASTER_PORT`); the others connect there. Under torchrun, whose agent holds that
    /// port with PyTorch's store, rank 0 listens on a port of its own instead and
    /// publishes it in the store under `store_key`.
    Tcp {
        /// The host name or address rank 0 runs on.
        host: String,
        /// The port rank 0 listens on, or torchrun's store's.
        port: u16,
        /// Where rank 0 publishes its port in torchrun's store, when the store holds
        /// `port`.
        store_key: Option<String>,
    },
    /// MPI's world: the MPI library started by the launcher connects the ranks.
    Mpi,
}

/// A rank's place in a job, as its starter described it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankEnv {
    /// This process's rank, `0..world`.
    pub rank: usize,
    /// How many ranks there are.
    pub world: usize,
    /// This process's rank among those of its machine: `--device cuda` takes the GPU of
    /// this number (after the device's own).
    pub local_rank: usize,
    /// The number of this rank's machine, when its starter says (torchrun's
    /// `GROUP_RANK`, Slurm's `SLURM_NODEID`); errors name it.
    pub node: Option<usize>,
    /// What started the ranks.
    pub starter: Starter,
    /// Where the ranks meet.
    pub meeting: Meeting,
    /// Whether Kiln's launcher started this rank (it reads the rank's error when it
    /// fails); a rank started otherwise prints its own.
    pub launched: bool,
    /// The process id of the Kiln launcher that started this rank, when it said.
    pub launcher: Option<u32>,
}

/// An error in the variables a starter set.
fn bad(why: String) -> Error {
    Error::invalid("ranks", why)
}

/// The whole number in variable `name`.
fn number(name: &str, value: &str) -> Result<usize> {
    value
        .trim()
        .parse::<usize>()
        .map_err(|_| bad(format!("{name}={value} is not a whole number")))
}

/// Checks that `rank` is a rank of `world`, naming the variables.
fn check_place(rank: (&str, usize), world: (&str, usize)) -> Result<()> {
    if world.1 == 0 {
        return Err(bad(format!("{}=0: a job needs at least one rank", world.0)));
    }
    if rank.1 >= world.1 {
        return Err(bad(format!(
            "{}={} is not a rank of {}={} (ranks are 0 to {})",
            rank.0,
            rank.1,
            world.0,
            world.1,
            world.1 - 1
        )));
    }
    Ok(())
}

/// The port in variable `name`.
fn port(name: &str, value: &str) -> Result<u16> {
    match value.trim().parse::<u16>() {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(bad(format!(
            "{name}={value} is not a port (a number from 1 to 65535)"
        ))),
    }
}

/// The first host of a Slurm node list: `node[07-09,12],gpu1` gives `node07`.
pub fn first_slurm_host(list: &str) -> Option<String> {
    let list = list.trim();
    let end = list
        .char_indices()
        .scan(0i32, |depth, (i, c)| {
            match c {
                '[' => *depth += 1,
                ']' => *depth -= 1,
                _ => {}
            }
            Some((i, c, *depth))
        })
        .find(|&(_, c, depth)| c == ',' && depth == 0)
        .map_or(list.len(), |(i, _, _)| i);
    let first = &list[..end];
    let host = match first.split_once('[') {
        None => first.to_string(),
        Some((prefix, rest)) => {
            let ranges = rest.strip_suffix(']')?;
            let first_range = ranges.split(',').next()?;
            let low = first_range.split('-').next()?;
            if low.is_empty() || !low.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            format!("{prefix}{low}")
        }
    };
    (!host.is_empty()).then_some(host)
}

/// A rank as errors name it, with its node and host where known:
/// `rank 2 (node 1 on gpu7)`.
pub fn rank_name(rank: usize, node: Option<usize>, host: Option<&str>) -> String {
    match (node, host) {
        (Some(node), Some(host)) => format!("rank {rank} (node {node} on {host})"),
        (Some(node), None) => format!("rank {rank} (node {node})"),
        (None, Some(host)) => format!("rank {rank} (on {host})"),
        (None, None) => format!("rank {rank}"),
    }
}

impl RankEnv {
    /// The place this process's starter gave it, or `None` when no starter did; an
    /// error when the variables are there but make no sense.
    pub fn from_env() -> Result<Option<RankEnv>> {
        RankEnv::from_vars(&|name| std::env::var(name).ok())
    }

    /// [`RankEnv::from_env`] over the variables `get` returns. Kiln's launcher's
    /// variables come first, then torchrun's (which a torchrun inside a Slurm or MPI
    /// job sets for its own ranks), then an MPI launcher's, then Slurm's.
    pub fn from_vars(get: &dyn Fn(&str) -> Option<String>) -> Result<Option<RankEnv>> {
        if let Some(env) = RankEnv::kiln(get)? {
            return Ok(Some(env));
        }
        if get("RANK").is_some() || get("WORLD_SIZE").is_some() {
            return RankEnv::torchrun(get).map(Some);
        }
        if let Some(env) = RankEnv::mpi(get)? {
            return Ok(Some(env));
        }
        if get("SLURM_PROCID").is_some() {
            return RankEnv::slurm(get);
        }
        Ok(None)
    }

    /// Kiln's launcher's variables.
    fn kiln(get: &dyn Fn(&str) -> Option<String>) -> Result<Option<RankEnv>> {
        let (rank, world, dir) = match (get(RANK_VAR), get(WORLD_VAR), get(RENDEZVOUS_VAR)) {
            (None, None, None) => return Ok(None),
            (Some(r), Some(w), Some(d)) => (r, w, d),
            _ => {
                return Err(bad(format!(
                    "{RANK_VAR}, {WORLD_VAR} and {RENDEZVOUS_VAR} are set together (by kiln-train --ranks), not some of them"
                )))
            }
        };
        let (rank, world) = (number(RANK_VAR, &rank)?, number(WORLD_VAR, &world)?);
        check_place((RANK_VAR, rank), (WORLD_VAR, world))?;
        Ok(Some(RankEnv {
            rank,
            world,
            local_rank: rank,
            node: None,
            starter: Starter::Kiln,
            meeting: Meeting::Folder(PathBuf::from(dir)),
            launched: get(LAUNCHER_VAR).as_deref() == Some("1"),
            launcher: get(LAUNCHER_PID_VAR).and_then(|p| p.parse().ok()),
        }))
    }

    /// torchrun's variables, which it sets together.
    fn torchrun(get: &dyn Fn(&str) -> Option<String>) -> Result<RankEnv> {
        let need = |name: &str| {
            get(name).ok_or_else(|| {
                bad(format!(
                    "{name} is not set: torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT together"
                ))
            })
        };
        let rank = number("RANK", &need("RANK")?)?;
        let world = number("WORLD_SIZE", &need("WORLD_SIZE")?)?;
        check_place(("RANK", rank), ("WORLD_SIZE", world))?;
        let local_rank = number("LOCAL_RANK", &need("LOCAL_RANK")?)?;
        if let Some(local_world) = get("LOCAL_WORLD_SIZE") {
            let local_world = number("LOCAL_WORLD_SIZE", &local_world)?;
            check_place(
                ("LOCAL_RANK", local_rank),
                ("LOCAL_WORLD_SIZE", local_world),
            )?;
        }
        let host = need("MASTER_ADDR")?.trim().to_string();
        if host.is_empty() {
            return Err(bad("MASTER_ADDR is empty: give rank 0's host".into()));
        }
        let port = port("MASTER_PORT", &need("MASTER_PORT")?)?;
        let node = get("GROUP_RANK")
            .map(|n| number("GROUP_RANK", &n))
            .transpose()?;
        // torchrun's agent holds MASTER_PORT with its store; a restarted attempt of
        // the job must not read the port of the last.
        let store_key =
            (get("TORCHELASTIC_USE_AGENT_STORE").as_deref() == Some("True")).then(|| {
                format!(
                    "/kiln/{}/{}/rank-0-port",
                    get("TORCHELASTIC_RUN_ID").unwrap_or_default(),
                    get("TORCHELASTIC_RESTART_COUNT").unwrap_or_default()
                )
            });
        Ok(RankEnv {
            rank,
            world,
            local_rank,
            node,
            starter: Starter::Torchrun,
            meeting: Meeting::Tcp {
                host,
                port,
                store_key,
            },
            launched: false,
            launcher: None,
        })
    }

    /// An MPI launcher's variables: Open MPI's `OMPI_COMM_WORLD_*`, or the PMI ones
    /// MPICH's `mpiexec` and `srun --mpi=pmi2` set.
    fn mpi(get: &dyn Fn(&str) -> Option<String>) -> Result<Option<RankEnv>> {
        let names = if get("OMPI_COMM_WORLD_RANK").is_some() {
            (
                "OMPI_COMM_WORLD_RANK",
                "OMPI_COMM_WORLD_SIZE",
                "OMPI_COMM_WORLD_LOCAL_RANK",
            )
        } else if get("PMI_RANK").is_some() && get("PMI_SIZE").is_some() {
            ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID")
        } else {
            return Ok(None);
        };
        let rank = number(names.0, &get(names.0).unwrap_or_default())?;
        let world = number(
            names.1,
            &get(names.1).ok_or_else(|| bad(format!("{} is set but not {}", names.0, names.1)))?,
        )?;
        check_place((names.0, rank), (names.1, world))?;
        let local_rank = match get(names.2).or_else(|| get("SLURM_LOCALID")) {
            Some(l) => number(names.2, &l)?,
            None => 0,
        };
        let node = get("SLURM_NODEID")
            .map(|n| number("SLURM_NODEID", &n))
            .transpose()?;
        Ok(Some(RankEnv {
            rank,
            world,
            local_rank,
            node,
            starter: Starter::Mpi,
            meeting: Meeting::Mpi,
            launched: false,
            launcher: None,
        }))
    }

    /// Slurm's variables for a task of `srun`: the ranks meet on `MASTER_ADDR` (by
    /// default the job's first node) and `MASTER_PORT` (by default one derived from
    /// the job id). `None` for a job of one task (a batch script run as it is).
    fn slurm(get: &dyn Fn(&str) -> Option<String>) -> Result<Option<RankEnv>> {
        let rank = number("SLURM_PROCID", &get("SLURM_PROCID").unwrap_or_default())?;
        let (world_var, world) = match get("SLURM_STEP_NUM_TASKS") {
            Some(n) => ("SLURM_STEP_NUM_TASKS", n),
            None => (
                "SLURM_NTASKS",
                get("SLURM_NTASKS").ok_or_else(|| {
                    bad(
                        "SLURM_PROCID is set but not SLURM_NTASKS: start the ranks with srun"
                            .into(),
                    )
                })?,
            ),
        };
        let world = number(world_var, &world)?;
        check_place(("SLURM_PROCID", rank), (world_var, world))?;
        if world == 1 {
            return Ok(None);
        }
        let local_rank = match get("SLURM_LOCALID") {
            Some(l) => number("SLURM_LOCALID", &l)?,
            None => 0,
        };
        let node = get("SLURM_NODEID")
            .map(|n| number("SLURM_NODEID", &n))
            .transpose()?;
        let host = match get("MASTER_ADDR") {
            Some(h) if !h.trim().is_empty() => h.trim().to_string(),
            _ => {
                let list = [
                    "SLURM_STEP_NODELIST",
                    "SLURM_JOB_NODELIST",
                    "SLURM_NODELIST",
                ]
                .iter()
                .find_map(|name| get(name).map(|v| (*name, v)));
                match list {
                    Some((name, list)) => first_slurm_host(&list).ok_or_else(|| {
                        bad(format!(
                            "{name}={list} names no host: set MASTER_ADDR to rank 0's host"
                        ))
                    })?,
                    None => {
                        return Err(bad(
                            "no node list (SLURM_JOB_NODELIST) and no MASTER_ADDR: set MASTER_ADDR to rank 0's host".into(),
                        ))
                    }
                }
            }
        };
        let port = match get("MASTER_PORT") {
            Some(p) => port("MASTER_PORT", &p)?,
            None => {
                let job = get("SLURM_JOB_ID").ok_or_else(|| {
                    bad("neither MASTER_PORT nor SLURM_JOB_ID is set: set MASTER_PORT".into())
                })?;
                let job = number("SLURM_JOB_ID", &job)?;
                SLURM_PORT_BASE + (job % SLURM_PORT_SPAN as usize) as u16
            }
        };
        Ok(Some(RankEnv {
            rank,
            world,
            local_rank,
            node,
            starter: Starter::Slurm,
            meeting: Meeting::Tcp {
                host,
                port,
                store_key: None,
            },
            launched: false,
            launcher: None,
        }))
    }

    /// The rank as errors name it: its number, and its node when known.
    pub fn describe(&self) -> String {
        rank_name(self.rank, self.node, None)
    }

    /// The rendezvous folder of a rank started by Kiln's launcher.
    fn folder(&self) -> Result<&PathBuf> {
        match &self.meeting {
            Meeting::Folder(dir) => Ok(dir),
            _ => Err(bad(format!(
                "{} was started by {}, which gives no rendezvous folder",
                self.describe(),
                self.starter.name()
            ))),
        }
    }

    /// Stops this process when the Kiln launcher that started it dies (killed, say,
    /// with no chance to stop its ranks): a thread checks every 100 ms that this
    /// process is still the launcher's child, and once it is not, removes the
    /// rendezvous folder and exits with an error naming the launcher. Nothing for a
    /// rank that Kiln's launcher did not start, or on systems without parent process
    /// ids.
    pub fn watch_launcher(&self) {
        #[cfg(unix)]
        if let (Some(launcher), Ok(dir)) = (self.launcher, self.folder()) {
            let (rank, dir) = (self.rank, dir.clone());
            let _ = std::thread::Builder::new()
                .name("kiln-launcher-watch".into())
                .spawn(move || loop {
                    if std::os::unix::process::parent_id() != launcher {
                        let _ = std::fs::remove_dir_all(&dir);
                        eprintln!(
                            "error: rank {rank}: the launcher (process {launcher}) ended without stopping its ranks; stopping"
                        );
                        std::process::exit(1);
                    }
                    std::thread::sleep(Duration::from_millis(100));
                });
        }
    }

    /// Writes `bytes` as the rendezvous file `name`, whole (a reader never sees part
    /// of it).
    pub fn publish(&self, name: &str, bytes: &[u8]) -> Result<()> {
        let dir = self.folder()?;
        let tmp = dir.join(format!(".{name}.{}", self.rank));
        let io = |e: std::io::Error| bad(format!("writing {}: {e}", tmp.display()));
        std::fs::write(&tmp, bytes).map_err(io)?;
        std::fs::rename(&tmp, dir.join(name)).map_err(io)
    }

    /// Leaves this rank's error where Kiln's launcher reads it, so that the launch
    /// fails with one line naming the rank and its error (instead of each rank
    /// printing its own); false when it could not be left (the caller prints it then).
    pub fn report_failure(&self, error: &str) -> bool {
        self.launched
            && self
                .publish(&format!("{FAILURE_FILE}-{}", self.rank), error.as_bytes())
                .is_ok()
    }

    /// The rendezvous file `name` once another rank has published it, waiting at most
    /// `timeout`.
    pub fn wait_for(&self, name: &str, timeout: Duration) -> Result<Vec<u8>> {
        let path = self.folder()?.join(name);
        let deadline = Instant::now() + check_timeout("the rank timeout", timeout)?;
        loop {
            match std::fs::read(&path) {
                Ok(bytes) => return Ok(bytes),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(bad(format!("reading {}: {e}", path.display()))),
            }
            if Instant::now() >= deadline {
                return Err(bad(format!(
                    "rank {}: waited {:.0} s for rank 0 to publish {} (did rank 0 start?)",
                    self.rank,
                    timeout.as_secs_f64(),
                    path.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn read(vars: &[(&str, &str)]) -> Result<Option<RankEnv>> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        RankEnv::from_vars(&|name| map.get(name).cloned())
    }

    fn refused(vars: &[(&str, &str)], want: &str) {
        let err = read(vars).unwrap_err().to_string();
        assert!(err.contains(want), "{vars:?}: {err}");
    }

    const TORCHRUN: [(&str, &str); 7] = [
        ("RANK", "3"),
        ("WORLD_SIZE", "4"),
        ("LOCAL_RANK", "1"),
        ("LOCAL_WORLD_SIZE", "2"),
        ("GROUP_RANK", "1"),
        ("MASTER_ADDR", "node0.example"),
        ("MASTER_PORT", "29500"),
    ];

    #[test]
    fn torchrun_places_a_rank_and_its_gpu() {
        let env = read(&TORCHRUN).unwrap().unwrap();
        assert_eq!((env.rank, env.world, env.local_rank), (3, 4, 1));
        assert_eq!(env.node, Some(1));
        assert_eq!(env.starter, Starter::Torchrun);
        assert_eq!(
            env.meeting,
            Meeting::Tcp {
                host: "node0.example".into(),
                port: 29500,
                store_key: None,
            }
        );
        assert_eq!(env.describe(), "rank 3 (node 1)");
        // Under torchrun's agent, rank 0 publishes its port in the agent's store.
        let agent: Vec<_> = TORCHRUN
            .iter()
            .copied()
            .chain([
                ("TORCHELASTIC_USE_AGENT_STORE", "True"),
                ("TORCHELASTIC_RUN_ID", "job7"),
                ("TORCHELASTIC_RESTART_COUNT", "2"),
            ])
            .collect();
        let Meeting::Tcp { store_key, .. } = read(&agent).unwrap().unwrap().meeting else {
            panic!("torchrun's ranks meet over TCP");
        };
        assert_eq!(store_key.as_deref(), Some("/kiln/job7/2/rank-0-port"));
        // torchrun's variables win over the Slurm job it may run in.
        let inside: Vec<_> = TORCHRUN
            .iter()
            .copied()
            .chain([("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2")])
            .collect();
        assert_eq!(read(&inside).unwrap().unwrap().starter, Starter::Torchrun);
    }

    #[test]
    fn torchrun_variables_that_make_no_sense_are_refused() {
        fn with<'a>(name: &'a str, value: &str) -> Vec<(&'a str, String)> {
            TORCHRUN
                .iter()
                .filter(|(k, _)| *k != name)
                .map(|(k, v)| (*k, v.to_string()))
                .chain((!value.is_empty()).then(|| (name, value.to_string())))
                .collect()
        }
        let check = |name: &str, value: &str, want: &str| {
            let vars = with(name, value);
            let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
            refused(&vars, want);
        };
        check(
            "WORLD_SIZE",
            "",
            "WORLD_SIZE is not set: torchrun sets RANK",
        );
        check(
            "RANK",
            "4",
            "RANK=4 is not a rank of WORLD_SIZE=4 (ranks are 0 to 3)",
        );
        check(
            "WORLD_SIZE",
            "0",
            "WORLD_SIZE=0: a job needs at least one rank",
        );
        check(
            "WORLD_SIZE",
            "four",
            "WORLD_SIZE=four is not a whole number",
        );
        check("RANK", "-1", "RANK=-1 is not a whole number");
        check("LOCAL_RANK", "", "LOCAL_RANK is not set");
        check(
            "LOCAL_RANK",
            "2",
            "LOCAL_RANK=2 is not a rank of LOCAL_WORLD_SIZE=2",
        );
        check("MASTER_PORT", "0", "MASTER_PORT=0 is not a port");
        check("MASTER_PORT", "70000", "MASTER_PORT=70000 is not a port");
        check("MASTER_ADDR", " ", "MASTER_ADDR is empty");
        check("MASTER_ADDR", "", "MASTER_ADDR is not set");
    }

    #[test]
    fn slurm_tasks_meet_on_the_first_node_of_the_job() {
        let vars = [
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_NODEID", "2"),
            ("SLURM_JOB_NODELIST", "gpu[003-006,9],cpu1"),
            ("SLURM_JOB_ID", "123456"),
        ];
        let env = read(&vars).unwrap().unwrap();
        assert_eq!((env.rank, env.world, env.local_rank), (5, 8, 1));
        assert_eq!(env.starter, Starter::Slurm);
        assert_eq!(
            env.meeting,
            Meeting::Tcp {
                host: "gpu003".into(),
                port: 20000 + 3456,
                store_key: None,
            }
        );
        assert_eq!(env.describe(), "rank 5 (node 2)");
        let given: Vec<_> = vars
            .iter()
            .copied()
            .chain([("MASTER_ADDR", "head"), ("MASTER_PORT", "4000")])
            .collect();
        assert_eq!(
            read(&given).unwrap().unwrap().meeting,
            Meeting::Tcp {
                host: "head".into(),
                port: 4000,
                store_key: None,
            }
        );
        // A batch script of one task is no job of ranks.
        assert_eq!(
            read(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "1")]).unwrap(),
            None
        );
        refused(
            &[("SLURM_PROCID", "2"), ("SLURM_NTASKS", "2")],
            "SLURM_PROCID=2 is not a rank of SLURM_NTASKS=2",
        );
        refused(
            &[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2")],
            "no node list (SLURM_JOB_NODELIST) and no MASTER_ADDR",
        );
        refused(
            &[
                ("SLURM_PROCID", "0"),
                ("SLURM_NTASKS", "2"),
                ("SLURM_JOB_NODELIST", "[]"),
            ],
            "SLURM_JOB_NODELIST=[] names no host",
        );
    }

    #[test]
    fn slurm_node_lists_give_their_first_host() {
        for (list, first) in [
            ("node1", Some("node1")),
            ("a,b", Some("a")),
            ("n[07-09,12]", Some("n07")),
            ("n[2,5-6],m[1-2]", Some("n2")),
            ("rack1-n[10-11]", Some("rack1-n10")),
            ("", None),
            ("n[x-y]", None),
            ("n[", None),
        ] {
            assert_eq!(first_slurm_host(list).as_deref(), first, "{list}");
        }
    }

    #[test]
    fn mpi_launchers_and_kiln_place_their_ranks() {
        let env = read(&[
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((env.rank, env.world, env.local_rank), (2, 4, 0));
        assert_eq!((env.starter, env.meeting), (Starter::Mpi, Meeting::Mpi));
        let mpich = read(&[
            ("PMI_RANK", "1"),
            ("PMI_SIZE", "2"),
            ("MPI_LOCALRANKID", "1"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((mpich.rank, mpich.world, mpich.local_rank), (1, 2, 1));
        refused(
            &[("OMPI_COMM_WORLD_RANK", "2"), ("OMPI_COMM_WORLD_SIZE", "2")],
            "OMPI_COMM_WORLD_RANK=2 is not a rank of OMPI_COMM_WORLD_SIZE=2",
        );
        let kiln = read(&[
            (RANK_VAR, "1"),
            (WORLD_VAR, "2"),
            (RENDEZVOUS_VAR, "/tmp/r"),
            (LAUNCHER_VAR, "1"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((kiln.rank, kiln.local_rank, kiln.launched), (1, 1, true));
        assert_eq!(kiln.meeting, Meeting::Folder("/tmp/r".into()));
        refused(&[(RANK_VAR, "1")], "are set together");
        assert_eq!(read(&[]).unwrap(), None);
    }
}
