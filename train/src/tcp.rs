//! Ranks over TCP, for ranks that Kiln's launcher, torchrun or Slurm started. Where
//! they meet ([`meet`]): rank 0 listens (on `MASTER_PORT`; on a port it publishes in
//! torchrun's store where torchrun's agent holds `MASTER_PORT`; or on a loopback port
//! it publishes in Kiln's rendezvous folder), every other rank connects and introduces
//! itself, rank 0 checks that the introductions agree and answers each rank with the
//! roll of ranks and what rank 0 hands out (NCCL's unique id). And [`TcpRank`], the
//! collective of ranks without NCCL or MPI, which keeps the meeting's connections:
//! rank 0 gathers every exchange in rank order and sends every rank the result.

use crate::launch::check_timeout;
use crate::parallel::{describe, mean_in_rank_order, tensors_like};
use crate::rank_env::{rank_name, Meeting, RankEnv, Starter};
use crate::torch_store::TorchStore;
use kiln_tensor::{Backend, Collective, DType, Error, RawTensor, Result};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// The rendezvous file holding rank 0's port, in Kiln's rendezvous folder.
const PORT_FILE: &str = "tcp-port";

/// What a joining rank sends first, so that rank 0 tells a Kiln rank from anything
/// else that connects to its port.
const HELLO: &[u8; 8] = b"KILNRDV1";

/// How long rank 0 waits for a connected process to introduce itself.
const INTRODUCTION_TIMEOUT: Duration = Duration::from_secs(5);

/// One rank of a meeting, as errors name it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Its rank.
    pub rank: usize,
    /// Its machine's number, when its starter said.
    pub node: Option<usize>,
    /// Its machine's name, for ranks that met over the network (all of Kiln's
    /// launcher's ranks are on one machine).
    pub host: Option<String>,
}

impl Member {
    /// The rank as errors name it: `rank 2 (node 1 on gpu7)`.
    pub fn describe(&self) -> String {
        rank_name(self.rank, self.node, self.host.as_deref())
    }
}

/// The ranks once they have met.
pub struct Gathering {
    /// Every rank, in rank order.
    pub members: Vec<Member>,
    /// What rank 0 handed out.
    pub shared: Vec<u8>,
    /// Rank 0: the connections of ranks `1..world`, in rank order; other ranks: the
    /// connection to rank 0.
    streams: Vec<TcpStream>,
}

/// This machine's name, as the kernel has it.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "an unnamed host".into())
}

/// Meets the other ranks of `env`'s job: rank 0 hands `shared` out (what the others
/// pass is ignored). Waits at most `timeout` for every rank to come; a rank that
/// never comes, a world size that differs between ranks or a rank number taken twice
/// fails every rank that came, naming the ranks.
pub fn meet(env: &RankEnv, timeout: Duration, shared: &[u8]) -> Result<Gathering> {
    let timeout = check_timeout("the rank timeout", timeout)?;
    let fail = |why: String| Error::invalid("ranks", format!("{}: {why}", env.describe()));
    let me = Member {
        rank: env.rank,
        node: env.node,
        host: match env.meeting {
            Meeting::Folder(_) => None,
            _ => Some(host_name()),
        },
    };
    if env.rank == 0 {
        host_meeting(env, me, timeout, shared).map_err(fail)
    } else {
        join_meeting(env, me, timeout).map_err(fail)
    }
}

/// Rank 0's listener: on MASTER_PORT of every interface (on a port of its own,
/// published in torchrun's store, where torchrun's agent holds MASTER_PORT), or on a
/// loopback port published in Kiln's rendezvous folder.
fn listen(env: &RankEnv, deadline: Instant) -> std::result::Result<TcpListener, String> {
    // Every interface, IPv6 (with IPv4 mapped into it) where the machine has it.
    let everywhere = |port: u16| {
        TcpListener::bind(("::", port)).or_else(|_| TcpListener::bind(("0.0.0.0", port)))
    };
    match &env.meeting {
        Meeting::Folder(_) => {
            let listener = TcpListener::bind("127.0.0.1:0")
                .map_err(|e| format!("listening on loopback: {e}"))?;
            let port = listener.local_addr().map_err(|e| e.to_string())?.port();
            env.publish(PORT_FILE, port.to_string().as_bytes())
                .map_err(|e| e.to_string())?;
            Ok(listener)
        }
        Meeting::Tcp {
            host,
            port,
            store_key: Some(key),
        } => {
            let listener = everywhere(0).map_err(|e| format!("listening for the ranks: {e}"))?;
            let mine = listener.local_addr().map_err(|e| e.to_string())?.port();
            TorchStore::connect(host, *port, deadline)?.set(key, mine.to_string().as_bytes())?;
            Ok(listener)
        }
        Meeting::Tcp { port, .. } => everywhere(*port).map_err(|e| match e.kind() {
            std::io::ErrorKind::AddrInUse => format!(
                "port {port} (MASTER_PORT) is taken on this machine, by another job or an earlier run still closing: choose another MASTER_PORT"
            ),
            _ => format!("listening on port {port} (MASTER_PORT): {e}"),
        }),
        Meeting::Mpi => Err("ranks started by an MPI launcher meet through MPI, not TCP".into()),
    }
}

/// A joining rank's introduction, as rank 0 reads it.
struct Introduction {
    member: Member,
    world: usize,
}

fn write_introduction(w: &mut impl Write, me: &Member, world: usize) -> std::io::Result<()> {
    w.write_all(HELLO)?;
    w.write_all(&(me.rank as u64).to_le_bytes())?;
    w.write_all(&(world as u64).to_le_bytes())?;
    write_member(w, me)
}

/// A member's node and host as they travel ([`read_member`] reads them back).
fn write_member(w: &mut impl Write, m: &Member) -> std::io::Result<()> {
    w.write_all(&m.node.map_or(0, |n| n as u64 + 1).to_le_bytes())?;
    write_bytes(w, m.host.as_deref().unwrap_or("").as_bytes())
}

fn read_u64(r: &mut impl Read) -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

/// A member's node and host as they travel: node + 1 (0 for none), then the host.
fn read_member(r: &mut impl Read, rank: usize) -> std::io::Result<Member> {
    let node = read_u64(r)?;
    let host = String::from_utf8_lossy(&read_bytes(r, 1 << 10)?).into_owned();
    Ok(Member {
        rank,
        node: node.checked_sub(1).map(|n| n as usize),
        host: (!host.is_empty()).then_some(host),
    })
}

/// The introduction on `stream`, or `None` when what connected is no Kiln rank.
fn read_introduction(stream: &mut TcpStream) -> Option<Introduction> {
    let mut hello = [0u8; 8];
    stream.read_exact(&mut hello).ok()?;
    if &hello != HELLO {
        return None;
    }
    let rank = read_u64(stream).ok()? as usize;
    let world = read_u64(stream).ok()? as usize;
    let member = read_member(stream, rank).ok()?;
    Some(Introduction { member, world })
}

/// Rank 0's answer: the roll and what it hands out, or why the meeting failed.
fn write_welcome(
    w: &mut impl Write,
    answer: &std::result::Result<(&[Member], &[u8]), String>,
) -> std::io::Result<()> {
    match answer {
        Ok((members, shared)) => {
            w.write_all(&[0])?;
            w.write_all(&(members.len() as u64).to_le_bytes())?;
            for m in *members {
                write_member(w, m)?;
            }
            write_bytes(w, shared)
        }
        Err(why) => {
            w.write_all(&[1])?;
            write_bytes(w, why.as_bytes())
        }
    }
}

/// Rank 0's answer as a joining rank reads it: the roll and what rank 0 hands out, or
/// why the meeting failed.
type Welcome = std::result::Result<(Vec<Member>, Vec<u8>), String>;

fn read_welcome(r: &mut impl Read) -> std::io::Result<Welcome> {
    let mut tag = [0u8; 1];
    r.read_exact(&mut tag)?;
    if tag[0] != 0 {
        return Ok(Err(
            String::from_utf8_lossy(&read_bytes(r, 1 << 20)?).into_owned()
        ));
    }
    let n = read_u64(r)? as usize;
    if n > 1 << 24 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "a roll of more ranks than any job has",
        ));
    }
    let members = (0..n)
        .map(|rank| read_member(r, rank))
        .collect::<std::io::Result<Vec<_>>>()?;
    Ok(Ok((members, read_bytes(r, 1 << 20)?)))
}

/// Rank 0's side of [`meet`].
fn host_meeting(
    env: &RankEnv,
    me: Member,
    timeout: Duration,
    shared: &[u8],
) -> std::result::Result<Gathering, String> {
    let deadline = Instant::now() + timeout;
    let listener = listen(env, deadline)?;
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let mut joined: Vec<Option<(Member, TcpStream)>> = (1..env.world).map(|_| None).collect();
    // Tells every rank that came why the meeting failed, and returns that reason.
    let refuse = |joined: &mut Vec<Option<(Member, TcpStream)>>, why: String| {
        for (_, stream) in joined.iter_mut().flatten() {
            let _ = write_welcome(stream, &Err(why.clone()));
        }
        why
    };
    while joined.iter().any(Option::is_none) {
        let mut stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    let missing: Vec<String> = (1..env.world)
                        .filter(|r| joined[r - 1].is_none())
                        .map(|r| r.to_string())
                        .collect();
                    let hint = match env.starter {
                        Starter::Slurm => " (a batch script starts its tasks with srun)",
                        _ => "",
                    };
                    let why = format!(
                        "waited {:.0} s for rank(s) {} to join{hint}",
                        timeout.as_secs_f64(),
                        missing.join(", ")
                    );
                    return Err(refuse(&mut joined, why));
                }
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            Err(e) => return Err(refuse(&mut joined, format!("accepting a rank: {e}"))),
        };
        let _ = stream.set_nonblocking(false);
        // As in `connect_until`: parts of a message are not held back for an
        // acknowledgement.
        let _ = stream.set_nodelay(true);
        let _ = stream.set_read_timeout(Some(INTRODUCTION_TIMEOUT));
        // Whatever connects and does not introduce itself as a rank is no rank.
        let Some(intro) = read_introduction(&mut stream) else {
            continue;
        };
        let who = intro.member.describe();
        let why = if intro.world != env.world {
            Some(format!(
                "{who} belongs to a job of {} ranks, and rank 0 to one of {}: every rank must be given the same world size ({})",
                intro.world,
                env.world,
                env.starter.variables()
            ))
        } else if intro.member.rank == 0 || intro.member.rank >= env.world {
            Some(format!(
                "a process joined as rank {}, which is not a rank 1 to {} of a job of {}",
                intro.member.rank,
                env.world - 1,
                env.world
            ))
        } else if let Some((first, _)) = &joined[intro.member.rank - 1] {
            Some(format!(
                "two processes joined as rank {}: {} and {who}",
                intro.member.rank,
                first.describe()
            ))
        } else {
            None
        };
        if let Some(why) = why {
            let _ = write_welcome(&mut stream, &Err(why.clone()));
            return Err(refuse(&mut joined, why));
        }
        let slot = intro.member.rank - 1;
        joined[slot] = Some((intro.member, stream));
    }
    let mut members = vec![me];
    let mut streams = Vec::with_capacity(env.world - 1);
    for (member, stream) in joined.into_iter().flatten() {
        members.push(member);
        streams.push(stream);
    }
    for (i, stream) in streams.iter_mut().enumerate() {
        write_welcome(stream, &Ok((&members, shared)))
            .map_err(|e| format!("answering {}: {e}", members[i + 1].describe()))?;
        stream
            .set_read_timeout(Some(timeout))
            .map_err(|e| e.to_string())?;
    }
    Ok(Gathering {
        members,
        shared: shared.to_vec(),
        streams,
    })
}

/// Where a joining rank finds rank 0, and that place as its error names it.
fn rank_0_address(
    env: &RankEnv,
    timeout: Duration,
    deadline: Instant,
) -> std::result::Result<(String, String), String> {
    match &env.meeting {
        Meeting::Folder(_) => {
            let port = env
                .wait_for(PORT_FILE, timeout)
                .map_err(|e| e.to_string())?;
            let port = String::from_utf8_lossy(&port).trim().to_string();
            Ok((format!("127.0.0.1:{port}"), format!("port {port}")))
        }
        Meeting::Tcp {
            host,
            port,
            store_key: Some(key),
        } => {
            let published = TorchStore::connect(host, *port, deadline)?
                .wait_get(key, deadline)?
                .ok_or_else(|| {
                    format!(
                        "waited {:.0} s for rank 0 to publish its port in torchrun's store at {host}:{port} (did rank 0 start?)",
                        timeout.as_secs_f64()
                    )
                })?;
            let mine = String::from_utf8_lossy(&published).trim().to_string();
            Ok((
                format!("{host}:{mine}"),
                format!("{host}:{mine} (the port rank 0 published in torchrun's store)"),
            ))
        }
        Meeting::Tcp { host, port, .. } => Ok((
            format!("{host}:{port}"),
            format!("{host}:{port} (MASTER_ADDR:MASTER_PORT)"),
        )),
        Meeting::Mpi => Err("ranks started by an MPI launcher meet through MPI, not TCP".into()),
    }
}

/// A connection to `address`, trying again every 100 ms until `deadline` (what
/// listens there may start later); past it, what the last try said.
pub(crate) fn connect_until(
    address: &str,
    deadline: Instant,
) -> std::result::Result<TcpStream, String> {
    let mut last = String::from("no try");
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match address.to_socket_addrs() {
            Ok(addrs) => {
                for addr in addrs {
                    let limit = left.clamp(Duration::from_millis(10), Duration::from_secs(2));
                    match TcpStream::connect_timeout(&addr, limit) {
                        Ok(stream) => {
                            // Messages are written in parts (a header, then values):
                            // with Nagle's algorithm a part would wait for the peer's
                            // delayed acknowledgement (40 ms).
                            let _ = stream.set_nodelay(true);
                            return Ok(stream);
                        }
                        Err(e) => last = e.to_string(),
                    }
                }
            }
            Err(e) => last = format!("looking up {address}: {e}"),
        }
        if Instant::now() >= deadline {
            return Err(last);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Another rank's side of [`meet`].
fn join_meeting(
    env: &RankEnv,
    me: Member,
    timeout: Duration,
) -> std::result::Result<Gathering, String> {
    let deadline = Instant::now() + timeout;
    let (address, named) = rank_0_address(env, timeout, deadline)?;
    let mut stream = connect_until(&address, deadline).map_err(|last| {
        format!(
            "waited {:.0} s for rank 0 at {named} (did rank 0 start there?); the last try said: {last}",
            timeout.as_secs_f64()
        )
    })?;
    write_introduction(&mut stream, &me, env.world)
        .map_err(|e| format!("introducing itself to rank 0 at {named}: {e}"))?;
    // Rank 0 answers once every rank has come, or its own timeout has passed.
    stream
        .set_read_timeout(Some(timeout + Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    let (members, shared) = match read_welcome(&mut stream) {
        Ok(Ok(welcome)) => welcome,
        Ok(Err(why)) => return Err(format!("rank 0 ended the meeting: {why}")),
        Err(e) => {
            return Err(match e.kind() {
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => format!(
                    "rank 0 at {named} did not answer within {:.0} s",
                    timeout.as_secs_f64()
                ),
                _ => format!(
                    "rank 0 at {named} closed the meeting without answering ({e}): is something other than a Kiln rank 0 listening there?"
                ),
            })
        }
    };
    if members.len() != env.world {
        return Err(format!(
            "rank 0 answered with a roll of {} ranks, not {}",
            members.len(),
            env.world
        ));
    }
    // Rank 0 may wait a timeout for a slow rank before it answers an exchange.
    stream
        .set_read_timeout(Some(timeout * 2))
        .map_err(|e| e.to_string())?;
    Ok(Gathering {
        members,
        shared,
        streams: vec![stream],
    })
}

/// One rank of processes exchanging over TCP: rank 0 holds a connection to every other
/// rank, gathers each exchange in rank order and sends every rank the result, so that
/// all get the same bits.
pub struct TcpRank {
    rank: usize,
    world: usize,
    timeout: Duration,
    /// Every rank, as errors name them.
    members: Vec<Member>,
    /// Rank 0: the streams of ranks `1..world`, in rank order; other ranks: rank 0's.
    peers: Vec<TcpStream>,
    /// Why the group cannot go on: later calls fail at once.
    failed: std::cell::RefCell<Option<String>>,
}

impl TcpRank {
    /// Joins the group `env` describes ([`meet`]), keeping the meeting's connections.
    /// Waits at most `timeout` for the others, here and in every exchange.
    pub fn join(env: &RankEnv, timeout: Duration) -> Result<TcpRank> {
        let gathering = meet(env, timeout, &[])?;
        Ok(TcpRank {
            rank: env.rank,
            world: env.world,
            timeout,
            members: gathering.members,
            peers: gathering.streams,
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
        wire: Wire,
        values: Vec<f64>,
        combine: &dyn Fn(&[Vec<f64>]) -> Vec<f64>,
    ) -> Result<Vec<f64>> {
        let fail = |why: String| Error::invalid(op, format!("rank {}: {why}", self.rank));
        if let Some(why) = self.failed.borrow().as_ref() {
            return Err(fail(format!("the group has failed ({why})")));
        }
        let result = if self.rank == 0 {
            self.gather(&kinds, wire, values, combine)
        } else {
            self.ask(&kinds, wire, values)
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
        wire: Wire,
        values: Vec<f64>,
        combine: &dyn Fn(&[Vec<f64>]) -> Vec<f64>,
    ) -> std::result::Result<Vec<f64>, String> {
        let mut all = vec![values];
        let mut outcome = Ok(());
        for (i, mut stream) in self.peers.iter().enumerate() {
            let rank = i + 1;
            match read_part(&mut stream, wire) {
                Ok((theirs, v)) if theirs == kinds => all.push(v),
                Ok((theirs, _)) => {
                    outcome = Err(format!(
                        "{} gave {theirs} where rank 0 gave {kinds}",
                        self.members[rank].describe()
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
            let _ = write_answer(&mut stream, wire, &answer);
        }
        answer
    }

    /// Another rank's side: its values sent to rank 0, the result read back.
    fn ask(
        &self,
        kinds: &str,
        wire: Wire,
        values: Vec<f64>,
    ) -> std::result::Result<Vec<f64>, String> {
        let mut stream = &self.peers[0];
        write_part(&mut stream, kinds, wire, &values).map_err(|e| self.lost(0, &e))?;
        match read_answer(&mut stream, wire) {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(why)) => Err(format!("the group has failed ({why})")),
            Err(e) => Err(self.lost(0, &e)),
        }
    }

    /// The error when the connection to `rank` broke or timed out.
    fn lost(&self, rank: usize, e: &std::io::Error) -> String {
        let who = self.members[rank].describe();
        match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => format!(
                "waited {:.1} s for {who} (a rank died, left or fell behind)",
                self.timeout.as_secs_f64()
            ),
            std::io::ErrorKind::UnexpectedEof
            | std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::BrokenPipe => {
                format!("{who} closed its connection (it died or left)")
            }
            _ => format!("the connection to {who} failed: {e}"),
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

/// How an exchange's values travel: as f32 when every tensor is f32, which holds them
/// and the mean's rounding to f32 exactly (half the bytes of f64), else as f64. A bf16
/// or f16 mean is not sent as f32, which would round it twice.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Wire {
    F32,
    F64,
}

impl Wire {
    /// The wire for an exchange of `tensors`; every rank picks the same one, since
    /// the ranks agree on the dtypes (which the exchange checks).
    fn for_tensors<B: Backend>(tensors: &[RawTensor<B>]) -> Wire {
        match tensors.iter().all(|t| t.dtype() == DType::F32) {
            true => Wire::F32,
            false => Wire::F64,
        }
    }

    /// `values` as bytes; f32 rounds as `Element::from_f64` does (to nearest).
    fn encode(self, values: &[f64]) -> Vec<u8> {
        match self {
            Wire::F32 => values
                .iter()
                .flat_map(|&v| (v as f32).to_le_bytes())
                .collect(),
            Wire::F64 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }

    /// The values in `bytes`.
    fn decode(self, bytes: &[u8]) -> Vec<f64> {
        match self {
            Wire::F32 => bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().expect("chunks of 4")) as f64)
                .collect(),
            Wire::F64 => bytes
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().expect("chunks of 8")))
                .collect(),
        }
    }
}

fn write_part(w: &mut impl Write, kinds: &str, wire: Wire, values: &[f64]) -> std::io::Result<()> {
    write_bytes(w, kinds.as_bytes())?;
    write_bytes(w, &wire.encode(values))
}

fn read_part(r: &mut impl Read, wire: Wire) -> std::io::Result<(String, Vec<f64>)> {
    let kinds = String::from_utf8_lossy(&read_bytes(r, 1 << 20)?).into_owned();
    Ok((kinds, wire.decode(&read_bytes(r, MESSAGE_LIMIT)?)))
}

fn write_answer(
    w: &mut impl Write,
    wire: Wire,
    answer: &std::result::Result<Vec<f64>, String>,
) -> std::io::Result<()> {
    match answer {
        Ok(v) => {
            w.write_all(&[0])?;
            write_bytes(w, &wire.encode(v))
        }
        Err(why) => {
            w.write_all(&[1])?;
            write_bytes(w, why.as_bytes())
        }
    }
}

fn read_answer(
    r: &mut impl Read,
    wire: Wire,
) -> std::io::Result<std::result::Result<Vec<f64>, String>> {
    let mut tag = [0u8; 1];
    r.read_exact(&mut tag)?;
    let body = read_bytes(r, MESSAGE_LIMIT)?;
    Ok(match tag[0] {
        0 => Ok(wire.decode(&body)),
        _ => Err(String::from_utf8_lossy(&body).into_owned()),
    })
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
            Wire::for_tensors(tensors),
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
            Wire::for_tensors(tensors),
            values,
            &|all| all[root].clone(),
        )?;
        tensors_like(&all, tensors)
    }
}
