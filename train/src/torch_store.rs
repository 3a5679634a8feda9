//! A client of PyTorch's TCP store, the key-value store that torchrun's agent holds on
//! `MASTER_ADDR:MASTER_PORT` for its workers (it says so with
//! `TORCHELASTIC_USE_AGENT_STORE=True`). Kiln's rank 0 cannot listen on that port, so
//! it listens on a port of its own and publishes it under a key of the store, where the
//! other ranks read it. Only what that needs is spoken: the store's handshake, `SET`,
//! `CHECK` and `GET`, each a one-byte query type followed by length-prefixed keys and
//! values (lengths as little-endian u64, as PyTorch's `size_t` on the machines it
//! runs on).

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// The number a client sends first, which the store checks.
const VALIDATION_MAGIC: u32 = 0x3C85_F7CE;

/// The store's query types that Kiln sends (their numbers in PyTorch's protocol).
#[derive(Clone, Copy)]
#[repr(u8)]
enum Query {
    Validate = 0,
    Set = 1,
    Get = 3,
    Check = 5,
}

/// The store's answer to `CHECK` when every key is set.
const READY: u8 = 0;

/// How long past its caller's deadline an answer of the store may take to arrive.
const ANSWER_GRACE: Duration = Duration::from_secs(1);

/// A connection to the store.
pub struct TorchStore {
    stream: TcpStream,
    address: String,
    /// When every answer must have come, whole: a store (or whatever answers in its
    /// place) that sends a byte now and then cannot stretch the wait.
    deadline: Instant,
}

/// The error of a store operation, naming the store.
fn failed(address: &str, what: &str, e: std::io::Error) -> String {
    format!("torchrun's store at {address} (MASTER_ADDR:MASTER_PORT): {what}: {e}")
}

impl TorchStore {
    /// Connects to the store at `host:port`, trying again until `deadline` (the agent
    /// starts its store before its workers, but a node's agent may come late).
    pub fn connect(host: &str, port: u16, deadline: Instant) -> Result<TorchStore, String> {
        let address = format!("{host}:{port}");
        let stream = crate::tcp::connect_until(&address, deadline).map_err(|last| {
            format!(
                "could not reach torchrun's store at {address} (MASTER_ADDR:MASTER_PORT): {last}"
            )
        })?;
        // Writes are a few bytes, which the kernel takes at once; a stalled store
        // cannot hold one past a second.
        stream
            .set_write_timeout(Some(Duration::from_secs(1)))
            .map_err(|e| failed(&address, "setting a timeout", e))?;
        // An answer to a question asked just before the deadline has a second more.
        let deadline = deadline.max(Instant::now()) + ANSWER_GRACE;
        let mut store = TorchStore {
            stream,
            address,
            deadline,
        };
        let mut hello = vec![Query::Validate as u8];
        hello.extend(VALIDATION_MAGIC.to_le_bytes());
        store
            .stream
            .write_all(&hello)
            .map_err(|e| failed(&store.address, "greeting it", e))?;
        Ok(store)
    }

    /// A query with its length-prefixed parts, sent in one write.
    fn send(&mut self, query: Query, parts: &[&[u8]], what: &str) -> Result<(), String> {
        let mut message = vec![query as u8];
        if let Query::Check = query {
            message.extend(1u64.to_le_bytes());
        }
        for part in parts {
            message.extend((part.len() as u64).to_le_bytes());
            message.extend(*part);
        }
        self.stream
            .write_all(&message)
            .map_err(|e| failed(&self.address, what, e))
    }

    /// Sets `key` to `value`.
    pub fn set(&mut self, key: &str, value: &[u8]) -> Result<(), String> {
        self.send(Query::Set, &[key.as_bytes(), value], "setting a key")
    }

    /// Whether `key` is set.
    pub fn check(&mut self, key: &str) -> Result<bool, String> {
        self.send(Query::Check, &[key.as_bytes()], "checking a key")?;
        let mut answer = [0u8; 1];
        self.read(&mut answer, "reading its answer")?;
        Ok(answer[0] == READY)
    }

    /// The value of `key` once it is set, waiting until `deadline`; `None` past it.
    pub fn wait_get(&mut self, key: &str, deadline: Instant) -> Result<Option<Vec<u8>>, String> {
        self.deadline = deadline.max(Instant::now()) + ANSWER_GRACE;
        while !self.check(key)? {
            if Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.send(Query::Get, &[key.as_bytes()], "reading a key")?;
        let mut len = [0u8; 8];
        self.read(&mut len, "reading a value")?;
        let len = u64::from_le_bytes(len) as usize;
        if len > 1 << 20 {
            return Err(format!(
                "torchrun's store at {} answered with a value of {len} bytes",
                self.address
            ));
        }
        let mut value = vec![0u8; len];
        self.read(&mut value, "reading a value")?;
        Ok(Some(value))
    }

    /// Fills `buf` from the store by the deadline.
    fn read(&mut self, buf: &mut [u8], what: &str) -> Result<(), String> {
        crate::tcp::read_until(&self.stream, self.deadline, buf)
            .map_err(|e| failed(&self.address, what, e))
    }
}
