//! Ranks as real processes on loopback (issue 16 item 5): this test executable starts copies of
//! itself (`child_rank`, with `SWERVE_DIST_TEST_ROLE` saying what to do) under torchrun's or
//! Slurm's variables, and checks what each rank prints:
//!
//! - four processes meet and run every collective, with rank-order reductions bitwise equal on
//!   every rank, under torchrun's variables and under Slurm's (nodelist syntax included);
//! - a rank that never starts: the others fail at the rendezvous deadline, naming it;
//! - a rank that exits, or is killed, after the rendezvous: the others' next collective fails at
//!   once (the collective timeout is a minute, the test takes seconds), naming it.
//!
//! Every child has a deadline; a child still running at the end of a test is killed.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use swerve::backend::cpu::CpuBackend;
use swerve::backend::Backend;
use swerve::dist::launch::ProcessGroupEnv;
use swerve::dist::tcp::TcpComm;
use swerve::dist::{Collectives, Communicator, ReduceOp};

const ROLE: &str = "SWERVE_DIST_TEST_ROLE";
/// The rank that exits or is killed in the failure scenarios.
const VICTIM: &str = "SWERVE_DIST_TEST_VICTIM";
/// Longest any scenario may take before its children are killed and the test fails.
const SCENARIO_LIMIT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------
// The child: one rank.

/// Not a test of its own: one rank of the scenarios below, which start this executable with
/// `--ignored --exact child_rank` and the role in `SWERVE_DIST_TEST_ROLE`.
#[test]
#[ignore = "a rank of the multi-process tests, started by them"]
fn child_rank() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let outcome = run_rank(&role);
    let mut out = std::io::stdout().lock();
    match outcome {
        Ok(value) => writeln!(out, "DIST-RESULT {value}").unwrap(),
        Err(e) => writeln!(out, "DIST-ERROR {}", format!("{e:#}").replace('\n', " | ")).unwrap(),
    }
    out.flush().unwrap();
}

fn announce(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").unwrap();
    out.flush().unwrap();
}

fn run_rank(role: &str) -> anyhow::Result<Value> {
    let group = ProcessGroupEnv::from_env()?;
    let payload = format!("hello from rank {}", group.rank);
    let (comm, payloads) = TcpComm::connect(&group, payload.as_bytes())?;
    let rank = comm.rank();
    let victim: usize = std::env::var(VICTIM).map_or(usize::MAX, |v| v.parse().unwrap());
    let described = json!({
        "group": group.to_string(),
        "source": group.source.as_str(),
        "rank": group.rank,
        "world_size": group.world_size,
        "local_rank": group.local_rank,
        "local_world_size": group.local_world_size,
        "node_rank": group.node_rank,
        "master_addr": group.master_addr,
        "master_port": group.master_port,
        "payloads": payloads.iter().map(|p| String::from_utf8_lossy(p)).collect::<Vec<_>>(),
    });
    match role {
        "collectives" => {
            let mut result = collectives(&comm)?;
            result["described"] = described;
            Ok(result)
        }
        "exit_after_barrier" => {
            comm.barrier()?;
            announce("DIST-READY");
            if rank == victim {
                // No destructors, no goodbye: the kernel closes the sockets.
                std::process::exit(3);
            }
            let mut values = [1.0f32];
            comm.all_reduce_f32(&mut values, ReduceOp::Sum)?;
            comm.barrier()?;
            anyhow::bail!("rank {rank}: collectives went on without rank {victim}")
        }
        "killed_in_collective" => {
            comm.barrier()?;
            announce("DIST-READY");
            if rank == victim {
                std::thread::sleep(SCENARIO_LIMIT);
                anyhow::bail!("rank {rank} was not killed");
            }
            comm.barrier()?;
            anyhow::bail!("rank {rank}: the barrier completed without rank {victim}")
        }
        other => anyhow::bail!("unknown role {other}"),
    }
}

/// Every collective once, each checked where it can be; the results as JSON for the parent to
/// compare across ranks.
fn collectives(comm: &TcpComm) -> anyhow::Result<Value> {
    let (rank, size) = (comm.rank(), comm.size());
    anyhow::ensure!(
        size == 4,
        "the collectives scenario has 4 ranks, not {size}"
    );
    // Rank order, left to right: (1e8 + 1) rounds to 1e8 in f32, so the sum is 0.5 exactly; any
    // other order gives 1.5 or 0. Likewise in f64 with 1e17.
    let mut f32s = [[1.0e8f32, 1.0, -1.0e8, 0.5][rank], rank as f32 * 1.5];
    comm.all_reduce_f32(&mut f32s[..1], ReduceOp::Sum)?;
    comm.all_reduce_f32(&mut f32s[1..], ReduceOp::Max)?;
    let mut f64s = [[1.0e17f64, 1.0, -1.0e17, 0.25][rank]];
    comm.all_reduce_f64(&mut f64s, ReduceOp::Sum)?;
    // 4 MiB each way: frames far larger than a socket buffer.
    let n = 1 << 20;
    let mut big: Vec<f32> = (0..n).map(|i| (i * (rank + 1)) as f32).collect();
    comm.all_reduce_f32(&mut big, ReduceOp::Sum)?;
    let big_ok = big.iter().enumerate().all(|(i, &v)| v == (i * 10) as f32);
    let gathered = comm.all_gather_f64(&[rank as f64, 10.0 * rank as f64])?;
    let ragged = comm.all_gather_bytes(&vec![rank as u8; 3 * rank])?;
    let mut broadcast = if rank == 2 {
        b"from rank 2".to_vec()
    } else {
        b"overwritten".to_vec()
    };
    comm.broadcast_bytes(&mut broadcast, 2)?;
    comm.barrier()?;
    let scattered =
        comm.reduce_scatter_f32(&(0..8).map(|i| (i * (rank + 1)) as f32).collect::<Vec<_>>())?;
    // The tensor collectives' host-staged defaults, on the CPU backend.
    let backend = CpuBackend::new();
    let mut tensor = backend.zeros_f32(&[2, 3])?;
    backend.write_f32(
        &mut tensor,
        &(0..6).map(|i| (i + rank) as f32).collect::<Vec<_>>(),
    )?;
    Communicator::<CpuBackend>::all_reduce_sum(comm, &backend, &mut tensor)?;
    Ok(json!({
        "sum_f32_bits": f32s[0].to_bits(),
        "max_f32": f32s[1],
        "sum_f64_bits": f64s[0].to_bits(),
        "big_ok": big_ok,
        "gathered": gathered,
        "ragged": ragged,
        "broadcast": String::from_utf8_lossy(&broadcast),
        "scattered": scattered,
        "tensor": backend.to_host(&tensor)?,
    }))
}

// ---------------------------------------------------------------------------------------------
// The parent: starts ranks, reads what they print.

/// One child process, its output read by a thread so that waiting for a line has a deadline.
struct Rank {
    rank: usize,
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Rank {
    /// Starts rank `rank` in `role` with exactly `vars` of the launchers' variables (any the
    /// test itself runs under are removed: it may be running inside a Slurm job).
    fn start(rank: usize, role: &str, vars: &[(String, String)]) -> Rank {
        let mut command = Command::new(std::env::current_exe().unwrap());
        command.args([
            "--ignored",
            "--exact",
            "child_rank",
            "--nocapture",
            "--test-threads",
            "1",
        ]);
        for (name, _) in std::env::vars_os() {
            let name = name.to_string_lossy().into_owned();
            let launcher = name.starts_with("SLURM_")
                || name.starts_with("TORCHELASTIC_")
                || name.starts_with("SWERVE_")
                || [
                    "RANK",
                    "WORLD_SIZE",
                    "LOCAL_RANK",
                    "LOCAL_WORLD_SIZE",
                    "GROUP_RANK",
                    "NODE_RANK",
                    "MASTER_ADDR",
                    "MASTER_PORT",
                ]
                .contains(&name.as_str());
            if launcher {
                command.env_remove(&name);
            }
        }
        command.env(ROLE, role);
        for (name, value) in vars {
            command.env(name, value);
        }
        command.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = command.spawn().expect("start a rank");
        let (send, lines) = mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        let stderr = child.stderr.take().unwrap();
        let send_err = send.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                // The harness's `test child_rank ... ` precedes the first line the rank prints.
                let line = match line.find("DIST-") {
                    Some(at) => line[at..].to_string(),
                    None => line,
                };
                let _ = send.send(line);
            }
        });
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = send_err.send(format!("stderr: {line}"));
            }
        });
        Rank {
            rank,
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits for a line starting with one of `prefixes`; panics (with everything the rank
    /// printed) at `deadline`.
    fn wait_for(&mut self, prefixes: &[&str], deadline: Instant) -> String {
        let wanted = |line: &String| prefixes.iter().any(|p| line.starts_with(p));
        if let Some(line) = self.seen.iter().find(|l| wanted(l)) {
            return line.clone();
        }
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if wanted(&line) {
                        return line;
                    }
                }
                Err(_) => panic!(
                    "rank {}: no {prefixes:?} line in time; it printed:\n{}",
                    self.rank,
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// The rank's outcome: its JSON result, or its error message.
    fn outcome(&mut self, deadline: Instant) -> Result<Value, String> {
        let line = self.wait_for(&["DIST-RESULT ", "DIST-ERROR "], deadline);
        if let Some(json) = line.strip_prefix("DIST-RESULT ") {
            Ok(serde_json::from_str(json).unwrap())
        } else {
            Err(line
                .strip_prefix("DIST-ERROR ")
                .unwrap_or(&line)
                .to_string())
        }
    }

    /// Waits for the process to end; its exit code.
    fn exit_code(&mut self, deadline: Instant) -> Option<i32> {
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            assert!(
                Instant::now() < deadline,
                "rank {} did not exit in time; it printed:\n{}",
                self.rank,
                self.seen.join("\n")
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Rank {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// torchrun's variables for rank `rank` of `world` on loopback, then `extra` (which win).
fn torchrun_vars(
    rank: usize,
    world: usize,
    port: u16,
    extra: &[(&str, &str)],
) -> Vec<(String, String)> {
    let (rank, world, port) = (rank.to_string(), world.to_string(), port.to_string());
    let mut all = vars(&[
        ("RANK", &rank),
        ("WORLD_SIZE", &world),
        ("LOCAL_RANK", "0"),
        ("LOCAL_WORLD_SIZE", "1"),
        ("GROUP_RANK", &rank),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", &port),
        ("SWERVE_RDZV_TIMEOUT_S", "20"),
        ("SWERVE_COLLECTIVE_TIMEOUT_S", "60"),
    ]);
    all.extend(vars(extra));
    all
}

fn start_all(
    role: &str,
    vars: impl Fn(usize) -> Vec<(String, String)>,
    ranks: &[usize],
) -> Vec<Rank> {
    ranks
        .iter()
        .map(|&r| Rank::start(r, role, &vars(r)))
        .collect()
}

/// The collectives scenario's results, checked on every rank and across ranks; the ranks'
/// descriptions of their group.
fn check_collectives(ranks: &mut [Rank], deadline: Instant) -> Vec<Value> {
    let results: Vec<Value> = ranks
        .iter_mut()
        .map(|r| {
            let rank = r.rank;
            r.outcome(deadline)
                .unwrap_or_else(|e| panic!("rank {rank} failed: {e}"))
        })
        .collect();
    let mut described = Vec::new();
    for (rank, result) in results.iter().enumerate() {
        let mut result = result.clone();
        described.push(result.as_object_mut().unwrap().remove("described").unwrap());
        assert_eq!(described[rank]["rank"], rank);
        assert_eq!(
            described[rank]["payloads"],
            json!([
                "hello from rank 0",
                "hello from rank 1",
                "hello from rank 2",
                "hello from rank 3"
            ])
        );
        assert_eq!(
            result,
            json!({
                "sum_f32_bits": 0.5f32.to_bits(),
                "max_f32": 4.5,
                "sum_f64_bits": 0.25f64.to_bits(),
                "big_ok": true,
                "gathered": [0.0, 0.0, 1.0, 10.0, 2.0, 20.0, 3.0, 30.0],
                "ragged": [[], [1, 1, 1], [2, 2, 2, 2, 2, 2], [3, 3, 3, 3, 3, 3, 3, 3, 3]],
                "broadcast": "from rank 2",
                // sum over ranks of i * (r + 1) = 10 i; rank r keeps i = 2r, 2r + 1.
                "scattered": [20.0 * rank as f64, 10.0 * (2 * rank + 1) as f64],
                // sum over ranks of (i + r) = 4 i + 6.
                "tensor": [6.0, 10.0, 14.0, 18.0, 22.0, 26.0],
            }),
            "rank {rank}"
        );
    }
    described
}

#[test]
fn four_processes_meet_and_run_every_collective() {
    let started = Instant::now();
    let deadline = started + SCENARIO_LIMIT;
    let port = free_port();
    // Started in reverse, so the other ranks wait for rank 0 to listen.
    let mut ranks = start_all(
        "collectives",
        |r| torchrun_vars(r, 4, port, &[]),
        &[3, 2, 1, 0],
    );
    ranks.reverse();
    let described = check_collectives(&mut ranks, deadline);
    for (r, d) in described.iter().enumerate() {
        assert_eq!(
            d["group"],
            format!("torchrun: rank {r} of 4 (local 0 of 1, node {r}), rendezvous at 127.0.0.1:{port} (MASTER_PORT)")
        );
    }
    for rank in &mut ranks {
        assert_eq!(rank.exit_code(deadline), Some(0));
    }
    eprintln!("four processes: {:.2} s", started.elapsed().as_secs_f64());
}

#[test]
fn slurm_variables_resolve_to_the_same_group() {
    let started = Instant::now();
    let deadline = started + SCENARIO_LIMIT;
    let port = free_port();
    let slurm = |r: usize| {
        let (r, port) = (r.to_string(), port.to_string());
        vars(&[
            ("SLURM_PROCID", &r),
            ("SLURM_NTASKS", "4"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_NODEID", &r),
            ("SLURM_TASKS_PER_NODE", "1(x4)"),
            // The first host of the job's list is rank 0's: here the loopback host.
            ("SLURM_JOB_NODELIST", "localhost,gpu-[02-03,07]"),
            ("SLURM_NODELIST", "localhost,gpu-[02-03,07]"),
            ("MASTER_PORT", &port),
            ("SWERVE_RDZV_TIMEOUT_S", "20"),
        ])
    };
    let mut ranks = start_all("collectives", slurm, &[0, 1, 2, 3]);
    let described = check_collectives(&mut ranks, deadline);
    for (r, d) in described.iter().enumerate() {
        assert_eq!(d["source"], "slurm");
        assert_eq!(
            (
                &d["world_size"],
                &d["local_rank"],
                &d["local_world_size"],
                &d["node_rank"]
            ),
            (&json!(4), &json!(0), &json!(1), &json!(r))
        );
        assert_eq!(
            (&d["master_addr"], &d["master_port"]),
            (&json!("localhost"), &json!(port))
        );
    }
    eprintln!("slurm: {:.2} s", started.elapsed().as_secs_f64());
}

#[test]
fn a_rank_that_never_starts_is_named_by_the_others() {
    let started = Instant::now();
    let deadline = started + SCENARIO_LIMIT;
    let port = free_port();
    let short = |r| torchrun_vars(r, 3, port, &[("SWERVE_RDZV_TIMEOUT_S", "1.5")]);
    let mut ranks = start_all("collectives", short, &[0, 1]);
    let expected = format!("rank 0 waited 1.5 s for ranks [2] of 3 to arrive at 127.0.0.1:{port}");
    for rank in &mut ranks {
        let error = rank.outcome(deadline).unwrap_err();
        assert_eq!(error, expected, "rank {}", rank.rank);
    }
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    eprintln!("missing rank: {:.2} s", started.elapsed().as_secs_f64());
}

/// Starts 3 ranks in `role` with `victim`, waits until all have passed their first barrier, lets
/// `kill` act on the victim, and returns the survivors' errors and the time from the kill to
/// the last error.
fn failure_scenario(role: &str, victim: usize, kill: bool) -> (Vec<String>, Duration) {
    let deadline = Instant::now() + SCENARIO_LIMIT;
    let port = free_port();
    let victim_var = victim.to_string();
    let with_victim = |r| torchrun_vars(r, 3, port, &[(VICTIM, victim_var.as_str())]);
    let mut ranks = start_all(role, with_victim, &[0, 1, 2]);
    for rank in &mut ranks {
        rank.wait_for(&["DIST-READY"], deadline);
    }
    let since = Instant::now();
    if kill {
        // Give the survivors time to enter their barrier, so the kill lands while they wait.
        std::thread::sleep(Duration::from_millis(200));
        ranks[victim].child.kill().unwrap();
    }
    let mut errors = Vec::new();
    for rank in ranks.iter_mut().filter(|r| r.rank != victim) {
        errors.push(rank.outcome(deadline).unwrap_err());
        assert_eq!(rank.exit_code(deadline), Some(0));
    }
    let code = ranks[victim].exit_code(deadline);
    assert_eq!(code, if kill { None } else { Some(3) }, "the victim's exit");
    (errors, since.elapsed())
}

#[test]
fn a_rank_that_exits_after_the_rendezvous_fails_the_next_collective() {
    let (errors, took) = failure_scenario("exit_after_barrier", 2, false);
    for error in &errors {
        assert!(
            error.ends_with(
                "rank 2 of 3 left the group (its connection closed: it failed or stopped)"
            ),
            "{error}"
        );
    }
    // Both survivors report the same cause.
    assert_eq!(errors[0], errors[1]);
    // The collective timeout is 60 s: this was the closed connection, not a timeout.
    assert!(took < Duration::from_secs(10), "{took:?}");
    eprintln!(
        "rank 2 exits: {:.2} s after the first barrier",
        took.as_secs_f64()
    );
}

#[test]
fn a_killed_rank_fails_the_collective_the_others_wait_in() {
    let (errors, took) = failure_scenario("killed_in_collective", 1, true);
    for error in &errors {
        assert_eq!(
            error,
            "collective #2 (barrier): rank 1 of 3 left the group (its connection closed: it failed \
             or stopped)"
        );
    }
    assert!(took < Duration::from_secs(10), "{took:?}");
    let (errors, took) = failure_scenario("killed_in_collective", 0, true);
    for error in &errors {
        assert_eq!(
            error,
            "collective #2 (barrier): rank 0 of 3 left the group (its connection closed: it failed \
             or stopped)"
        );
    }
    assert!(took < Duration::from_secs(10), "{took:?}");
    eprintln!("kills: {:.2} s", took.as_secs_f64());
}
