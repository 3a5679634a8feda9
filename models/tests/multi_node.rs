//! Jobs across machines, simulated on this one: ranks that torchrun (or anything
//! setting its variables), `srun` and `mpirun` start. Two nodes of two ranks each
//! train the MLP as one process does on the whole batch, as do two Slurm tasks; a killed node, a node that never
//! arrives, and a world size or flags that differ between ranks each stop every rank
//! within the timeout with an error naming the rank (and the flags).

#[path = "support/ranks.rs"]
mod ranks;

use ranks::{assert_same_training, finish};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TRAIN: &str = env!("CARGO_BIN_EXE_kiln-train");

fn scratch(name: &str) -> PathBuf {
    ranks::scratch("kiln-nodes", name)
}

/// A port of loopback that nothing listens on now; each test takes its own.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The MLP's short run, as every test here trains it.
const COMMON: [&str; 8] = [
    "--model",
    "mlp",
    "--limit",
    "1024",
    "--epochs",
    "1",
    "--save-every",
    "0",
];

/// One process on the whole batch of 128, into `dir/one.safetensors`.
fn train_alone(dir: &Path) -> PathBuf {
    let one = dir.join("one.safetensors");
    let out = Command::new(TRAIN)
        .args(COMMON)
        .args(["--batch-size", "128", "--out", one.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    one
}

/// Rank `rank` of a torchrun-style job of `world` ranks, two a node, meeting on
/// `port` of loopback; output piped.
fn torchrun_rank(rank: usize, world: usize, port: u16, args: &[&str]) -> Child {
    Command::new(TRAIN)
        .args(args)
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", world.to_string())
        .env("LOCAL_RANK", (rank % 2).to_string())
        .env("LOCAL_WORLD_SIZE", "2")
        .env("GROUP_RANK", (rank / 2).to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Checks a rank failed with one line of error containing `want`.
fn assert_failed(rank: usize, outcome: &(Option<i32>, String, String), want: &str) {
    let (code, _, err) = outcome;
    assert_eq!(*code, Some(1), "rank {rank}: {err}");
    assert!(err.contains(want), "rank {rank}: {err}");
    assert_eq!(err.trim().lines().count(), 1, "rank {rank}: {err}");
}

#[test]
fn two_torchrun_nodes_of_two_ranks_train_as_one_process_on_the_whole_batch() {
    let dir = scratch("torchrun");
    let one = train_alone(&dir);
    let four = dir.join("four.safetensors");
    let port = free_port();
    let args: Vec<&str> = COMMON
        .iter()
        .copied()
        .chain(["--batch-size", "32", "--out", four.to_str().unwrap()])
        .collect();
    let ranks: Vec<Child> = (0..4).map(|r| torchrun_rank(r, 4, port, &args)).collect();
    let outcomes: Vec<_> = ranks
        .into_iter()
        .map(|c| finish(c, Duration::from_secs(120)))
        .collect();
    for (rank, (code, _, err)) in outcomes.iter().enumerate() {
        assert_eq!(*code, Some(0), "rank {rank}: {err}");
    }
    let log = &outcomes[0].1;
    assert!(log.contains("device: the CPU (rank 0 of 4)"), "{log}");
    assert!(log.contains("batch 128 (4 ranks of 32)"), "{log}");
    assert!(
        outcomes[1..].iter().all(|(_, out, _)| out.is_empty()),
        "only rank 0 prints"
    );
    assert_same_training(&one, &four);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A port of 20000 to 29999 (where Slurm's tasks meet without `MASTER_PORT`) that
/// nothing listens on now.
fn free_slurm_port() -> u16 {
    let start = 20000 + (std::process::id() % 10000) as u16;
    (0..10000u16)
        .map(|i| 20000 + (start - 20000 + i) % 10000)
        .find(|&p| std::net::TcpListener::bind(("0.0.0.0", p)).is_ok())
        .expect("a free port from 20000 to 29999")
}

#[test]
fn srun_tasks_meet_on_the_jobs_first_node_and_train_as_one_process() {
    let dir = scratch("srun");
    let one = train_alone(&dir);
    let two = dir.join("two.safetensors");
    let port = free_slurm_port();
    // Without MASTER_ADDR and MASTER_PORT: the node list's first host, and the port
    // 20000 + the job id modulo 10000.
    let job = (30000 + (port - 20000) as u32).to_string();
    let tasks: Vec<Child> = (0..2)
        .map(|task| {
            Command::new(TRAIN)
                .args(COMMON)
                .args(["--batch-size", "64", "--out", two.to_str().unwrap()])
                .env("SLURM_PROCID", task.to_string())
                .env("SLURM_NTASKS", "2")
                .env("SLURM_LOCALID", "0")
                .env("SLURM_NODEID", task.to_string())
                .env("SLURM_JOB_NODELIST", "localhost,kiln-nowhere-node")
                .env("SLURM_JOB_ID", &job)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outcomes: Vec<_> = tasks
        .into_iter()
        .map(|c| finish(c, Duration::from_secs(120)))
        .collect();
    for (task, (code, _, err)) in outcomes.iter().enumerate() {
        assert_eq!(*code, Some(0), "task {task}: {err}");
    }
    assert!(
        outcomes[0].1.contains("batch 128 (2 ranks of 64)"),
        "{}",
        outcomes[0].1
    );
    assert_same_training(&one, &two);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_killed_node_stops_the_others_naming_a_rank_of_it() {
    let dir = scratch("killed");
    let out = dir.join("m.safetensors");
    let args = [
        "--rank-timeout",
        "120",
        "--limit",
        "4096",
        "--epochs",
        "20",
        "--batch-size",
        "32",
        "--save-every",
        "0",
        "--out",
        out.to_str().unwrap(),
    ];
    let port = free_port();
    let mut ranks: Vec<Child> = (0..4).map(|r| torchrun_rank(r, 4, port, &args)).collect();
    // Rank 0 prints the run's settings once every rank has joined.
    let mut lines = BufReader::new(ranks[0].stdout.take().unwrap()).lines();
    let joined = lines.find(|l| l.as_ref().is_ok_and(|l| l.starts_with("training Mlp")));
    assert!(joined.is_some(), "rank 0 never started training");
    // Node 1 (ranks 2 and 3) goes down.
    for child in &mut ranks[2..] {
        child.kill().unwrap();
        child.wait().unwrap();
    }
    let killed = Instant::now();
    let survivors: Vec<_> = ranks
        .drain(..2)
        .map(|c| finish(c, Duration::from_secs(60)))
        .collect();
    assert!(
        killed.elapsed() < Duration::from_secs(20),
        "the survivors waited for the timeout"
    );
    // Rank 0 names the first rank of node 1 it missed; rank 1 hears it from rank 0.
    let named = survivors[0].2.clone();
    assert_failed(0, &survivors[0], "(node 1 on ");
    assert!(
        named.contains("closed its connection (it died or left)")
            && (named.contains("rank 2 (node 1") || named.contains("rank 3 (node 1")),
        "{named}"
    );
    assert_failed(1, &survivors[1], "the group has failed (rank ");
    assert!(!out.exists(), "a failed run saved a checkpoint");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_node_that_never_arrives_fails_the_others_within_the_timeout() {
    let dir = scratch("never");
    let out = dir.join("m.safetensors");
    let args = ["--rank-timeout", "2", "--out", out.to_str().unwrap()];
    let port = free_port();
    let started = Instant::now();
    // Node 0 alone: ranks 2 and 3 never come.
    let node0: Vec<Child> = (0..2).map(|r| torchrun_rank(r, 4, port, &args)).collect();
    let outcomes: Vec<_> = node0
        .into_iter()
        .map(|c| finish(c, Duration::from_secs(60)))
        .collect();
    assert!(started.elapsed() < Duration::from_secs(30));
    assert_failed(
        0,
        &outcomes[0],
        "rank 0 (node 0): waited 2 s for rank(s) 2, 3 to join",
    );
    assert_failed(
        1,
        &outcomes[1],
        "rank 1 (node 0): rank 0 ended the meeting: waited 2 s for rank(s) 2, 3 to join",
    );
    // Rank 0's node never arrives: the others name where they looked for it.
    let port = free_port();
    let lonely = finish(torchrun_rank(3, 4, port, &args), Duration::from_secs(60));
    assert_failed(
        3,
        &lonely,
        &format!(
            "rank 3 (node 1): waited 2 s for rank 0 at 127.0.0.1:{port} (MASTER_ADDR:MASTER_PORT)"
        ),
    );
    assert!(!out.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn ranks_told_other_world_sizes_are_refused_naming_the_rank() {
    let dir = scratch("world");
    let out = dir.join("m.safetensors");
    let args = ["--rank-timeout", "20", "--out", out.to_str().unwrap()];
    let port = free_port();
    // Rank 1 was started with WORLD_SIZE=3 where rank 0 has 2.
    let rank0 = torchrun_rank(0, 2, port, &args);
    let rank1 = torchrun_rank(1, 3, port, &args);
    let outcomes = [
        finish(rank0, Duration::from_secs(60)),
        finish(rank1, Duration::from_secs(60)),
    ];
    let want = "rank 1 (node 0 on ";
    let why = "belongs to a job of 3 ranks, and rank 0 to one of 2: every rank must be given the same world size (RANK, WORLD_SIZE)";
    for (rank, outcome) in outcomes.iter().enumerate() {
        assert_failed(rank, outcome, want);
        assert_failed(rank, outcome, why);
    }
    // A rank past the world, and --ranks beside torchrun's variables, are refused
    // before anything starts.
    let past = finish(torchrun_rank(2, 2, port, &args), Duration::from_secs(30));
    assert_failed(
        2,
        &past,
        "RANK=2 is not a rank of WORLD_SIZE=2 (ranks are 0 to 1)",
    );
    let both = finish(
        torchrun_rank(
            0,
            2,
            port,
            &["--ranks", "2", "--out", out.to_str().unwrap()],
        ),
        Duration::from_secs(30),
    );
    assert_failed(
        0,
        &both,
        "this process is rank 0 of 2 started by torchrun (RANK, WORLD_SIZE), but its command line says --ranks",
    );
    assert!(!out.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn ranks_started_with_another_lr_or_batch_size_stop_naming_the_flags() {
    let dir = scratch("settings");
    let out = dir.join("m.safetensors");
    let out = out.to_str().unwrap();
    let port = free_port();
    let rank0 = torchrun_rank(0, 2, port, &["--rank-timeout", "20", "--out", out]);
    let rank1 = torchrun_rank(
        1,
        2,
        port,
        &[
            "--rank-timeout",
            "20",
            "--out",
            out,
            "--lr",
            "0.1",
            "--batch-size",
            "32",
        ],
    );
    let outcomes = [
        finish(rank0, Duration::from_secs(60)),
        finish(rank1, Duration::from_secs(60)),
    ];
    for (rank, outcome) in outcomes.iter().enumerate() {
        assert_failed(
            rank,
            outcome,
            "was started with other settings than rank 0: --batch-size 32 where rank 0 has 64, --lr 0.1 where rank 0 has 0.05 (every rank must be given the same)",
        );
    }
    assert!(!Path::new(out).exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `mpirun` as CI runs it: as root in a container, more ranks than cores.
#[cfg(feature = "mpi")]
fn mpirun(np: usize) -> Command {
    let mut cmd = Command::new("mpirun");
    cmd.args(["--oversubscribe", "-np", &np.to_string()])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Fails naming what to install when the machine has no `mpirun` (the README's test
/// command installs Open MPI).
#[cfg(feature = "mpi")]
fn check_mpirun() {
    let found = Command::new("mpirun").arg("--version").output();
    assert!(
        found.is_ok_and(|o| o.status.success()),
        "no mpirun: install Open MPI (Debian: apt-get install openmpi-bin libopenmpi-dev libclang-dev), as scripts/test.sh does"
    );
}

#[cfg(feature = "mpi")]
#[test]
fn mpirun_four_ranks_train_as_one_process_on_the_whole_batch() {
    check_mpirun();
    let dir = scratch("mpirun");
    let one = train_alone(&dir);
    let four = dir.join("four.safetensors");
    let job = mpirun(4)
        .arg(TRAIN)
        .args(COMMON)
        .args(["--batch-size", "32", "--out", four.to_str().unwrap()])
        .spawn()
        .unwrap();
    let (code, log, err) = finish(job, Duration::from_secs(120));
    assert_eq!(code, Some(0), "{err}");
    assert!(log.contains("device: the CPU (rank 0 of 4)"), "{log}");
    assert!(log.contains("batch 128 (4 ranks of 32)"), "{log}");
    assert_eq!(log.matches("saved ").count(), 1, "only rank 0 saves: {log}");
    assert_same_training(&one, &four);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[cfg(feature = "mpi")]
#[test]
fn mpi_ranks_that_disagree_or_die_stop_the_job_naming_the_rank() {
    check_mpirun();
    let dir = scratch("mpi-fail");
    let out = dir.join("m.safetensors");
    let out = out.to_str().unwrap();
    // Rank 3 trains another model: the first exchange (rank 0's parameters) differs.
    let job = mpirun(3)
        .arg(TRAIN)
        .args(["--model", "mlp", "--rank-timeout", "20", "--out", out])
        .args([":", "-np", "1", TRAIN])
        .args(["--model", "cnn", "--rank-timeout", "20", "--out", out])
        .spawn()
        .unwrap();
    let (code, _, err) = finish(job, Duration::from_secs(90));
    assert_ne!(code, Some(0), "{err}");
    assert!(
        err.contains("error: invalid argument to `broadcast`: rank 0: rank 3 (on ")
            && err.contains("gave other tensors than rank 0's broadcast from 0 [f32["),
        "{err}"
    );
    // A rank killed mid-run: MPI's launcher stops the job and names it.
    let mut job = mpirun(4)
        .arg(TRAIN)
        .args(["--model", "mlp", "--limit", "4096", "--epochs", "20"])
        .args(["--batch-size", "32", "--save-every", "0", "--out", out])
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(job.stdout.take().unwrap()).lines();
    let joined = lines.find(|l| l.as_ref().is_ok_and(|l| l.starts_with("training Mlp")));
    assert!(joined.is_some(), "rank 0 never started training");
    let victim = rank_process(&job, 2).expect("rank 2's process");
    Command::new("kill")
        .args(["-9", &victim.to_string()])
        .status()
        .unwrap();
    let killed = Instant::now();
    let (code, _, err) = finish(job, Duration::from_secs(60));
    assert!(
        killed.elapsed() < Duration::from_secs(20),
        "the job waited on"
    );
    assert_ne!(code, Some(0), "{err}");
    assert!(err.contains("process rank 2 with PID"), "{err}");
    assert!(!Path::new(out).exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The process id of MPI rank `rank` of the job `mpirun` started (Linux's /proc).
#[cfg(feature = "mpi")]
fn rank_process(mpirun: &Child, rank: usize) -> Option<u32> {
    let parent = mpirun.id().to_string();
    let wanted = format!("OMPI_COMM_WORLD_RANK={rank}");
    std::fs::read_dir("/proc").ok()?.find_map(|entry| {
        let pid: u32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // The parent id is the fourth field, after the command in parentheses.
        let ppid = stat.rsplit(')').next()?.split_whitespace().nth(1)?;
        let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
        let ours = ppid == parent && environ.split(|&b| b == 0).any(|v| v == wanted.as_bytes());
        ours.then_some(pid)
    })
}

#[cfg(not(feature = "mpi"))]
#[test]
fn ranks_of_mpirun_are_refused_by_a_build_without_mpi() {
    // The variables Open MPI's mpirun sets, without running it.
    let out = Command::new(TRAIN)
        .args(["--out", "/nonexistent/m.safetensors"])
        .env("OMPI_COMM_WORLD_RANK", "0")
        .env("OMPI_COMM_WORLD_SIZE", "2")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("rank 0 was started by an MPI launcher, but this program was built without MPI: rebuild it with `--features mpi`"),
        "{err}"
    );
}
