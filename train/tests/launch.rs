//! Ranks as processes: the launcher stops every rank when one fails and names it; the
//! TCP meeting (in Kiln's rendezvous folder or on `MASTER_ADDR:MASTER_PORT`) hands out
//! rank 0's bytes and refuses ranks that disagree (world, settings, a rank twice, also
//! after the meeting); no stray client nor fake rank 0 holds a rank past its timeout,
//! and their text is printed escaped; the TCP collective (`TcpRank`) agrees with the
//! in-process one bit for bit and turns a rank that never comes, dies or gives other
//! tensors into one error on the others, within the timeout.

use kiln_cpu::{Cpu, CpuDevice};
use kiln_tensor::{Collective, RawTensor};
use kiln_train::launch::launch;
use kiln_train::rank_env::{Meeting, RankEnv, Starter};
use kiln_train::tcp::{meet, Member, TcpRank};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const DEV: CpuDevice = CpuDevice;

/// The settings every rank of these tests is given, unless a test says otherwise.
fn agreed() -> BTreeMap<String, String> {
    settings(&[("--lr", "0.05"), ("--batch-size", "64"), ("--seed", "1")])
}

fn settings(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A fresh rendezvous folder for `world` ranks, and each rank's environment.
fn envs(name: &str, world: usize) -> Vec<RankEnv> {
    let dir = std::env::temp_dir().join(format!("kiln-launch-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    (0..world)
        .map(|rank| RankEnv {
            rank,
            world,
            local_rank: rank,
            node: None,
            starter: Starter::Kiln,
            meeting: Meeting::Folder(dir.clone()),
            launched: false,
            launcher: None,
        })
        .collect()
}

/// Runs `f` for every rank of `envs` on its own thread; results in rank order.
fn on_ranks<T: Send>(envs: Vec<RankEnv>, f: impl Fn(RankEnv) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let handles: Vec<_> = envs.into_iter().map(|e| s.spawn(|| f(e))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn tensor(values: Vec<f32>) -> RawTensor<Cpu> {
    let n = values.len();
    RawTensor::from_vec(values, &[n], &DEV).unwrap()
}

fn sh() -> PathBuf {
    PathBuf::from("/bin/sh")
}

#[test]
fn the_launcher_waits_for_every_rank_and_gives_each_its_place() {
    let dir = std::env::temp_dir().join(format!("kiln-launch-places-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Each rank writes its place where the test can read it.
    let script = format!(
        "echo $KILN_RANK $KILN_WORLD > {}/rank-$KILN_RANK; test -d \"$KILN_RENDEZVOUS\"",
        dir.display()
    );
    launch(3, &sh(), &["-c".into(), script]).unwrap();
    for rank in 0..3 {
        let place = std::fs::read_to_string(dir.join(format!("rank-{rank}"))).unwrap();
        assert_eq!(place.trim(), format!("{rank} 3"));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_failing_rank_stops_the_others_and_is_named() {
    let started = Instant::now();
    let script = "if [ $KILN_RANK = 1 ]; then sleep 0.2; exit 3; fi; sleep 60".to_string();
    let err = launch(3, &sh(), &["-c".into(), script])
        .unwrap_err()
        .to_string();
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the launcher waited for the sleepers"
    );
    assert!(
        err.contains("rank 1 exited with status 3; stopped rank(s) 0, 2"),
        "{err}"
    );
    let missing = launch(2, Path::new("/kiln-nowhere/bin"), &[])
        .unwrap_err()
        .to_string();
    assert!(
        missing.contains("starting rank 0 (/kiln-nowhere/bin)"),
        "{missing}"
    );
}

#[test]
fn loopback_ranks_agree_bit_for_bit_over_many_rounds() {
    let results = on_ranks(envs("rounds", 3), |env| {
        let rank = TcpRank::join(&env, Duration::from_secs(20), &agreed()).unwrap();
        let me = env.rank as f32;
        let mut seen = Vec::new();
        for round in 0..50 {
            let t = tensor(vec![0.1 + me, 1e8 * (me - 1.0), round as f32 * me]);
            let mean = rank.all_reduce_mean(&[t]).unwrap();
            seen.extend(mean[0].to_vec::<f32>().unwrap());
        }
        let rooted = rank.broadcast(&[tensor(vec![me; 2])], 2).unwrap();
        (seen, rooted[0].to_vec::<f32>().unwrap())
    });
    for (rank, (seen, rooted)) in results.iter().enumerate() {
        assert_eq!(seen, &results[0].0, "rank {rank} got other bits");
        assert_eq!(rooted, &vec![2.0; 2]);
    }
    // Round 7's mean: (0.1 + 1.1 + 2.1) / 3, 0, 7 · (0 + 1 + 2) / 3.
    let round7 = &results[0].0[21..24];
    assert!(
        (round7[0] - 1.1).abs() < 1e-6 && round7[1] == 0.0 && round7[2] == 7.0,
        "{round7:?}"
    );
}

#[test]
fn a_rank_that_never_comes_times_rank_0_out() {
    let env = envs("never", 2).remove(0);
    let started = Instant::now();
    let err = TcpRank::join(&env, Duration::from_millis(500), &agreed())
        .err()
        .unwrap()
        .to_string();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(
        err.contains("waited 0 s for rank(s) 1 to join")
            || err.contains("waited 1 s for rank(s) 1 to join"),
        "{err}"
    );
    let late = envs("no-rank-0", 2).remove(1);
    let err = TcpRank::join(&late, Duration::from_millis(300), &agreed())
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("for rank 0 to publish"), "{err}");
}

#[test]
fn a_rank_that_dies_fails_the_others_at_once() {
    let started = Instant::now();
    let results = on_ranks(envs("dies", 3), |env| {
        let rank = TcpRank::join(&env, Duration::from_secs(30), &agreed()).unwrap();
        if env.rank == 2 {
            // Its process ends: the connection closes.
            drop(rank);
            return Ok::<Vec<f32>, String>(Vec::new());
        }
        let first = rank
            .all_reduce_mean(&[tensor(vec![1.0])])
            .map_err(|e| e.to_string())?;
        Ok(first[0].to_vec::<f32>().unwrap())
    });
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the ranks waited for the timeout"
    );
    let err0 = results[0].as_ref().unwrap_err();
    assert!(
        err0.contains("rank 2 closed its connection (it died or left)"),
        "{err0}"
    );
    let err1 = results[1].as_ref().unwrap_err();
    assert!(
        err1.contains("the group has failed (rank 2 closed its connection"),
        "{err1}"
    );
}

#[test]
fn ranks_that_disagree_on_the_tensors_fail_together_and_stay_failed() {
    let results = on_ranks(envs("disagree", 2), |env| {
        let rank = TcpRank::join(&env, Duration::from_secs(30), &agreed()).unwrap();
        let first = rank
            .all_reduce_mean(&[tensor(vec![1.0; 2 + env.rank])])
            .map_err(|e| e.to_string());
        let again = rank
            .all_reduce_mean(&[tensor(vec![1.0; 2])])
            .map_err(|e| e.to_string());
        (first, again)
    });
    let err = results[0].0.as_ref().unwrap_err();
    assert!(
        err.contains("rank 1 gave mean [f32[3]] where rank 0 gave mean [f32[2]]"),
        "{err}"
    );
    let err = results[1].0.as_ref().unwrap_err();
    assert!(err.contains("the group has failed (rank 1 gave"), "{err}");
    for (first, again) in &results {
        assert!(first.is_err());
        assert!(
            again.as_ref().unwrap_err().contains("the group has failed"),
            "{again:?}"
        );
    }
}

/// A port of loopback nobody listens on (as far as anyone can tell).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// torchrun's places for `world` ranks, two a node, meeting on `port` of loopback.
fn torchrun_envs(world: usize, port: u16) -> Vec<RankEnv> {
    (0..world)
        .map(|rank| RankEnv {
            rank,
            world,
            local_rank: rank % 2,
            node: Some(rank / 2),
            starter: Starter::Torchrun,
            meeting: Meeting::Tcp {
                host: "127.0.0.1".into(),
                port,
                store_key: None,
            },
            launched: false,
            launcher: None,
        })
        .collect()
}

/// Why `env`'s rank could not meet the others within a second.
fn meet_error(env: &RankEnv) -> String {
    meet(env, Duration::from_secs(1), &agreed(), &[])
        .err()
        .expect("the meeting fails")
        .to_string()
}

#[test]
fn ranks_meet_on_master_port_and_get_rank_0s_bytes_and_roll() {
    let port = free_port();
    // Something that is not a rank connects first: rank 0 ignores it.
    let stray = std::thread::spawn(move || {
        for _ in 0..100 {
            if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
                use std::io::Write;
                let _ = s.write_all(b"GET / HTTP/1.0\r\n\r\n");
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    });
    let results = on_ranks(torchrun_envs(4, port), |env| {
        let mine = format!("from rank {}", env.rank);
        let met = meet(&env, Duration::from_secs(20), &agreed(), mine.as_bytes()).unwrap();
        (met.members, met.shared)
    });
    stray.join().unwrap();
    for (members, shared) in &results {
        assert_eq!(shared, b"from rank 0");
        let nodes: Vec<Option<usize>> = members.iter().map(|m| m.node).collect();
        assert_eq!(nodes, [Some(0), Some(0), Some(1), Some(1)]);
        assert!(members.iter().all(|m| m.host.is_some()));
        assert_eq!(members, &results[0].0);
    }
    let member = Member {
        rank: 2,
        node: Some(1),
        host: Some("gpu7".into()),
    };
    assert_eq!(member.describe(), "rank 2 (node 1 on gpu7)");
}

#[test]
fn torchrun_ranks_exchange_bit_for_bit_with_the_folder_ones() {
    let port = free_port();
    let run = |envs: Vec<RankEnv>| {
        on_ranks(envs, |env| {
            let rank = TcpRank::join(&env, Duration::from_secs(20), &agreed()).unwrap();
            let me = env.rank as f32;
            let t = tensor(vec![0.1 + me, 1e8 * (me - 1.0), 3.0 * me]);
            rank.all_reduce_mean(&[t]).unwrap()[0]
                .to_vec::<f32>()
                .unwrap()
        })
    };
    let over_tcp = run(torchrun_envs(4, port));
    let in_folder = run(envs("same-bits", 4));
    assert_eq!(over_tcp, in_folder);
    assert!(over_tcp.iter().all(|r| r == &over_tcp[0]));
}

#[test]
fn ranks_that_disagree_on_the_world_or_their_number_are_refused() {
    // Rank 1 was told of a world of 3, rank 0 of 2.
    let port = free_port();
    let mut envs = torchrun_envs(2, port);
    envs[1].world = 3;
    let results = on_ranks(envs, |env| {
        meet(&env, Duration::from_secs(20), &agreed(), &[])
            .err()
            .unwrap()
            .to_string()
    });
    for err in &results {
        assert!(
            err.contains("rank 1 (node 0 on ")
                && err.contains("belongs to a job of 3 ranks, and rank 0 to one of 2: every rank must be given the same world size (RANK, WORLD_SIZE)"),
            "{err}"
        );
    }
    assert!(
        results[1].contains("rank 0 ended the meeting: "),
        "{}",
        results[1]
    );
    // Two processes told they are rank 1.
    let port = free_port();
    let mut envs = torchrun_envs(3, port);
    envs[2].rank = 1;
    let results = on_ranks(envs, |env| {
        meet(&env, Duration::from_secs(20), &agreed(), &[])
            .err()
            .map(|e| e.to_string())
    });
    let err = results[0].as_ref().unwrap();
    assert!(
        err.contains("two processes joined as rank 1: rank 1 (node"),
        "{err}"
    );
    assert!(results.iter().all(Option::is_some), "{results:?}");
}

#[test]
fn a_rank_0_that_never_comes_is_named_with_its_address() {
    let port = free_port();
    let env = torchrun_envs(2, port).remove(1);
    let started = Instant::now();
    let err = meet_error(&env);
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(
        err.contains(&format!(
            "rank 1 (node 0): waited 1 s for rank 0 at 127.0.0.1:{port} (MASTER_ADDR:MASTER_PORT) (did rank 0 start there?)"
        )),
        "{err}"
    );
    // And rank 0 names the ranks that never came.
    let env = torchrun_envs(4, free_port()).remove(0);
    let err = meet_error(&env);
    assert!(
        err.contains("waited 1 s for rank(s) 1, 2, 3 to join"),
        "{err}"
    );
}

#[test]
fn a_taken_master_port_is_named() {
    let taken = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let env = torchrun_envs(2, port).remove(0);
    let err = meet_error(&env);
    assert!(
        err.contains(&format!(
            "port {port} (MASTER_PORT) is taken on this machine"
        )),
        "{err}"
    );
}

/// A stand-in for torchrun's agent store speaking the part of PyTorch's TCP store
/// protocol Kiln uses (checked against torch 2.15's `TCPStore` and torchrun; see
/// `kiln_train::torch_store`): serves every connection until the test ends.
fn agent_store() -> u16 {
    use std::collections::HashMap;
    use std::io::{Read, Write};
    use std::sync::{Arc, Mutex};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let keys: Arc<Mutex<HashMap<Vec<u8>, Vec<u8>>>> = Arc::default();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let (mut s, keys) = (stream.unwrap(), keys.clone());
            std::thread::spawn(move || {
                let u8s = |s: &mut std::net::TcpStream, n: usize| {
                    let mut b = vec![0u8; n];
                    s.read_exact(&mut b).map(|_| b)
                };
                let word = |b: Vec<u8>| u64::from_le_bytes(b.try_into().unwrap()) as usize;
                let string = |s: &mut std::net::TcpStream| {
                    let n = word(u8s(s, 8)?);
                    u8s(s, n)
                };
                let hello = u8s(&mut s, 5).unwrap();
                assert_eq!(hello, [0, 0xCE, 0xF7, 0x85, 0x3C], "the store's handshake");
                while let Ok(query) = u8s(&mut s, 1) {
                    match query[0] {
                        1 => {
                            let (k, v) = (string(&mut s).unwrap(), string(&mut s).unwrap());
                            keys.lock().unwrap().insert(k, v);
                        }
                        5 => {
                            assert_eq!(word(u8s(&mut s, 8).unwrap()), 1);
                            let k = string(&mut s).unwrap();
                            let ready = keys.lock().unwrap().contains_key(&k);
                            s.write_all(&[if ready { 0 } else { 1 }]).unwrap();
                        }
                        3 => {
                            let k = string(&mut s).unwrap();
                            let v = keys.lock().unwrap()[&k].clone();
                            s.write_all(&(v.len() as u64).to_le_bytes()).unwrap();
                            s.write_all(&v).unwrap();
                        }
                        other => panic!("a query the store was not asked for: {other}"),
                    }
                }
            });
        }
    });
    port
}

#[test]
fn under_torchruns_agent_rank_0_publishes_its_port_in_the_agents_store() {
    let store = agent_store();
    let mut envs = torchrun_envs(3, store);
    for env in &mut envs {
        let Meeting::Tcp { store_key, .. } = &mut env.meeting else {
            unreachable!()
        };
        *store_key = Some("/kiln/run/0/rank-0-port".into());
    }
    let results = on_ranks(envs, |env| {
        let rank = TcpRank::join(&env, Duration::from_secs(20), &agreed()).unwrap();
        let t = tensor(vec![env.rank as f32]);
        rank.all_reduce_mean(&[t]).unwrap()[0]
            .to_vec::<f32>()
            .unwrap()
    });
    assert!(results.iter().all(|r| r == &[1.0]), "{results:?}");
    // A rank 0 that never publishes is waited for, then named.
    let mut env = torchrun_envs(2, store).remove(1);
    let Meeting::Tcp { store_key, .. } = &mut env.meeting else {
        unreachable!()
    };
    *store_key = Some("/kiln/run/1/rank-0-port".into());
    let err = meet_error(&env);
    assert!(
        err.contains(&format!(
            "waited 1 s for rank 0 to publish its port in torchrun's store at 127.0.0.1:{store}"
        )),
        "{err}"
    );
}

#[test]
fn tcp_ranks_give_the_in_process_collectives_bits_for_f32_and_bf16() {
    use kiln_tensor::bf16;
    use kiln_train::parallel::ThreadGroup;
    // f32 values travel as f32, a bucket holding bf16 as f64: both must give what the
    // in-process collective gives (f64 sums in rank order, rounded once).
    let bucket = |me: usize| {
        let me = me as f32;
        let wide: Vec<f32> = (0..64)
            .map(|i| (i as f32 + 0.1) * (1.0 + me) / 3.0)
            .collect();
        let narrow: Vec<bf16> = (0..9)
            .map(|i| bf16::from_f32((i as f32 - 4.3) * (me + 0.7) / 7.0))
            .collect();
        vec![
            tensor(wide),
            RawTensor::from_vec(narrow, &[9], &DEV).unwrap(),
        ]
    };
    let read = |out: Vec<RawTensor<Cpu>>| -> Vec<Vec<f64>> {
        out.iter().map(|t| t.to_f64_vec().unwrap()).collect()
    };
    let over_tcp = on_ranks(envs("wire", 3), |env| {
        let rank = TcpRank::join(&env, Duration::from_secs(20), &agreed()).unwrap();
        let f32_only = rank.all_reduce_mean(&bucket(env.rank)[..1]).unwrap();
        let mixed = rank.all_reduce_mean(&bucket(env.rank)).unwrap();
        (read(f32_only), read(mixed))
    });
    let ranks = ThreadGroup::new(3, Duration::from_secs(20)).unwrap();
    let in_process: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .into_iter()
            .enumerate()
            .map(|(me, rank)| {
                s.spawn(move || {
                    let f32_only = Collective::<Cpu>::all_reduce_mean(&rank, &bucket(me)[..1]);
                    let mixed = Collective::<Cpu>::all_reduce_mean(&rank, &bucket(me));
                    (read(f32_only.unwrap()), read(mixed.unwrap()))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(over_tcp, in_process);
}

/// A connection to `port` of loopback, tried for up to 2 s (rank 0 may not listen
/// yet).
fn connect(port: u16) -> TcpStream {
    for _ in 0..200 {
        if let Ok(s) = TcpStream::connect(("127.0.0.1", port)) {
            return s;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("nothing listened on port {port}");
}

/// A client of rank 0's port that is no rank: it connects, sends `first`, then one
/// byte of `trickle` every 250 ms (at most 40, or until rank 0 drops it), or with
/// nothing to trickle stays silent until dropped (10 s at most), and says on
/// `connected` when it has connected.
fn stray(
    port: u16,
    first: &'static [u8],
    trickle: &'static [u8],
    connected: std::sync::mpsc::Sender<()>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut s = connect(port);
        let _ = s.write_all(first);
        connected.send(()).unwrap();
        if trickle.is_empty() {
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let _ = s.read(&mut [0u8; 1]);
        }
        for byte in trickle.iter().cycle().take(40) {
            std::thread::sleep(Duration::from_millis(250));
            if s.write_all(&[*byte]).is_err() {
                return;
            }
        }
    })
}

#[test]
fn silent_and_trickling_clients_hold_no_rank_past_the_timeout() {
    // They connect before the ranks: a silent one, one trickling the start of a
    // rank's hello, and one trickling a whole hello and then zeros.
    let port = free_port();
    let timeout = Duration::from_secs(3);
    let started = Instant::now();
    let results = std::thread::scope(|s| {
        let mut envs = torchrun_envs(3, port).into_iter();
        let rank0 = envs.next().unwrap();
        let host = s.spawn(move || meet(&rank0, timeout, &agreed(), b"id").map(|m| m.shared));
        let (tx, rx) = std::sync::mpsc::channel();
        let strays = [
            stray(port, b"", b"", tx.clone()),
            stray(port, b"", b"KILNRDV2", tx.clone()),
            stray(port, b"KILNRDV2", b"\0", tx),
        ];
        for _ in &strays {
            rx.recv().unwrap();
        }
        let others: Vec<_> = envs
            .map(|env| s.spawn(move || meet(&env, timeout, &agreed(), &[]).map(|m| m.shared)))
            .collect();
        let mut results = vec![host.join().unwrap()];
        results.extend(others.into_iter().map(|h| h.join().unwrap()));
        results
    });
    for (rank, met) in results.iter().enumerate() {
        assert_eq!(
            met.as_ref().map_err(|e| e.to_string()).unwrap(),
            b"id",
            "rank {rank}"
        );
    }
    assert!(
        started.elapsed() < timeout,
        "the strays held the meeting {:?}",
        started.elapsed()
    );
    // Rank 0 alone with a trickling stray gives up on the missing rank at its timeout,
    // not when the stray stops.
    let port = free_port();
    let rank0 = torchrun_envs(2, port).remove(0);
    let (tx, rx) = std::sync::mpsc::channel();
    let started = Instant::now();
    let host = std::thread::spawn(move || meet_error(&rank0));
    let trickler = stray(port, b"KILNRDV2", b"\0", tx);
    rx.recv().unwrap();
    let err = host.join().unwrap();
    assert!(err.contains("waited 1 s for rank(s) 1 to join"), "{err}");
    assert!(
        started.elapsed() < Duration::from_millis(2500),
        "the stray held rank 0 {:?}",
        started.elapsed()
    );
    trickler.join().unwrap();
}

#[test]
fn ranks_started_with_other_settings_stop_naming_them() {
    let port = free_port();
    let results = on_ranks(torchrun_envs(3, port), |env| {
        let mine = match env.rank {
            2 => settings(&[("--lr", "0.1"), ("--batch-size", "32"), ("--seed", "1")]),
            _ => agreed(),
        };
        meet(&env, Duration::from_secs(20), &mine, &[])
            .err()
            .map(|e| e.to_string())
    });
    let why = "was started with other settings than rank 0: --batch-size 32 where rank 0 has 64, --lr 0.1 where rank 0 has 0.05 (every rank must be given the same)";
    for (rank, err) in results.iter().enumerate() {
        let err = err.as_ref().expect("every rank stops");
        assert!(
            err.contains("rank 2 (node 1 on ") && err.contains(why),
            "rank {rank}: {err}"
        );
    }
    assert!(results[1]
        .as_ref()
        .unwrap()
        .contains("rank 0 ended the meeting: "));
    // A setting one rank has and another has not is named too.
    let port = free_port();
    let results = on_ranks(torchrun_envs(2, port), |env| {
        let mine = match env.rank {
            1 => settings(&[("--lr", "0.05"), ("--batch-size", "64")]),
            _ => agreed(),
        };
        meet(&env, Duration::from_secs(20), &mine, &[])
            .err()
            .map(|e| e.to_string())
    });
    for err in &results {
        let err = err.as_ref().expect("every rank stops");
        assert!(err.contains("--seed none where rank 0 has 1"), "{err}");
    }
}

#[test]
fn a_second_process_of_a_rank_is_turned_away_and_stops_the_job() {
    use std::sync::Barrier;
    let port = free_port();
    let envs = torchrun_envs(2, port);
    let (met, late_came) = (Barrier::new(3), Barrier::new(3));
    let (strays_came, exchanged) = (Barrier::new(3), Barrier::new(3));
    let (ranks, late) = std::thread::scope(|s| {
        let ranks: Vec<_> = envs
            .iter()
            .cloned()
            .map(|env| {
                let (met, strays_came) = (&met, &strays_came);
                let (late_came, exchanged) = (&late_came, &exchanged);
                s.spawn(move || {
                    let rank = TcpRank::join(&env, Duration::from_secs(20), &agreed()).unwrap();
                    met.wait();
                    strays_came.wait();
                    // A process of another job is turned away; this one goes on.
                    let first = rank.all_reduce_mean(&[tensor(vec![env.rank as f32])]);
                    exchanged.wait();
                    late_came.wait();
                    let second = rank.all_reduce_mean(&[tensor(vec![1.0])]);
                    (
                        first.unwrap()[0].to_vec::<f32>().unwrap(),
                        second.err().map(|e| e.to_string()),
                    )
                })
            })
            .collect();
        met.wait();
        let mut other_job = envs[1].clone();
        other_job.world = 3;
        let stranger = meet_error(&other_job);
        strays_came.wait();
        exchanged.wait();
        let duplicate = meet_error(&envs[1]);
        late_came.wait();
        let ranks: Vec<_> = ranks.into_iter().map(|h| h.join().unwrap()).collect();
        (ranks, (stranger, duplicate))
    });
    let (stranger, duplicate) = late;
    assert!(
        stranger.contains("turned it away: the ranks met without it: rank 1 (node 0 on ")
            && stranger.contains("belongs to a job of 3 ranks, and rank 0 to one of 2"),
        "{stranger}"
    );
    let why = "two processes joined as rank 1: rank 1 (node 0 on ";
    assert!(
        duplicate.contains(&format!("turned it away: {why}"))
            && duplicate.contains("which came after (every rank must be started once)"),
        "{duplicate}"
    );
    for (rank, (first, second)) in ranks.iter().enumerate() {
        assert_eq!(first, &[0.5], "rank {rank}");
        let err = second.as_ref().expect("the job stops");
        assert!(err.contains(why), "rank {rank}: {err}");
    }
    assert!(ranks[1]
        .1
        .as_ref()
        .unwrap()
        .contains("the group has failed (two processes"));
}

/// A fake rank 0 on a port of loopback: it takes one connection, reads what the
/// rank sends, then writes `answer`, one byte every `gap` when given one (stopping
/// after 10 s, or when the rank has gone).
fn fake_rank_0(answer: Vec<u8>, gap: Option<Duration>) -> (u16, std::thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let thread = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        // The introduction, all of it (unread bytes would reset the connection when
        // it closes).
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        while let Ok(1..) = s.read(&mut [0u8; 4096]) {}
        let Some(gap) = gap else {
            let _ = s.write_all(&answer);
            // Held open until the rank has read it and gone.
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let _ = s.read(&mut [0u8; 1]);
            return;
        };
        let started = Instant::now();
        for byte in answer {
            if s.write_all(&[byte]).is_err() || started.elapsed() > Duration::from_secs(10) {
                return;
            }
            std::thread::sleep(gap);
        }
    });
    (port, thread)
}

/// The roll of a job of 2 whose hosts are `host`, as rank 0 sends it, nothing shared.
fn roll(host: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8];
    out.extend(2u64.to_le_bytes());
    for node in 1..=2u64 {
        out.extend(node.to_le_bytes());
        out.extend((host.len() as u64).to_le_bytes());
        out.extend(host);
    }
    out.extend(0u64.to_le_bytes());
    out
}

#[test]
fn a_rank_0_that_trickles_its_answer_is_given_up_on_within_the_timeout() {
    let (port, fake) = fake_rank_0(roll(b"gpu7"), Some(Duration::from_millis(200)));
    let env = torchrun_envs(2, port).remove(1);
    let started = Instant::now();
    let err = meet_error(&env);
    assert!(
        err.contains(&format!(
            "rank 0 at 127.0.0.1:{port} (MASTER_ADDR:MASTER_PORT) did not answer within 1 s"
        )),
        "{err}"
    );
    // The timeout and a second for the answer to arrive.
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    fake.join().unwrap();
}

#[test]
fn text_from_whatever_answers_on_master_port_is_printed_escaped_and_cut() {
    // A reason with terminal escapes, a line break, a right-to-left override and
    // 100 KB more.
    let hostile = format!(
        "\x1b[2J\x1b[31mowned\x1b[0m\nerror: fake\u{202e}{}",
        "A".repeat(100_000)
    );
    let mut answer = vec![1u8];
    answer.extend((hostile.len() as u64).to_le_bytes());
    answer.extend(hostile.as_bytes());
    let (port, fake) = fake_rank_0(answer, None);
    let err = meet_error(&torchrun_envs(2, port).remove(1));
    fake.join().unwrap();
    assert!(
        err.contains(
            r"rank 0 ended the meeting: \u{1b}[2J\u{1b}[31mowned\u{1b}[0m\nerror: fake\u{202e}AAA"
        ),
        "{err}"
    );
    assert!(
        !err.chars().any(|c| c.is_control() || c == '\u{202e}'),
        "{err:?}"
    );
    assert!(
        err.len() < 5000 && err.ends_with("more bytes)"),
        "{} bytes",
        err.len()
    );
    // Host names in rank 0's roll too.
    let (port, fake) = fake_rank_0(roll(b"gpu\x1b]0;pwned\x07"), None);
    let met = meet(
        &torchrun_envs(2, port).remove(1),
        Duration::from_secs(5),
        &agreed(),
        &[],
    );
    fake.join().unwrap();
    let members = met.unwrap().members;
    assert_eq!(
        members[1].describe(),
        r"rank 1 (node 1 on gpu\u{1b}]0;pwned\u{7})"
    );
}
