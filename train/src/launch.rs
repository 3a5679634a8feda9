//! Running a data-parallel job as one process per rank, as `torchrun` does: [`launch`]
//! starts the ranks (this program again, or any other) with their rank, the world size
//! and a rendezvous folder in the environment ([`RankEnv`]), and stops them all, naming
//! the rank, when one fails. [`TcpRank`] is the collective of ranks that are processes
//! of one machine without NCCL (the CPU): rank 0 gathers every exchange over loopback
//! sockets and answers each rank. CUDA ranks exchange through NCCL instead (kiln-cubecl),
//! after meeting in the same rendezvous folder.

use kiln_tensor::{Backend, Collective, Error, HostData, RawTensor, Result};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The environment variable holding a launched process's rank.
pub const RANK_VAR: &str = "KILN_RANK";
/// The environment variable holding the number of ranks.
pub const WORLD_VAR: &str = "KILN_WORLD";
/// The environment variable naming the folder the ranks meet in.
pub const RENDEZVOUS_VAR: &str = "KILN_RENDEZVOUS";
/// The environment variable [`launch`] sets (to 1): its ranks leave their errors to it.
pub const LAUNCHER_VAR: &str = "KILN_LAUNCHER";
/// The environment variable [`launch`] sets to its own process id: its ranks stop when
/// it dies ([`RankEnv::watch_launcher`]).
pub const LAUNCHER_PID_VAR: &str = "KILN_LAUNCHER_PID";

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

/// The rendezvous file a failing rank leaves its error in (`failure-<rank>`).
const FAILURE_FILE: &str = "failure";

/// How long ranks wait for one another (to meet, and in each exchange) by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// What [`launch`] tells each rank: its number, the world size and where ranks meet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankEnv {
    /// This process's rank, `0..world`.
    pub rank: usize,
    /// How many ranks there are.
    pub world: usize,
    /// The folder the ranks meet in (rank 0 writes what the others need to reach it).
    pub rendezvous: PathBuf,
    /// Whether [`launch`] started this rank (it reads the rank's error when it fails);
    /// a rank started otherwise prints its own.
    pub launched: bool,
    /// The process id of the launcher that started this rank, when it said.
    pub launcher: Option<u32>,
}

impl RankEnv {
    /// The rank this process was launched as, or `None` outside a launch; an error
    /// when the variables are there but make no sense.
    pub fn from_env() -> Result<Option<RankEnv>> {
        let get = |name: &str| std::env::var(name).ok();
        let (rank, world, dir) = match (get(RANK_VAR), get(WORLD_VAR), get(RENDEZVOUS_VAR)) {
            (None, None, None) => return Ok(None),
            (Some(r), Some(w), Some(d)) => (r, w, d),
            _ => {
                return Err(Error::invalid(
                    "launch",
                    format!("{RANK_VAR}, {WORLD_VAR} and {RENDEZVOUS_VAR} are set together (by a launch), not some of them"),
                ))
            }
        };
        let number = |name: &str, v: &str| {
            v.parse::<usize>()
                .map_err(|_| Error::invalid("launch", format!("{name}={v} is not a whole number")))
        };
        let (rank, world) = (number(RANK_VAR, &rank)?, number(WORLD_VAR, &world)?);
        if rank >= world {
            return Err(Error::invalid(
                "launch",
                format!("{RANK_VAR}={rank} is not a rank of {WORLD_VAR}={world}"),
            ));
        }
        Ok(Some(RankEnv {
            rank,
            world,
            rendezvous: PathBuf::from(dir),
            launched: get(LAUNCHER_VAR).as_deref() == Some("1"),
            launcher: get(LAUNCHER_PID_VAR).and_then(|p| p.parse().ok()),
        }))
    }

    /// Stops this process when the launcher that started it dies (killed, say, with
    /// no chance to stop its ranks): a thread checks every 100 ms that this process is
    /// still the launcher's child, and once it is not, removes the rendezvous folder
    /// and exits with an error naming the launcher. Nothing for a rank that was not
    /// launched by [`launch`], or on systems without parent process ids.
    pub fn watch_launcher(&self) {
        #[cfg(unix)]
        if let Some(launcher) = self.launcher {
            let (rank, dir) = (self.rank, self.rendezvous.clone());
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
        let tmp = self.rendezvous.join(format!(".{name}.{}", self.rank));
        let io =
            |e: std::io::Error| Error::invalid("launch", format!("writing {}: {e}", tmp.display()));
        std::fs::write(&tmp, bytes).map_err(io)?;
        std::fs::rename(&tmp, self.rendezvous.join(name)).map_err(io)
    }

    /// Leaves this rank's error where the launcher reads it, so that the launch fails
    /// with one line naming the rank and its error (instead of each rank printing its
    /// own); false when it could not be left (the caller prints it then).
    pub fn report_failure(&self, error: &str) -> bool {
        self.launched
            && self
                .publish(&format!("{FAILURE_FILE}-{}", self.rank), error.as_bytes())
                .is_ok()
    }

    /// The rendezvous file `name` once another rank has published it, waiting at most
    /// `timeout`.
    pub fn wait_for(&self, name: &str, timeout: Duration) -> Result<Vec<u8>> {
        let path = self.rendezvous.join(name);
        let deadline = Instant::now() + check_timeout("the rank timeout", timeout)?;
        loop {
            match std::fs::read(&path) {
                Ok(bytes) => return Ok(bytes),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(Error::invalid(
                        "launch",
                        format!("reading {}: {e}", path.display()),
                    ))
                }
            }
            if Instant::now() >= deadline {
                return Err(Error::invalid(
                    "launch",
                    format!(
                        "rank {}: waited {:.0} s for rank 0 to publish {} (did rank 0 start?)",
                        self.rank,
                        timeout.as_secs_f64(),
                        path.display()
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Runs `program` with `args` as `world` ranks, each with its [`RankEnv`] in the
/// environment and the launcher's stdout and stderr, and waits for all of them. When
/// one fails, the others are stopped and the error names the rank and how it ended;
/// when the launcher dies, ranks that watch it stop ([`RankEnv::watch_launcher`]).
/// At most [`max_ranks`] ranks.
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

/// One rank of processes exchanging over loopback sockets: rank 0 holds a connection
/// to every other rank, gathers each exchange in rank order and sends every rank the
/// result, so that all get the same bits.
pub struct TcpRank {
    rank: usize,
    world: usize,
    timeout: Duration,
    /// Rank 0: the streams of ranks `1..world`, in rank order; other ranks: rank 0's.
    peers: Vec<TcpStream>,
    /// Why the group cannot go on: later calls fail at once.
    failed: std::cell::RefCell<Option<String>>,
}

/// The rendezvous file holding rank 0's port.
const PORT_FILE: &str = "tcp-port";

impl TcpRank {
    /// Joins the group `env` describes: rank 0 listens on loopback and publishes its
    /// port; the others connect. Waits at most `timeout` for the others, here and in
    /// every exchange.
    pub fn join(env: &RankEnv, timeout: Duration) -> Result<TcpRank> {
        let fail = |why: String| Error::invalid("TcpRank", format!("rank {}: {why}", env.rank));
        let deadline = Instant::now() + check_timeout("the rank timeout", timeout)?;
        let mut peers = Vec::new();
        if env.rank == 0 {
            let listener = TcpListener::bind("127.0.0.1:0")
                .map_err(|e| fail(format!("listening on loopback: {e}")))?;
            let port = listener
                .local_addr()
                .map_err(|e| fail(e.to_string()))?
                .port();
            env.publish(PORT_FILE, port.to_string().as_bytes())?;
            listener
                .set_nonblocking(true)
                .map_err(|e| fail(e.to_string()))?;
            let mut by_rank: Vec<Option<TcpStream>> = (1..env.world).map(|_| None).collect();
            while by_rank.iter().any(Option::is_none) {
                match listener.accept() {
                    Ok((mut stream, _)) => {
                        stream
                            .set_nonblocking(false)
                            .map_err(|e| fail(e.to_string()))?;
                        stream
                            .set_read_timeout(Some(timeout))
                            .map_err(|e| fail(e.to_string()))?;
                        let mut rank = [0u8; 8];
                        stream
                            .read_exact(&mut rank)
                            .map_err(|e| fail(format!("reading a joining rank's number: {e}")))?;
                        let r = u64::from_le_bytes(rank) as usize;
                        if r == 0 || r >= env.world || by_rank[r - 1].is_some() {
                            return Err(fail(format!(
                                "a process joined as rank {r}, which is not a free rank of {}",
                                env.world
                            )));
                        }
                        by_rank[r - 1] = Some(stream);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        if Instant::now() >= deadline {
                            let missing: Vec<String> = (1..env.world)
                                .filter(|r| by_rank[r - 1].is_none())
                                .map(|r| r.to_string())
                                .collect();
                            return Err(fail(format!(
                                "waited {:.0} s for rank(s) {} to join",
                                timeout.as_secs_f64(),
                                missing.join(", ")
                            )));
                        }
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(e) => return Err(fail(format!("accepting a rank: {e}"))),
                }
            }
            peers = by_rank.into_iter().flatten().collect();
        } else if env.world > 1 {
            let port = env.wait_for(PORT_FILE, timeout)?;
            let port = String::from_utf8_lossy(&port).trim().to_string();
            let mut stream = TcpStream::connect(format!("127.0.0.1:{port}"))
                .map_err(|e| fail(format!("connecting to rank 0 on port {port}: {e}")))?;
            // Rank 0 may wait a timeout for a slow rank before it answers.
            stream
                .set_read_timeout(Some(timeout * 2))
                .map_err(|e| fail(e.to_string()))?;
            stream
                .write_all(&(env.rank as u64).to_le_bytes())
                .map_err(|e| fail(format!("introducing itself to rank 0: {e}")))?;
            peers.push(stream);
        }
        Ok(TcpRank {
            rank: env.rank,
            world: env.world,
            timeout,
            peers,
            failed: std::cell::RefCell::new(None),
        })
    }

    /// This rank's number.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// How many ranks the group has.
    pub fn world(&self) -> usize {
        self.world
    }

    /// The combined values of one exchange (`combine` runs on rank 0 over every
    /// rank's values in rank order).
    fn exchange(
        &self,
        op: &'static str,
        kinds: String,
        values: Vec<f64>,
        combine: &dyn Fn(&[Vec<f64>]) -> Vec<f64>,
    ) -> Result<Vec<f64>> {
        let fail = |why: String| Error::invalid(op, format!("rank {}: {why}", self.rank));
        if let Some(why) = self.failed.borrow().as_ref() {
            return Err(fail(format!("the group has failed ({why})")));
        }
        let result = if self.rank == 0 {
            self.gather(&kinds, values, combine)
        } else {
            self.ask(&kinds, values)
        };
        result.map_err(|why| {
            *self.failed.borrow_mut() = Some(why.clone());
            fail(why)
        })
    }

    /// Rank 0's side: every rank's values, checked, combined and sent back.
    fn gather(
        &self,
        kinds: &str,
        values: Vec<f64>,
        combine: &dyn Fn(&[Vec<f64>]) -> Vec<f64>,
    ) -> std::result::Result<Vec<f64>, String> {
        let mut all = vec![values];
        let mut outcome = Ok(());
        for (i, mut stream) in self.peers.iter().enumerate() {
            let rank = i + 1;
            match read_part(&mut stream) {
                Ok((theirs, v)) if theirs == kinds => all.push(v),
                Ok((theirs, _)) => {
                    outcome = Err(format!(
                        "rank {rank} gave {theirs} where rank 0 gave {kinds}"
                    ));
                    break;
                }
                Err(e) => {
                    outcome = Err(self.lost(rank, &e));
                    break;
                }
            }
        }
        let answer = outcome.map(|()| combine(&all));
        for mut stream in &self.peers {
            // A rank that is gone cannot be told; the error is already the others'.
            let _ = write_answer(&mut stream, &answer);
        }
        answer
    }

    /// Another rank's side: its values sent to rank 0, the result read back.
    fn ask(&self, kinds: &str, values: Vec<f64>) -> std::result::Result<Vec<f64>, String> {
        let mut stream = &self.peers[0];
        write_part(&mut stream, kinds, &values).map_err(|e| self.lost(0, &e))?;
        match read_answer(&mut stream) {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(why)) => Err(format!("the group has failed ({why})")),
            Err(e) => Err(self.lost(0, &e)),
        }
    }

    /// The error when the connection to `rank` broke or timed out.
    fn lost(&self, rank: usize, e: &std::io::Error) -> String {
        match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => format!(
                "waited {:.1} s for rank {rank} (a rank died, left or fell behind)",
                self.timeout.as_secs_f64()
            ),
            std::io::ErrorKind::UnexpectedEof
            | std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::BrokenPipe => {
                format!("rank {rank} closed its connection (it died or left)")
            }
            _ => format!("the connection to rank {rank} failed: {e}"),
        }
    }
}

/// A length-prefixed byte string.
fn write_bytes(w: &mut impl Write, bytes: &[u8]) -> std::io::Result<()> {
    w.write_all(&(bytes.len() as u64).to_le_bytes())?;
    w.write_all(bytes)
}

/// A length-prefixed byte string, refusing lengths past `limit`.
fn read_bytes(r: &mut impl Read, limit: usize) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 8];
    r.read_exact(&mut len)?;
    let len = u64::from_le_bytes(len) as usize;
    if len > limit {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a message of {len} bytes (more than {limit})"),
        ));
    }
    let mut out = vec![0u8; len];
    r.read_exact(&mut out)?;
    Ok(out)
}

/// The most bytes one exchange may send (a bucket of f64 values, with room).
const MESSAGE_LIMIT: usize = 1 << 34;

fn f64_bytes(values: &[f64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn f64_values(bytes: &[u8]) -> Vec<f64> {
    bytes
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().expect("chunks of 8")))
        .collect()
}

fn write_part(w: &mut impl Write, kinds: &str, values: &[f64]) -> std::io::Result<()> {
    write_bytes(w, kinds.as_bytes())?;
    write_bytes(w, &f64_bytes(values))
}

fn read_part(r: &mut impl Read) -> std::io::Result<(String, Vec<f64>)> {
    let kinds = String::from_utf8_lossy(&read_bytes(r, 1 << 20)?).into_owned();
    Ok((kinds, f64_values(&read_bytes(r, MESSAGE_LIMIT)?)))
}

fn write_answer(
    w: &mut impl Write,
    answer: &std::result::Result<Vec<f64>, String>,
) -> std::io::Result<()> {
    match answer {
        Ok(v) => {
            w.write_all(&[0])?;
            write_bytes(w, &f64_bytes(v))
        }
        Err(why) => {
            w.write_all(&[1])?;
            write_bytes(w, why.as_bytes())
        }
    }
}

fn read_answer(r: &mut impl Read) -> std::io::Result<std::result::Result<Vec<f64>, String>> {
    let mut tag = [0u8; 1];
    r.read_exact(&mut tag)?;
    let body = read_bytes(r, MESSAGE_LIMIT)?;
    Ok(match tag[0] {
        0 => Ok(f64_values(&body)),
        _ => Err(String::from_utf8_lossy(&body).into_owned()),
    })
}

/// `tensors` as an exchange's description (op, dims and dtypes, which every rank must
/// agree on) and values.
pub(crate) fn describe<B: Backend>(
    op: &'static str,
    tensors: &[RawTensor<B>],
    floats_only: bool,
) -> Result<(String, Vec<f64>)> {
    let mut kinds = Vec::with_capacity(tensors.len());
    let mut values = Vec::new();
    for t in tensors {
        if floats_only && !t.dtype().is_float() {
            return Err(Error::dtype(
                op,
                format!("averages float tensors, not {}", t.dtype()),
            ));
        }
        kinds.push(format!("{}{:?}", t.dtype(), &t.dims()[..]));
        values.extend(t.to_f64_vec()?);
    }
    Ok((format!("[{}]", kinds.join(", ")), values))
}

/// `values` cut back into tensors of the dims, dtypes and devices of `like`.
pub(crate) fn tensors_like<B: Backend>(
    values: &[f64],
    like: &[RawTensor<B>],
) -> Result<Vec<RawTensor<B>>> {
    let mut at = 0;
    like.iter()
        .map(|t| {
            let n = t.numel();
            let host = HostData::from_f64_slice(t.dtype(), &values[at..at + n]);
            at += n;
            RawTensor::from_host(host, &t.dims()[..], t.device())
        })
        .collect()
}

/// The element-wise mean of every rank's values, summed in rank order.
pub(crate) fn mean_in_rank_order(all: &[Vec<f64>]) -> Vec<f64> {
    let scale = 1.0 / all.len() as f64;
    let n = all.first().map_or(0, Vec::len);
    (0..n)
        .map(|i| all.iter().map(|r| r[i]).sum::<f64>() * scale)
        .collect()
}

impl<B: Backend> Collective<B> for TcpRank {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.world
    }

    fn all_reduce_mean(&self, tensors: &[RawTensor<B>]) -> Result<Vec<RawTensor<B>>> {
        let (kinds, values) = describe("all_reduce_mean", tensors, true)?;
        let mean = self.exchange(
            "all_reduce_mean",
            format!("mean {kinds}"),
            values,
            &mean_in_rank_order,
        )?;
        tensors_like(&mean, tensors)
    }

    fn broadcast(&self, tensors: &[RawTensor<B>], root: usize) -> Result<Vec<RawTensor<B>>> {
        if root >= self.world {
            return Err(Error::invalid(
                "broadcast",
                format!("root {root} is not a rank of {}", self.world),
            ));
        }
        let (kinds, values) = describe("broadcast", tensors, false)?;
        let all = self.exchange(
            "broadcast",
            format!("broadcast from {root} {kinds}"),
            values,
            &|all| all[root].clone(),
        )?;
        tensors_like(&all, tensors)
    }
}
