//! Ranks over TCP, for ranks that Kiln's launcher, torchrun or Slurm started. Where
//! they meet ([`meet`]): rank 0 listens (on `MASTER_PORT`; on a port it publishes in
//! torchrun's store where torchrun's agent holds `MASTER_PORT`; or on a loopback port
//! it publishes in Kiln's rendezvous folder), every other rank connects and introduces
//! itself with the settings the ranks must share, rank 0 checks that the introductions
//! agree and answers each rank with the roll of ranks and what rank 0 hands out
//! (NCCL's unique id). And [`TcpRank`], the collective of ranks without NCCL or MPI,
//! which keeps the meeting's connections: rank 0 gathers every exchange in rank order
//! and sends every rank the result.
//!
//! Whatever connects to rank 0's port may be no rank at all, and whatever answers on
//! it may be no rank 0: every read has a deadline for the whole message (not for each
//! byte), rank 0 reads every connection's introduction at once (one silent client
//! holds up no other), and text from another process is printed escaped
//! ([`remote_text`]).

use crate::launch::check_timeout;
use crate::parallel::{describe, mean_in_rank_order, tensors_like};
use crate::rank_env::{rank_name, Meeting, RankEnv, Starter};
use crate::torch_store::TorchStore;
use kiln_tensor::{Backend, Collective, DType, Error, RawTensor, Result};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The rendezvous file holding rank 0's port, in Kiln's rendezvous folder.
const PORT_FILE: &str = "tcp-port";

/// What a joining rank sends first, so that rank 0 tells a Kiln rank from anything
/// else that connects to its port. The last byte is the version of the meeting's
/// messages (2: introductions carry the settings), so that a rank of another Kiln is
/// told so instead of being taken for a stranger.
const HELLO: &[u8; 8] = b"KILNRDV2";

/// How long rank 0 gives a connection to send its whole introduction (a rank writes
/// it as soon as it connects): past it the connection is dropped, however it spaced
/// its bytes.
const INTRODUCTION_TIMEOUT: Duration = Duration::from_secs(5);

/// The most connections whose introductions rank 0 reads at once; more wait in the
/// listener's backlog until one of these is done (so a flood of connections holds a
/// bounded memory).
const MAX_PENDING: usize = 256;

/// The most bytes an introduction takes: its fixed part, a host name and the
/// settings.
const INTRODUCTION_BYTES: usize = 64 + HOST_BYTES + SETTINGS_BYTES;

/// The most bytes of a host name on the wire.
const HOST_BYTES: usize = 1 << 10;

/// The most bytes the settings take on the wire, and the most settings.
const SETTINGS_BYTES: usize = 1 << 16;
const MAX_SETTINGS: usize = 1 << 10;

/// How many characters of a host name, a setting or a reason from another process
/// are printed.
const HOST_CHARS: usize = 255;
const SETTING_CHARS: usize = 200;
const REASON_CHARS: usize = 4096;

/// How often rank 0 looks at its port while the ranks meet, and after they met.
const MEETING_POLL: Duration = Duration::from_millis(5);
/// How long rank 0, having refused the meeting, waits for ranks not yet arrived to
/// tell them why (a rank started a moment after the others).
const LATE_RANKS_TOLD: Duration = Duration::from_secs(2);
const LATE_POLL: Duration = Duration::from_millis(50);

/// How long a joining rank waits for rank 0's answer past its own timeout. Rank 0's
/// wait began before this rank connected, so its answer (the roll, or why the
/// meeting failed) is due within the timeout; this is time for it to arrive.
const ANSWER_GRACE: Duration = Duration::from_secs(1);

/// Text that came from another process (a rank, or whatever answers on its port) as
/// it may be printed: control and other invisible characters escaped as `\u{1b}` (so
/// that no terminal escape sequence reaches the user's terminal), cut after about
/// `limit` bytes with the number of bytes left out.
pub fn remote_text(bytes: &[u8], limit: usize) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut out = String::new();
    for (at, c) in text.char_indices() {
        if out.len() >= limit {
            out.push_str(&format!("… ({} more bytes)", text.len() - at));
            break;
        }
        // `escape_debug` escapes what does not print (controls, format characters
        // such as bidirectional overrides); quotes and backslashes stay as they are.
        match c {
            '\\' | '"' | '\'' => out.push(c),
            _ => out.extend(c.escape_debug()),
        }
    }
    out
}

/// A stream read and written under one deadline for everything that passes: each
/// call waits at most for what is left until the deadline, so a peer that sends a
/// byte now and then cannot stretch the wait.
struct Until<'a> {
    stream: &'a TcpStream,
    deadline: Instant,
}

impl Until<'_> {
    /// What is left until the deadline, or a timeout error past it.
    fn left(&self) -> std::io::Result<Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        match left.is_zero() {
            true => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "past the deadline",
            )),
            false => Ok(left),
        }
    }
}

impl Read for Until<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.stream.set_read_timeout(Some(self.left()?))?;
        let mut stream = self.stream;
        stream.read(buf)
    }
}

impl Write for Until<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.stream.set_write_timeout(Some(self.left()?))?;
        let mut stream = self.stream;
        stream.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Reads `stream` with one deadline for the whole message (see [`Until`]).
pub(crate) fn read_until(
    stream: &TcpStream,
    deadline: Instant,
    buf: &mut [u8],
) -> std::io::Result<()> {
    Until { stream, deadline }.read_exact(buf)
}

/// One rank of a meeting, as errors name it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Its rank.
    pub rank: usize,
    /// Its machine's number, when its starter said.
    pub node: Option<usize>,
    /// Its machine's name, for ranks that met over the network (all of Kiln's
    /// launcher's ranks are on one machine); escaped when another rank sent it.
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
    /// Rank 0: its port, still answering late ranks while the gathering lives.
    door: Option<LateDoor>,
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
/// pass is ignored), and every rank must have been given the same `settings` (what
/// decides the values of the run's steps: a learning rate, a batch size, a seed).
/// Waits at most `timeout` for every rank to come. A rank that never comes, a world
/// size or settings that differ between ranks, or a rank number taken twice fail
/// every rank that came, naming the ranks and the settings that differ; a connection
/// that is no Kiln rank is dropped within 5 s, and delays no rank. While the
/// [`Gathering`] lives, rank 0 turns away a rank that comes late, naming why.
pub fn meet(
    env: &RankEnv,
    timeout: Duration,
    settings: &BTreeMap<String, String>,
    shared: &[u8],
) -> Result<Gathering> {
    let timeout = check_timeout("the rank timeout", timeout)?;
    let fail = |why: String| Error::invalid("ranks", format!("{}: {why}", env.describe()));
    check_settings(settings).map_err(fail)?;
    let me = Member {
        rank: env.rank,
        node: env.node,
        host: match env.meeting {
            Meeting::Folder(_) => None,
            _ => Some(remote_text(host_name().as_bytes(), HOST_CHARS)),
        },
    };
    if env.rank == 0 {
        host_meeting(env, me, timeout, settings, shared).map_err(fail)
    } else {
        join_meeting(env, me, timeout, settings).map_err(fail)
    }
}

/// Refuses settings that cannot travel in an introduction.
fn check_settings(settings: &BTreeMap<String, String>) -> std::result::Result<(), String> {
    let bytes: usize = settings.iter().map(|(k, v)| 16 + k.len() + v.len()).sum();
    if settings.len() > MAX_SETTINGS || bytes > SETTINGS_BYTES {
        return Err(format!(
            "{} settings of {bytes} bytes are more than ranks compare when they meet (at most {MAX_SETTINGS} settings of {SETTINGS_BYTES} bytes in all): pass a fingerprint of the longest",
            settings.len()
        ));
    }
    Ok(())
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
    /// Its settings, as it sent them (escaped only when printed).
    settings: BTreeMap<String, String>,
}

fn write_introduction(
    w: &mut impl Write,
    me: &Member,
    world: usize,
    settings: &BTreeMap<String, String>,
) -> std::io::Result<()> {
    // One write, so that rank 0 gets it whole at once.
    let mut message = HELLO.to_vec();
    message.extend((me.rank as u64).to_le_bytes());
    message.extend((world as u64).to_le_bytes());
    write_member(&mut message, me)?;
    message.extend((settings.len() as u64).to_le_bytes());
    for (key, value) in settings {
        write_bytes(&mut message, key.as_bytes())?;
        write_bytes(&mut message, value.as_bytes())?;
    }
    w.write_all(&message)
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
    let host = remote_text(&read_bytes(r, HOST_BYTES)?, HOST_CHARS);
    Ok(Member {
        rank,
        node: node
            .checked_sub(1)
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
        host: (!host.is_empty()).then_some(host),
    })
}

/// The introduction in `r`'s bytes after the hello: `UnexpectedEof` while it is not
/// whole, another error when it is no introduction.
fn read_introduction(r: &mut impl Read) -> std::io::Result<Introduction> {
    let rank = usize::try_from(read_u64(r)?).unwrap_or(usize::MAX);
    let world = usize::try_from(read_u64(r)?).unwrap_or(usize::MAX);
    let member = read_member(r, rank)?;
    let count = read_u64(r)?;
    if count > MAX_SETTINGS as u64 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "more settings than a rank sends",
        ));
    }
    let mut settings = BTreeMap::new();
    for _ in 0..count {
        let key = String::from_utf8_lossy(&read_bytes(r, SETTINGS_BYTES)?).into_owned();
        let value = String::from_utf8_lossy(&read_bytes(r, SETTINGS_BYTES)?).into_owned();
        settings.insert(key, value);
    }
    Ok(Introduction {
        member,
        world,
        settings,
    })
}

/// What a connection has sent rank 0 so far.
enum Heard {
    /// The start of an introduction.
    Partial,
    /// A whole introduction.
    Rank(Introduction),
    /// A Kiln rank speaking another version of the meeting's messages.
    OtherVersion(u8),
    /// Something that is no Kiln rank.
    Stranger,
}

/// What `bytes`, all that a connection sent so far, are.
fn hear(bytes: &[u8]) -> Heard {
    let start = bytes.len().min(HELLO.len());
    if bytes[..start] != HELLO[..start] {
        return match start == HELLO.len() && bytes[..start - 1] == HELLO[..start - 1] {
            true => Heard::OtherVersion(bytes[start - 1]),
            false => Heard::Stranger,
        };
    }
    if bytes.len() > INTRODUCTION_BYTES {
        return Heard::Stranger;
    }
    match read_introduction(&mut &bytes[start..]) {
        Ok(intro) => Heard::Rank(intro),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Heard::Partial,
        Err(_) => Heard::Stranger,
    }
}

/// A connection to rank 0's port that has not introduced itself yet.
struct Pending {
    /// Non-blocking.
    stream: TcpStream,
    /// What it sent so far.
    heard: Vec<u8>,
    /// When it is dropped if its introduction is not whole.
    until: Instant,
}

impl Pending {
    /// Reads what the connection sent since the last look: false once it closed,
    /// failed or sent more than any introduction.
    fn read_more(&mut self) -> bool {
        let mut buf = [0u8; 4096];
        loop {
            match self.stream.read(&mut buf) {
                Ok(0) => return false,
                Ok(n) => {
                    self.heard.extend_from_slice(&buf[..n]);
                    if self.heard.len() > INTRODUCTION_BYTES {
                        return false;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
    }
}

/// Rank 0's port, and the connections that have not yet introduced themselves, read
/// side by side without blocking: a connection that stays silent, trickles or sends
/// something else holds up no other.
struct Door {
    listener: TcpListener,
    pending: Vec<Pending>,
    /// How long a connection has to introduce itself ([`INTRODUCTION_TIMEOUT`]).
    patience: Duration,
}

impl Door {
    fn new(listener: TcpListener, patience: Duration) -> std::result::Result<Door, String> {
        listener
            .set_nonblocking(true)
            .map_err(|e| format!("listening for the ranks: {e}"))?;
        Ok(Door {
            listener,
            pending: Vec::new(),
            patience,
        })
    }

    /// The ranks whose introductions are whole now, with their connections (blocking
    /// again), after accepting what waits at the port and reading what every pending
    /// connection sent. A connection is given the door's patience from when it came,
    /// or until `last`, whichever is sooner; one past it, closed or sending something
    /// that is no introduction is dropped, and a rank of another version is told why.
    fn poll(&mut self, last: Instant) -> std::io::Result<Vec<(Introduction, TcpStream)>> {
        let now = Instant::now();
        while self.pending.len() < MAX_PENDING {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    if stream.set_nonblocking(true).is_ok() {
                        // As in `connect_until`: parts of a message are not held
                        // back for an acknowledgement.
                        let _ = stream.set_nodelay(true);
                        self.pending.push(Pending {
                            stream,
                            heard: Vec::new(),
                            until: (now + self.patience).min(last),
                        });
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                // A connection that went before it was accepted is no rank's loss.
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::ConnectionAborted
                            | std::io::ErrorKind::ConnectionReset
                            | std::io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => return Err(e),
            }
        }
        let mut whole = Vec::new();
        for mut p in std::mem::take(&mut self.pending) {
            if !p.read_more() {
                continue;
            }
            match hear(&p.heard) {
                Heard::Partial if now < p.until => self.pending.push(p),
                Heard::Partial | Heard::Stranger => {}
                Heard::Rank(intro) => {
                    if p.stream.set_nonblocking(false).is_ok() {
                        whole.push((intro, p.stream));
                    }
                }
                Heard::OtherVersion(v) => {
                    let why = format!(
                        "it speaks version {} of Kiln's meeting and rank 0 version {}: every rank must run the same Kiln",
                        char::from(v).escape_debug(),
                        char::from(HELLO[7])
                    );
                    let _ = p.stream.set_nonblocking(false);
                    let _ = turn_away(&p.stream, &why);
                }
            }
        }
        Ok(whole)
    }
}

/// How rank 0's answer starts: the roll follows, or why the meeting failed, or why
/// this one process was turned away (the others meet, or met, without it).
const WELCOME: u8 = 0;
const ENDED: u8 = 1;
const TURNED_AWAY: u8 = 2;

/// Rank 0's answer: the roll and what it hands out, or why the meeting failed.
fn write_welcome(
    w: &mut impl Write,
    answer: &std::result::Result<(&[Member], &[u8]), String>,
) -> std::io::Result<()> {
    // One write, after which the peer has all it reads.
    let mut message = Vec::new();
    match answer {
        Ok((members, shared)) => {
            message.push(WELCOME);
            message.extend((members.len() as u64).to_le_bytes());
            for m in *members {
                write_member(&mut message, m)?;
            }
            write_bytes(&mut message, shared)?;
        }
        Err(why) => {
            message.push(ENDED);
            write_bytes(&mut message, why.as_bytes())?;
        }
    }
    w.write_all(&message)
}

/// Tells one process why rank 0 turns it away, waiting at most a second for it to
/// take the message.
fn turn_away(stream: &TcpStream, why: &str) -> std::io::Result<()> {
    let mut message = vec![TURNED_AWAY];
    write_bytes(&mut message, why.as_bytes())?;
    let deadline = Instant::now() + Duration::from_secs(1);
    Until { stream, deadline }.write_all(&message)
}

/// Rank 0's answer as a joining rank reads it.
enum Welcome {
    /// The roll and what rank 0 hands out.
    Roll(Vec<Member>, Vec<u8>),
    /// Why the meeting failed.
    Ended(String),
    /// Why rank 0 turned this process away.
    TurnedAway(String),
}

/// Rank 0's answer, for a rank of a job of `world` ranks; its text escaped.
fn read_welcome(r: &mut impl Read, world: usize) -> std::io::Result<Welcome> {
    let invalid = |what: String| std::io::Error::new(std::io::ErrorKind::InvalidData, what);
    let mut tag = [0u8; 1];
    r.read_exact(&mut tag)?;
    match tag[0] {
        WELCOME => {}
        ENDED => return Ok(Welcome::Ended(read_reason(r)?)),
        TURNED_AWAY => return Ok(Welcome::TurnedAway(read_reason(r)?)),
        other => return Err(invalid(format!("an answer starting with byte {other}"))),
    }
    let n = read_u64(r)?;
    if n != world as u64 {
        return Err(invalid(format!("a roll of {n} ranks, not {world}")));
    }
    let members = (0..world)
        .map(|rank| read_member(r, rank))
        .collect::<std::io::Result<Vec<_>>>()?;
    Ok(Welcome::Roll(members, read_bytes(r, 1 << 20)?))
}

/// A reason another process sent, escaped and cut for printing.
fn read_reason(r: &mut impl Read) -> std::io::Result<String> {
    Ok(remote_text(&read_bytes(r, 1 << 20)?, REASON_CHARS))
}

/// Why a rank's introduction cannot join a job of `world` ranks with rank 0's
/// `settings`, whoever else came: another world size, a rank number outside the
/// job, or other settings (each named with both values). `variables` names where
/// the ranks' places come from.
fn mismatch(
    intro: &Introduction,
    world: usize,
    settings: &BTreeMap<String, String>,
    variables: &str,
) -> Option<String> {
    let who = intro.member.describe();
    if intro.world != world {
        return Some(format!(
            "{who} belongs to a job of {} ranks, and rank 0 to one of {world}: every rank must be given the same world size ({variables})",
            intro.world
        ));
    }
    if intro.member.rank == 0 || intro.member.rank >= world {
        return Some(format!(
            "a process joined as rank {}, which is not a rank 1 to {} of a job of {world}",
            intro.member.rank,
            world - 1
        ));
    }
    let show = |v: Option<&String>| match v {
        Some(v) => remote_text(v.as_bytes(), SETTING_CHARS),
        None => "none".to_string(),
    };
    let differ: Vec<String> = settings
        .keys()
        .chain(intro.settings.keys())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .filter(|k| settings.get(*k) != intro.settings.get(*k))
        .map(|k| {
            format!(
                "{} {} where rank 0 has {}",
                remote_text(k.as_bytes(), SETTING_CHARS),
                show(intro.settings.get(k)),
                show(settings.get(k))
            )
        })
        .collect();
    if differ.is_empty() {
        return None;
    }
    // A few name the mistake; a rank of another program may differ in all.
    const SHOWN: usize = 8;
    let more = match differ.len() > SHOWN {
        true => format!(", and {} more", differ.len() - SHOWN),
        false => String::new(),
    };
    Some(format!(
        "{who} was started with other settings than rank 0: {}{more} (every rank must be given the same)",
        differ[..differ.len().min(SHOWN)].join(", ")
    ))
}

/// Rank 0's side of [`meet`].
fn host_meeting(
    env: &RankEnv,
    me: Member,
    timeout: Duration,
    settings: &BTreeMap<String, String>,
    shared: &[u8],
) -> std::result::Result<Gathering, String> {
    let deadline = Instant::now() + timeout;
    let mut door = Door::new(listen(env, deadline)?, INTRODUCTION_TIMEOUT)?;
    let mut joined: Vec<Option<(Member, TcpStream)>> = (1..env.world).map(|_| None).collect();
    // Tells every rank that came why the meeting failed, and returns that reason. Ranks
    // still on their way (connected but not yet introduced, or started a moment later)
    // are waited for a short while and told too, so each rank of the job stops naming
    // the cause rather than finding rank 0 gone.
    let refuse = |door: &mut Door, joined: &mut Vec<Option<(Member, TcpStream)>>, why: String| {
        let answered_by = Instant::now() + Duration::from_secs(1);
        let mut told = vec![false; env.world];
        for (member, stream) in joined.iter().flatten() {
            let mut until = Until {
                stream,
                deadline: answered_by,
            };
            let _ = write_welcome(&mut until, &Err(why.clone()));
            if let Some(t) = told.get_mut(member.rank) {
                *t = true;
            }
        }
        let waited_until = (Instant::now() + LATE_RANKS_TOLD).min(deadline);
        while told[1..].iter().any(|t| !t) && Instant::now() < waited_until {
            let Ok(arrived) = door.poll(waited_until) else {
                break;
            };
            for (intro, stream) in arrived {
                let mut until = Until {
                    stream: &stream,
                    deadline: Instant::now() + Duration::from_secs(1),
                };
                let _ = write_welcome(&mut until, &Err(why.clone()));
                if let Some(t) = told.get_mut(intro.member.rank) {
                    *t = true;
                }
            }
            std::thread::sleep(MEETING_POLL);
        }
        why
    };
    loop {
        let arrived = match door.poll(deadline) {
            Ok(arrived) => arrived,
            Err(e) => {
                return Err(refuse(
                    &mut door,
                    &mut joined,
                    format!("accepting a rank: {e}"),
                ))
            }
        };
        let mut arrived = arrived.into_iter();
        while let Some((intro, stream)) = arrived.next() {
            let taken = intro
                .member
                .rank
                .checked_sub(1)
                .and_then(|slot| joined.get(slot))
                .and_then(|slot| slot.as_ref());
            let why =
                mismatch(&intro, env.world, settings, env.starter.variables()).or_else(|| {
                    taken.map(|(first, _)| {
                        format!(
                            "two processes joined as rank {}: {} and {}",
                            intro.member.rank,
                            first.describe(),
                            intro.member.describe()
                        )
                    })
                });
            if let Some(why) = why {
                // The ranks that arrived with it are told as well.
                joined.push(Some((intro.member, stream)));
                joined.extend(arrived.map(|(intro, stream)| Some((intro.member, stream))));
                return Err(refuse(&mut door, &mut joined, why));
            }
            let slot = intro.member.rank - 1;
            joined[slot] = Some((intro.member, stream));
        }
        if joined.iter().all(Option::is_some) {
            break;
        }
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
            return Err(refuse(&mut door, &mut joined, why));
        }
        std::thread::sleep(MEETING_POLL);
    }
    let mut members = vec![me];
    let mut streams = Vec::with_capacity(env.world - 1);
    for (member, stream) in joined.into_iter().flatten() {
        members.push(member);
        streams.push(stream);
    }
    // A rank that does not take its answer (it hangs, or is no rank) fails the
    // meeting within seconds, not after the others trained.
    let answered_by = Instant::now() + INTRODUCTION_TIMEOUT;
    for (i, stream) in streams.iter().enumerate() {
        let mut until = Until {
            stream,
            deadline: answered_by,
        };
        if let Err(e) = write_welcome(&mut until, &Ok((&members, shared))) {
            let why = format!("answering {}: {e}", members[i + 1].describe());
            // The ranks not answered yet are told why; those answered find rank 0
            // gone at their first exchange.
            for stream in &streams[i + 1..] {
                let mut until = Until {
                    stream,
                    deadline: Instant::now() + Duration::from_secs(1),
                };
                let _ = write_welcome(&mut until, &Err(why.clone()));
            }
            return Err(why);
        }
    }
    for stream in &streams {
        stream
            .set_read_timeout(Some(timeout))
            .map_err(|e| e.to_string())?;
        stream.set_write_timeout(None).map_err(|e| e.to_string())?;
    }
    let door = LateDoor::open(
        door,
        members.clone(),
        settings.clone(),
        env.starter.variables(),
    );
    Ok(Gathering {
        members,
        shared: shared.to_vec(),
        streams,
        door: Some(door),
    })
}

/// Rank 0's port once the ranks have met: a thread answers whatever comes late, until
/// dropped. A rank of another job (other world size or settings) is turned away
/// naming why; a second process of a rank that met is turned away too, and is why
/// the group must stop: which of the two is the job's rank was chance.
struct LateDoor {
    stop: Arc<AtomicBool>,
    /// Why the group must stop, once a second process of one of its ranks came.
    duplicate: Arc<Mutex<Option<String>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl LateDoor {
    fn open(
        mut door: Door,
        members: Vec<Member>,
        settings: BTreeMap<String, String>,
        variables: &'static str,
    ) -> LateDoor {
        let stop = Arc::new(AtomicBool::new(false));
        let duplicate = Arc::new(Mutex::new(None));
        let (stopped, found) = (stop.clone(), duplicate.clone());
        let thread = std::thread::Builder::new()
            .name("kiln-rank-0-door".into())
            .spawn(move || {
                while !stopped.load(Ordering::Relaxed) {
                    // A port that fails to accept turns nobody away: late ranks then
                    // find it closed.
                    let Ok(arrived) = door.poll(Instant::now() + INTRODUCTION_TIMEOUT) else {
                        return;
                    };
                    for (intro, stream) in arrived {
                        let world = members.len();
                        let why = match mismatch(&intro, world, &settings, variables) {
                            Some(why) => format!("the ranks met without it: {why}"),
                            None => {
                                let first = &members[intro.member.rank];
                                let why = format!(
                                    "two processes joined as rank {}: {}, which met the others, and {}, which came after (every rank must be started once)",
                                    intro.member.rank,
                                    first.describe(),
                                    intro.member.describe()
                                );
                                let mut found = found.lock().unwrap_or_else(|e| e.into_inner());
                                found.get_or_insert_with(|| why.clone());
                                why
                            }
                        };
                        let _ = turn_away(&stream, &why);
                    }
                    std::thread::sleep(LATE_POLL);
                }
            })
            .ok();
        LateDoor {
            stop,
            duplicate,
            thread,
        }
    }

    /// Why the group must stop: a second process of one of its ranks came late.
    fn duplicate(&self) -> Option<String> {
        self.duplicate
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl Drop for LateDoor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
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
            let mine: u16 = String::from_utf8_lossy(&published)
                .trim()
                .parse()
                .map_err(|_| {
                    format!(
                        "torchrun's store at {host}:{port} holds `{}` under {key}, where rank 0 publishes its port",
                        remote_text(&published, SETTING_CHARS)
                    )
                })?;
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
    settings: &BTreeMap<String, String>,
) -> std::result::Result<Gathering, String> {
    let deadline = Instant::now() + timeout;
    let (address, named) = rank_0_address(env, timeout, deadline)?;
    let stream = connect_until(&address, deadline).map_err(|last| {
        format!(
            "waited {:.0} s for rank 0 at {named} (did rank 0 start there?); the last try said: {last}",
            timeout.as_secs_f64()
        )
    })?;
    // Rank 0 answers once every rank has come, or once its own timeout, which began
    // before this rank connected, has passed: one deadline for the whole answer,
    // however rank 0 (or whatever answers in its place) spaces its bytes.
    let mut until = Until {
        stream: &stream,
        deadline: Instant::now() + timeout + ANSWER_GRACE,
    };
    write_introduction(&mut until, &me, env.world, settings)
        .map_err(|e| format!("introducing itself to rank 0 at {named}: {e}"))?;
    let (members, shared) = match read_welcome(&mut until, env.world) {
        Ok(Welcome::Roll(members, shared)) => (members, shared),
        Ok(Welcome::Ended(why)) => return Err(format!("rank 0 ended the meeting: {why}")),
        Ok(Welcome::TurnedAway(why)) => {
            return Err(format!("rank 0 at {named} turned it away: {why}"))
        }
        Err(e) => {
            return Err(match e.kind() {
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => format!(
                    "rank 0 at {named} did not answer within {:.0} s",
                    timeout.as_secs_f64()
                ),
                std::io::ErrorKind::InvalidData => format!(
                    "what answered at {named} is no Kiln rank 0 (it sent {e})"
                ),
                _ => format!(
                    "rank 0 at {named} closed the meeting without answering ({e}): is something other than a Kiln rank 0 listening there?"
                ),
            })
        }
    };
    // Rank 0 may wait a timeout for a slow rank before it answers an exchange.
    stream
        .set_read_timeout(Some(timeout * 2))
        .map_err(|e| e.to_string())?;
    stream.set_write_timeout(None).map_err(|e| e.to_string())?;
    Ok(Gathering {
        members,
        shared,
        streams: vec![stream],
        door: None,
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
    /// Rank 0: its port, turning late ranks away.
    door: Option<LateDoor>,
}

impl TcpRank {
    /// Joins the group `env` describes ([`meet`]), keeping the meeting's connections;
    /// every rank must be given the same `settings`. Waits at most `timeout` for the
    /// others, here and in every exchange. A second process of a rank that comes
    /// after the meeting fails the group's next exchange, on every rank.
    pub fn join(
        env: &RankEnv,
        timeout: Duration,
        settings: &BTreeMap<String, String>,
    ) -> Result<TcpRank> {
        let gathering = meet(env, timeout, settings, &[])?;
        Ok(TcpRank {
            rank: env.rank,
            world: env.world,
            timeout,
            members: gathering.members,
            peers: gathering.streams,
            failed: std::cell::RefCell::new(None),
            door: gathering.door,
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
                        "{} gave {} where rank 0 gave {}",
                        self.members[rank].describe(),
                        remote_text(theirs.as_bytes(), REASON_CHARS),
                        remote_text(kinds.as_bytes(), REASON_CHARS)
                    ));
                    break;
                }
                Err(e) => {
                    outcome = Err(self.lost(rank, &e));
                    break;
                }
            }
        }
        // A second process of a rank came: which of the two trains was chance. (Told
        // after every part is read, so that no rank's unread bytes reset its
        // connection before it reads why.)
        if let (Ok(()), Some(why)) = (&outcome, self.door.as_ref().and_then(LateDoor::duplicate)) {
            outcome = Err(why);
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
        _ => Err(remote_text(&body, REASON_CHARS)),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_text_escapes_what_does_not_print_and_is_cut() {
        assert_eq!(remote_text(b"gpu7.cluster-a", 100), "gpu7.cluster-a");
        assert_eq!(
            remote_text("a\x1b[31m\nb\u{202e}c \"d\" \\ é\t".as_bytes(), 100),
            r#"a\u{1b}[31m\nb\u{202e}c "d" \ é\t"#
        );
        assert_eq!(remote_text(&[0xff, b'x'], 100), "\u{fffd}x");
        assert_eq!(remote_text(b"abcdef", 3), "abc… (3 more bytes)");
    }

    #[test]
    fn connections_that_do_not_introduce_themselves_in_time_are_dropped() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut door = Door::new(listener, Duration::from_millis(300)).unwrap();
        let connect = || TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (mut silent, mut trickler, mut http) = (connect(), connect(), connect());
        http.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
        // A rank that comes after them, its introduction sent at once.
        let mut rank = connect();
        let me = Member {
            rank: 1,
            node: Some(0),
            host: Some("gpu7".into()),
        };
        let settings = BTreeMap::from([("--lr".to_string(), "0.05".to_string())]);
        write_introduction(&mut rank, &me, 2, &settings).unwrap();
        let started = Instant::now();
        let far = started + Duration::from_secs(60);
        let (mut whole, mut left) = (Vec::new(), usize::MAX);
        // A byte of a rank's hello, then zeros, every 20 ms: never whole in time.
        let mut trickle = HELLO.iter().copied().chain(std::iter::repeat(0));
        for _ in 0..100 {
            let _ = trickler.write_all(&[trickle.next().unwrap()]);
            whole.extend(door.poll(far).unwrap());
            left = door.pending.len();
            if left == 0 && started.elapsed() > Duration::from_millis(300) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(left, 0, "connections held past the door's patience");
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(whole.len(), 1);
        let (intro, _) = &whole[0];
        assert_eq!((&intro.member, intro.world), (&me, 2));
        assert_eq!(intro.settings, settings);
        // The strays' connections are closed.
        for stray in [&mut silent, &mut http] {
            stray
                .set_read_timeout(Some(Duration::from_secs(2)))
                .unwrap();
            match stray.read(&mut [0u8; 1]) {
                Ok(0) => {}
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
                other => panic!("a stray still connected: {other:?}"),
            }
        }
    }
}
