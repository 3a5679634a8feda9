//! Kiln's own launcher of a data-parallel job on one machine, one process per rank, as
//! `torchrun` is PyTorch's: [`launch`] starts the ranks (this program again, or any
//! other) with their place and a rendezvous folder in the environment
//! ([`crate::rank_env`]), and stops them all, naming the rank, when one fails. Ranks
//! started by torchrun, Slurm or MPI read their place from those launchers' variables
//! instead; where ranks meet and exchange is [`crate::tcp`]'s (and MPI's).

use crate::rank_env::{
    FAILURE_FILE, LAUNCHER_PID_VAR, LAUNCHER_VAR, RANK_VAR, RENDEZVOUS_VAR, WORLD_VAR,
};
use kiln_tensor::{Error, Result};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

/// The longest ranks may be told to wait for one another: a week. Longer is a
/// mistake (and past the clock's range, an overflow).
pub const MAX_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);

/// Rank processes per core that [`launch`] starts at most: past that, ranks only
/// take turns on the cores and their memory adds up.
pub const RANKS_PER_CORE: usize = 4;

/// `timeout` when ranks may wait that long ([`MAX_TIMEOUT`]), else an error naming the
/// limit; `what` names the setting.
pub fn check_timeout(what: &str, timeout: Duration) -> Result<Duration> {
    if timeout.is_zero() {
        return Err(Error::invalid(
            "launch",
            format!(
                "{what} 0 fails every exchange: give the seconds ranks may wait for one another"
            ),
        ));
    }
    if timeout > MAX_TIMEOUT {
        return Err(Error::invalid(
            "launch",
            format!(
                "{what} {} s is longer than ranks may wait for one another (at most {} s, a week)",
                timeout.as_secs(),
                MAX_TIMEOUT.as_secs()
            ),
        ));
    }
    Ok(timeout)
}

/// The most rank processes this machine holds: [`RANKS_PER_CORE`] per core.
pub fn max_ranks() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    cores * RANKS_PER_CORE
}

/// How long ranks wait for one another (to meet, and in each exchange) by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// Runs `program` with `args` as `world` ranks, each with its place
/// ([`crate::rank_env::RankEnv`]) in the environment and the launcher's stdout and
/// stderr, and waits for all of them. When one fails, the others are stopped and the
/// error names the rank and how it ended; when the launcher dies, ranks that watch it
/// stop ([`crate::rank_env::RankEnv::watch_launcher`]). At most [`max_ranks`] ranks.
pub fn launch(world: usize, program: &Path, args: &[String]) -> Result<()> {
    if world == 0 {
        return Err(Error::invalid("launch", "a run needs at least one rank"));
    }
    let most = max_ranks();
    if world > most {
        return Err(Error::invalid(
            "launch",
            format!(
                "{world} ranks are more processes than this machine holds: at most {most} ({RANKS_PER_CORE} per core of its {})",
                most / RANKS_PER_CORE
            ),
        ));
    }
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let dir = std::env::temp_dir().join(format!("kiln-ranks-{}-{stamp}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| {
        Error::invalid(
            "launch",
            format!("making the rendezvous folder {}: {e}", dir.display()),
        )
    })?;
    let result = run_ranks(world, program, args, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// Starts the ranks and watches them until all succeed or one fails.
fn run_ranks(world: usize, program: &Path, args: &[String], dir: &Path) -> Result<()> {
    let mut children: Vec<Option<Child>> = Vec::with_capacity(world);
    for rank in 0..world {
        let child = Command::new(program)
            .args(args)
            .env(RANK_VAR, rank.to_string())
            .env(WORLD_VAR, world.to_string())
            .env(RENDEZVOUS_VAR, dir)
            .env(LAUNCHER_VAR, "1")
            .env(LAUNCHER_PID_VAR, std::process::id().to_string())
            .stdin(Stdio::null())
            .spawn();
        match child {
            Ok(c) => children.push(Some(c)),
            Err(e) => {
                stop(&mut children);
                return Err(Error::invalid(
                    "launch",
                    format!("starting rank {rank} ({}): {e}", program.display()),
                ));
            }
        }
    }
    loop {
        let mut running = 0;
        for rank in 0..world {
            let Some(child) = children[rank].as_mut() else {
                continue;
            };
            match child.try_wait() {
                Ok(None) => running += 1,
                Ok(Some(status)) if status.success() => children[rank] = None,
                Ok(Some(status)) => {
                    children[rank] = None;
                    let stopped = stop(&mut children);
                    let said = std::fs::read_to_string(dir.join(format!("{FAILURE_FILE}-{rank}")));
                    return Err(rank_failed(rank, status, said.ok().as_deref(), &stopped));
                }
                Err(e) => {
                    stop(&mut children);
                    return Err(Error::invalid(
                        "launch",
                        format!("watching rank {rank}: {e}"),
                    ));
                }
            }
        }
        if running == 0 {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Kills every rank still running and returns their numbers.
fn stop(children: &mut [Option<Child>]) -> Vec<usize> {
    let mut stopped = Vec::new();
    for (rank, slot) in children.iter_mut().enumerate() {
        if let Some(mut child) = slot.take() {
            if let Ok(None) = child.try_wait() {
                let _ = child.kill();
                stopped.push(rank);
            }
            let _ = child.wait();
        }
    }
    stopped
}

/// The launch's error when `rank` ended with `status`, having said `said`
/// ([`RankEnv::report_failure`]).
fn rank_failed(rank: usize, status: ExitStatus, said: Option<&str>, stopped: &[usize]) -> Error {
    let how = match status.code() {
        Some(code) => format!("exited with status {code}"),
        None => {
            #[cfg(unix)]
            {
                use std::os::unix::process::ExitStatusExt;
                format!("was killed by signal {}", status.signal().unwrap_or(0))
            }
            #[cfg(not(unix))]
            {
                "was killed".to_string()
            }
        }
    };
    let others = if stopped.is_empty() {
        String::new()
    } else {
        let list: Vec<String> = stopped.iter().map(usize::to_string).collect();
        format!("; stopped rank(s) {}", list.join(", "))
    };
    match said {
        Some(error) => Error::invalid(
            "launch",
            format!("rank {rank} {how}: {}{others}", error.trim()),
        ),
        None => Error::invalid("launch", format!("rank {rank} {how}{others}")),
    }
}
