//! The process group a launcher started this process in, read from the environment.
//!
//! Launch model: **one process per node, driving that node's GPUs with a thread per GPU.** Tensor
//! parallelism always stays inside a process (threads and in-process or NCCL communicators);
//! processes meet only for data parallelism (the gradient all-reduce, ZeRO-1) and to exchange
//! NCCL unique ids. So the group read here counts processes, that is nodes: 16 nodes of 8 GPUs are
//! a group of 16. Two launchers fit, and a plain shell does too:
//!
//! | variables | launcher |
//! | --- | --- |
//! | `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT` (`GROUP_RANK` or `NODE_RANK`: the node, for logs only) | torchrun (`--nnodes 16 --nproc-per-node 1 --no-python swerve-train ...`), or set by hand (Kubernetes) |
//! | `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`, `SLURM_NODEID`, `SLURM_STEP_TASKS_PER_NODE` or `SLURM_TASKS_PER_NODE`; `MASTER_ADDR` or else the first host of `SLURM_JOB_NODELIST` / `SLURM_NODELIST`; `MASTER_PORT` | `srun`, one task per node |
//! | none of them | a group of one process |
//!
//! torchrun's variables win where both are set (torchrun started under `srun`). Rank 0's
//! rendezvous ([`super::rendezvous`]) listens on `MASTER_PORT`, [`DEFAULT_PORT`] when unset,
//! except that:
//! - `SWERVE_RDZV_PORT` overrides the port for every launcher;
//! - under torchrun with `TORCHELASTIC_USE_AGENT_STORE=True` (its static launch, and its c10d
//!   launch since PyTorch 2.4), torchrun's own agent already listens on `MASTER_PORT` on the
//!   first node (its TCPStore), so swerve takes `MASTER_PORT + 1`.
//!
//! Timeouts: `SWERVE_RDZV_TIMEOUT_S` (default [`DEFAULT_RENDEZVOUS_TIMEOUT`]: how long the
//! processes may take to start and meet) and `SWERVE_COLLECTIVE_TIMEOUT_S` (default
//! [`DEFAULT_COLLECTIVE_TIMEOUT`]: how long a collective waits for data from a process that is
//! alive but silent; a process that exits or is killed fails the others at once).
//!
//! A malformed or inconsistent value is an error naming the variable and its value, never a
//! panic.

use super::slurm_lists::{first_host, tasks_on_node};
use anyhow::{bail, Context, Result};
use std::fmt;
use std::time::Duration;

/// The rendezvous port when neither `MASTER_PORT` nor `SWERVE_RDZV_PORT` is set (torchrun's).
pub const DEFAULT_PORT: u16 = 29500;
/// How long ranks may take to start and find each other (`SWERVE_RDZV_TIMEOUT_S`).
pub const DEFAULT_RENDEZVOUS_TIMEOUT: Duration = Duration::from_secs(300);
/// How long a collective waits for a silent, live process (`SWERVE_COLLECTIVE_TIMEOUT_S`); longer
/// than anything one process does alone between collectives (a checkpoint write).
pub const DEFAULT_COLLECTIVE_TIMEOUT: Duration = Duration::from_secs(1800);

/// Which launcher's variables described the group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LaunchSource {
    /// torchrun's `RANK` / `WORLD_SIZE` (or the same variables set by hand).
    Torchrun,
    /// Slurm's `SLURM_PROCID` / `SLURM_NTASKS` (`srun`).
    Slurm,
    /// Neither: this process alone.
    Single,
}

impl LaunchSource {
    pub fn as_str(self) -> &'static str {
        match self {
            LaunchSource::Torchrun => "torchrun",
            LaunchSource::Slurm => "slurm",
            LaunchSource::Single => "single",
        }
    }
}

/// This process's place in the group of processes (one per node), and where the group meets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessGroupEnv {
    pub source: LaunchSource,
    /// This process's index, `0..world_size`.
    pub rank: usize,
    /// Processes in the group (nodes, in swerve's launch model).
    pub world_size: usize,
    /// This process's index among the processes of its node (0 in swerve's launch model).
    pub local_rank: usize,
    /// Processes on this node (1 in swerve's launch model).
    pub local_world_size: usize,
    /// This node's index (`GROUP_RANK`, `NODE_RANK` or `SLURM_NODEID`), for logs only.
    pub node_rank: Option<usize>,
    /// Rank 0's host name or address (without brackets for IPv6).
    pub master_addr: String,
    /// The port rank 0's rendezvous listens on.
    pub master_port: u16,
    /// Where `master_port` came from, for logs and errors: `MASTER_PORT`, `SWERVE_RDZV_PORT`, ...
    pub port_from: &'static str,
    pub rendezvous_timeout: Duration,
    pub collective_timeout: Duration,
}

impl ProcessGroupEnv {
    /// A group of this process alone.
    pub fn single() -> Self {
        ProcessGroupEnv {
            source: LaunchSource::Single,
            rank: 0,
            world_size: 1,
            local_rank: 0,
            local_world_size: 1,
            node_rank: None,
            master_addr: "127.0.0.1".into(),
            master_port: DEFAULT_PORT,
            port_from: "default",
            rendezvous_timeout: DEFAULT_RENDEZVOUS_TIMEOUT,
            collective_timeout: DEFAULT_COLLECTIVE_TIMEOUT,
        }
    }

    /// The group described by this process's environment (see the module doc).
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(|name| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned()))
    }

    /// The group described by `var` (a variable's value, `None` when unset): [`Self::from_env`]
    /// over any source of variables.
    pub fn from_lookup(var: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let var = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        let mut group = if var("RANK").is_some() || var("WORLD_SIZE").is_some() {
            torchrun(&var)?
        } else if var("SLURM_PROCID").is_some() {
            slurm(&var)?
        } else {
            ProcessGroupEnv::single()
        };
        if let Some(port) = var("SWERVE_RDZV_PORT") {
            group.master_port = parse_port("SWERVE_RDZV_PORT", &port)?;
            group.port_from = "SWERVE_RDZV_PORT";
        }
        if let Some(value) = var("SWERVE_RDZV_TIMEOUT_S") {
            group.rendezvous_timeout = parse_seconds("SWERVE_RDZV_TIMEOUT_S", &value)?;
        }
        if let Some(value) = var("SWERVE_COLLECTIVE_TIMEOUT_S") {
            group.collective_timeout = parse_seconds("SWERVE_COLLECTIVE_TIMEOUT_S", &value)?;
        }
        Ok(group)
    }

    /// `host:port` of rank 0's rendezvous (IPv6 addresses in brackets).
    pub fn rendezvous_address(&self) -> String {
        if self.master_addr.contains(':') {
            format!("[{}]:{}", self.master_addr, self.master_port)
        } else {
            format!("{}:{}", self.master_addr, self.master_port)
        }
    }

    /// An error unless this is the only process of its node: swerve drives all of a node's GPUs
    /// from one process, so two processes on one node would compete for them.
    pub fn ensure_one_process_per_node(&self) -> Result<()> {
        if self.local_world_size > 1 {
            let how = match self.source {
                LaunchSource::Slurm => "srun --ntasks-per-node=1",
                _ => "torchrun --nproc-per-node 1",
            };
            bail!(
                "{} processes on this node ({}): swerve runs one process per node and a thread \
                 per GPU; launch with {how}",
                self.local_world_size,
                self
            );
        }
        Ok(())
    }
}

/// One line for logs: `torchrun: rank 3 of 16 (local 0 of 1, node 3), rendezvous at
/// 10.0.0.1:29500 (MASTER_PORT)`.
impl fmt::Display for ProcessGroupEnv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: rank {} of {} (local {} of {}",
            self.source.as_str(),
            self.rank,
            self.world_size,
            self.local_rank,
            self.local_world_size
        )?;
        if let Some(node) = self.node_rank {
            write!(f, ", node {node}")?;
        }
        write!(f, ")")?;
        if self.world_size > 1 {
            write!(
                f,
                ", rendezvous at {} ({})",
                self.rendezvous_address(),
                self.port_from
            )?;
        }
        Ok(())
    }
}

type Var<'a> = &'a dyn Fn(&str) -> Option<String>;

fn torchrun(var: Var) -> Result<ProcessGroupEnv> {
    let (rank, world_size) = match (var("RANK"), var("WORLD_SIZE")) {
        (Some(rank), Some(world)) => (
            parse_count("RANK", &rank)?,
            parse_count("WORLD_SIZE", &world)?,
        ),
        (Some(rank), None) => bail!("RANK={rank} is set but WORLD_SIZE is not"),
        (None, Some(world)) => bail!("WORLD_SIZE={world} is set but RANK is not"),
        (None, None) => unreachable!("torchrun's variables are read only when one is set"),
    };
    check_rank(("RANK", rank), ("WORLD_SIZE", world_size))?;
    let local_rank = optional_count(var, "LOCAL_RANK")?.unwrap_or(0);
    let local_world_size = optional_count(var, "LOCAL_WORLD_SIZE")?.unwrap_or(1);
    check_local(
        ("LOCAL_RANK", local_rank),
        ("LOCAL_WORLD_SIZE", local_world_size),
        ("WORLD_SIZE", world_size),
    )?;
    let node_rank = match optional_count(var, "GROUP_RANK")? {
        Some(node) => Some(node),
        None => optional_count(var, "NODE_RANK")?,
    };
    let master_addr = match var("MASTER_ADDR") {
        Some(addr) => parse_host("MASTER_ADDR", &addr)?,
        None if world_size > 1 => bail!(
            "WORLD_SIZE={world_size} needs MASTER_ADDR, rank 0's host name or address (torchrun \
             sets it; set it by hand otherwise)"
        ),
        None => "127.0.0.1".into(),
    };
    let (mut master_port, mut port_from) = (DEFAULT_PORT, "default");
    if let Some(port) = var("MASTER_PORT") {
        master_port = parse_port("MASTER_PORT", &port)?;
        port_from = "MASTER_PORT";
        if var("TORCHELASTIC_USE_AGENT_STORE").as_deref() == Some("True") {
            // torchrun's agent on the first node listens on MASTER_PORT itself.
            master_port = master_port.checked_add(1).with_context(|| {
                format!(
                    "MASTER_PORT={port} is torchrun's own store (TORCHELASTIC_USE_AGENT_STORE=\
                     True) and swerve would take the next port, which does not exist: set \
                     SWERVE_RDZV_PORT"
                )
            })?;
            port_from = "MASTER_PORT + 1: torchrun's agent holds MASTER_PORT";
        }
    }
    Ok(ProcessGroupEnv {
        source: LaunchSource::Torchrun,
        rank,
        world_size,
        local_rank,
        local_world_size,
        node_rank,
        master_addr,
        master_port,
        port_from,
        ..ProcessGroupEnv::single()
    })
}

fn slurm(var: Var) -> Result<ProcessGroupEnv> {
    let procid = var("SLURM_PROCID").expect("read only when set");
    let rank = parse_count("SLURM_PROCID", &procid)?;
    let world_size = match var("SLURM_NTASKS") {
        Some(n) => parse_count("SLURM_NTASKS", &n)?,
        None => bail!("SLURM_PROCID={procid} is set but SLURM_NTASKS is not"),
    };
    check_rank(("SLURM_PROCID", rank), ("SLURM_NTASKS", world_size))?;
    let local_rank = optional_count(var, "SLURM_LOCALID")?.unwrap_or(0);
    let node_rank = optional_count(var, "SLURM_NODEID")?;
    let per_node = ["SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"]
        .into_iter()
        .find_map(|name| var(name).map(|value| (name, value)));
    let (local_world_size, counted) = match (per_node, node_rank) {
        (Some((name, spec)), Some(node)) => (
            tasks_on_node(&spec, node)
                .with_context(|| format!("{name}={spec} (SLURM_NODEID={node})"))?,
            format!("{name}={spec}, SLURM_NODEID={node}"),
        ),
        _ => (
            1,
            "1 assumed: no SLURM_TASKS_PER_NODE and SLURM_NODEID".into(),
        ),
    };
    if local_rank >= local_world_size {
        bail!(
            "SLURM_LOCALID={local_rank} is not below this node's task count {local_world_size} \
             ({counted})"
        );
    }
    if local_world_size > world_size {
        bail!("{local_world_size} tasks on this node ({counted}) but SLURM_NTASKS={world_size}");
    }
    let master_addr = if let Some(addr) = var("MASTER_ADDR") {
        parse_host("MASTER_ADDR", &addr)?
    } else if let Some((name, list)) = ["SLURM_JOB_NODELIST", "SLURM_NODELIST"]
        .into_iter()
        .find_map(|name| var(name).map(|value| (name, value)))
    {
        first_host(&list).with_context(|| format!("{name}={list}"))?
    } else if world_size > 1 {
        bail!(
            "SLURM_NTASKS={world_size} needs rank 0's address: set MASTER_ADDR, or run under srun, \
             which sets SLURM_JOB_NODELIST"
        )
    } else {
        "127.0.0.1".into()
    };
    let (master_port, port_from) = match var("MASTER_PORT") {
        Some(port) => (parse_port("MASTER_PORT", &port)?, "MASTER_PORT"),
        None => (DEFAULT_PORT, "default"),
    };
    Ok(ProcessGroupEnv {
        source: LaunchSource::Slurm,
        rank,
        world_size,
        local_rank,
        local_world_size,
        node_rank,
        master_addr,
        master_port,
        port_from,
        ..ProcessGroupEnv::single()
    })
}

fn parse_count(name: &str, value: &str) -> Result<usize> {
    match value.trim().parse::<usize>() {
        Ok(n) => Ok(n),
        Err(_) => bail!("{name}={value} is not a whole number"),
    }
}

fn optional_count(var: Var, name: &str) -> Result<Option<usize>> {
    var(name).map(|v| parse_count(name, &v)).transpose()
}

fn check_rank((rank_name, rank): (&str, usize), (size_name, size): (&str, usize)) -> Result<()> {
    if size == 0 {
        bail!("{size_name}=0: a group needs at least one process");
    }
    if rank >= size {
        bail!("{rank_name}={rank} is not below {size_name}={size}");
    }
    Ok(())
}

fn check_local(
    (rank_name, rank): (&str, usize),
    (size_name, size): (&str, usize),
    (world_name, world): (&str, usize),
) -> Result<()> {
    check_rank((rank_name, rank), (size_name, size))?;
    if size > world {
        bail!("{size_name}={size} is more than {world_name}={world}");
    }
    Ok(())
}

fn parse_port(name: &str, value: &str) -> Result<u16> {
    match value.trim().parse::<u16>() {
        Ok(port) if port > 0 => Ok(port),
        _ => bail!("{name}={value} is not a TCP port (1 to 65535)"),
    }
}

fn parse_seconds(name: &str, value: &str) -> Result<Duration> {
    match value.trim().parse::<f64>() {
        Ok(s) if s > 0.0 && s.is_finite() && s < 1e9 => Ok(Duration::from_secs_f64(s)),
        _ => bail!("{name}={value} is not a positive number of seconds"),
    }
}

/// A host name or address, IPv6 brackets removed.
fn parse_host(name: &str, value: &str) -> Result<String> {
    let host = value.trim();
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if host.is_empty() || host.contains(|c: char| c.is_whitespace() || c == '/') {
        bail!("{name}={value} is not a host name or address");
    }
    Ok(host.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn group(vars: &[(&str, &str)]) -> Result<ProcessGroupEnv> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        ProcessGroupEnv::from_lookup(|name| vars.get(name).cloned())
    }

    fn error(vars: &[(&str, &str)]) -> String {
        format!("{:#}", group(vars).unwrap_err())
    }

    #[test]
    fn torchrun_variables() {
        let g = group(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "16"),
            ("LOCAL_RANK", "0"),
            ("LOCAL_WORLD_SIZE", "1"),
            ("GROUP_RANK", "3"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "29400"),
        ])
        .unwrap();
        assert_eq!(
            (
                g.source,
                g.rank,
                g.world_size,
                g.local_rank,
                g.local_world_size
            ),
            (LaunchSource::Torchrun, 3, 16, 0, 1)
        );
        assert_eq!((g.node_rank, g.master_addr.as_str()), (Some(3), "10.0.0.1"));
        assert_eq!((g.master_port, g.port_from), (29400, "MASTER_PORT"));
        assert_eq!(g.rendezvous_timeout, DEFAULT_RENDEZVOUS_TIMEOUT);
        assert_eq!(
            g.to_string(),
            "torchrun: rank 3 of 16 (local 0 of 1, node 3), rendezvous at 10.0.0.1:29400 \
             (MASTER_PORT)"
        );
        g.ensure_one_process_per_node().unwrap();
    }

    #[test]
    fn nothing_set_is_a_single_process() {
        let g = group(&[("MASTER_ADDR", "10.0.0.1"), ("LOCAL_RANK", "")]).unwrap();
        assert_eq!(g, ProcessGroupEnv::single());
        assert_eq!(g.to_string(), "single: rank 0 of 1 (local 0 of 1)");
        // One process alone needs no address.
        let g = group(&[("RANK", "0"), ("WORLD_SIZE", "1")]).unwrap();
        assert_eq!((g.world_size, g.master_addr.as_str()), (1, "127.0.0.1"));
    }

    #[test]
    fn ports_and_timeouts() {
        let base = [("RANK", "1"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "node0")];
        let g = group(&base).unwrap();
        assert_eq!((g.master_port, g.port_from), (DEFAULT_PORT, "default"));
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut vars = base.to_vec();
            vars.extend_from_slice(extra);
            group(&vars)
        };
        let g = with(&[
            ("MASTER_PORT", "29500"),
            ("TORCHELASTIC_USE_AGENT_STORE", "True"),
        ])
        .unwrap();
        assert_eq!(g.master_port, 29501);
        assert!(g.to_string().contains("torchrun's agent holds MASTER_PORT"));
        let g = with(&[
            ("MASTER_PORT", "29500"),
            ("TORCHELASTIC_USE_AGENT_STORE", "False"),
        ])
        .unwrap();
        assert_eq!(g.master_port, 29500);
        let g = with(&[
            ("MASTER_PORT", "29500"),
            ("TORCHELASTIC_USE_AGENT_STORE", "True"),
            ("SWERVE_RDZV_PORT", "4000"),
            ("SWERVE_RDZV_TIMEOUT_S", "2.5"),
            ("SWERVE_COLLECTIVE_TIMEOUT_S", "60"),
        ])
        .unwrap();
        assert_eq!((g.master_port, g.port_from), (4000, "SWERVE_RDZV_PORT"));
        assert_eq!(g.rendezvous_timeout, Duration::from_millis(2500));
        assert_eq!(g.collective_timeout, Duration::from_secs(60));
        let message = format!(
            "{:#}",
            with(&[
                ("MASTER_PORT", "65535"),
                ("TORCHELASTIC_USE_AGENT_STORE", "True")
            ])
            .unwrap_err()
        );
        assert!(message.contains("SWERVE_RDZV_PORT"), "{message}");
        let g = with(&[("MASTER_ADDR", "[fe80::1]"), ("MASTER_PORT", "7")]).unwrap();
        assert_eq!(g.master_addr, "fe80::1");
        assert_eq!(g.rendezvous_address(), "[fe80::1]:7");
    }

    fn check_errors(cases: &[(&[(&str, &str)], &str)]) {
        for (vars, expected) in cases {
            let message = error(vars);
            assert!(message.contains(expected), "{vars:?}: {message}");
        }
    }

    #[test]
    fn malformed_and_inconsistent_torchrun_values_name_the_variable() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (
                &[("RANK", "4"), ("WORLD_SIZE", "4")],
                "RANK=4 is not below WORLD_SIZE=4",
            ),
            (
                &[("RANK", "x1"), ("WORLD_SIZE", "4")],
                "RANK=x1 is not a whole number",
            ),
            (
                &[("RANK", "-1"), ("WORLD_SIZE", "4")],
                "RANK=-1 is not a whole number",
            ),
            (&[("RANK", "0"), ("WORLD_SIZE", "0")], "WORLD_SIZE=0"),
            (&[("RANK", "1")], "RANK=1 is set but WORLD_SIZE is not"),
            (
                &[("WORLD_SIZE", "2")],
                "WORLD_SIZE=2 is set but RANK is not",
            ),
            (
                &[("RANK", "1"), ("WORLD_SIZE", "2")],
                "WORLD_SIZE=2 needs MASTER_ADDR",
            ),
            (
                &[("RANK", "1"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "a b")],
                "MASTER_ADDR=a b is not a host name",
            ),
            (
                &[
                    ("RANK", "0"),
                    ("WORLD_SIZE", "2"),
                    ("MASTER_ADDR", "h"),
                    ("MASTER_PORT", "70000"),
                ],
                "MASTER_PORT=70000 is not a TCP port",
            ),
            (
                &[
                    ("RANK", "0"),
                    ("WORLD_SIZE", "2"),
                    ("MASTER_ADDR", "h"),
                    ("MASTER_PORT", "0"),
                ],
                "MASTER_PORT=0 is not a TCP port",
            ),
            (
                &[
                    ("RANK", "0"),
                    ("WORLD_SIZE", "2"),
                    ("MASTER_ADDR", "h"),
                    ("LOCAL_RANK", "1"),
                    ("LOCAL_WORLD_SIZE", "1"),
                ],
                "LOCAL_RANK=1 is not below LOCAL_WORLD_SIZE=1",
            ),
            (
                &[
                    ("RANK", "0"),
                    ("WORLD_SIZE", "2"),
                    ("MASTER_ADDR", "h"),
                    ("LOCAL_WORLD_SIZE", "3"),
                ],
                "LOCAL_WORLD_SIZE=3 is more than WORLD_SIZE=2",
            ),
            (
                &[
                    ("RANK", "0"),
                    ("WORLD_SIZE", "2"),
                    ("MASTER_ADDR", "h"),
                    ("GROUP_RANK", "one"),
                ],
                "GROUP_RANK=one is not a whole number",
            ),
            (
                &[
                    ("RANK", "0"),
                    ("WORLD_SIZE", "1"),
                    ("SWERVE_RDZV_TIMEOUT_S", "-3"),
                ],
                "SWERVE_RDZV_TIMEOUT_S=-3 is not a positive number of seconds",
            ),
        ];
        check_errors(cases);
    }

    #[test]
    fn malformed_and_inconsistent_slurm_values_name_the_variable() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (
                &[("SLURM_PROCID", "2")],
                "SLURM_PROCID=2 is set but SLURM_NTASKS is not",
            ),
            (
                &[("SLURM_PROCID", "2"), ("SLURM_NTASKS", "2")],
                "SLURM_PROCID=2 is not below SLURM_NTASKS=2",
            ),
            (
                &[("SLURM_PROCID", "1"), ("SLURM_NTASKS", "2")],
                "SLURM_NTASKS=2 needs rank 0's address",
            ),
            (
                &[
                    ("SLURM_PROCID", "1"),
                    ("SLURM_NTASKS", "2"),
                    ("SLURM_JOB_NODELIST", "gpu-[01-02"),
                ],
                "SLURM_JOB_NODELIST=gpu-[01-02: host list `gpu-[01-02`: unbalanced brackets",
            ),
            (
                &[
                    ("SLURM_PROCID", "1"),
                    ("SLURM_NTASKS", "2"),
                    ("SLURM_NODELIST", "n1"),
                    ("SLURM_LOCALID", "1"),
                ],
                "SLURM_LOCALID=1 is not below this node's task count 1 (1 assumed",
            ),
            (
                &[
                    ("SLURM_PROCID", "1"),
                    ("SLURM_NTASKS", "2"),
                    ("SLURM_NODELIST", "n1"),
                    ("SLURM_NODEID", "2"),
                    ("SLURM_TASKS_PER_NODE", "1(x2)"),
                ],
                "SLURM_TASKS_PER_NODE=1(x2) (SLURM_NODEID=2): no task count for node 2",
            ),
        ];
        check_errors(cases);
    }

    #[test]
    fn slurm_variables() {
        let g = group(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "16"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_NODEID", "5"),
            ("SLURM_TASKS_PER_NODE", "1(x16)"),
            ("SLURM_JOB_NODELIST", "gpu-[01-04,07],login1"),
            ("SLURM_NODELIST", "ignored"),
        ])
        .unwrap();
        assert_eq!(
            (
                g.source,
                g.rank,
                g.world_size,
                g.local_rank,
                g.local_world_size
            ),
            (LaunchSource::Slurm, 5, 16, 0, 1)
        );
        assert_eq!((g.node_rank, g.master_addr.as_str()), (Some(5), "gpu-01"));
        assert_eq!((g.master_port, g.port_from), (DEFAULT_PORT, "default"));
        assert_eq!(
            g.to_string(),
            "slurm: rank 5 of 16 (local 0 of 1, node 5), rendezvous at gpu-01:29500 (default)"
        );
        // MASTER_ADDR and MASTER_PORT win; SLURM_NODELIST when the job's list is missing; two
        // tasks on a node are described, and refused by the one-process-per-node check.
        let g = group(&[
            ("SLURM_PROCID", "3"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_NODEID", "1"),
            ("SLURM_STEP_TASKS_PER_NODE", "2(x2)"),
            ("SLURM_NODELIST", "a[3-4]"),
            ("MASTER_PORT", "1234"),
        ])
        .unwrap();
        assert_eq!((g.local_rank, g.local_world_size), (1, 2));
        assert_eq!((g.master_addr.as_str(), g.master_port), ("a3", 1234));
        let message = format!("{:#}", g.ensure_one_process_per_node().unwrap_err());
        assert!(message.contains("srun --ntasks-per-node=1"), "{message}");
        let g = group(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_NODELIST", "a[3-4]"),
            ("MASTER_ADDR", "10.1.1.1"),
        ])
        .unwrap();
        assert_eq!(g.master_addr, "10.1.1.1");
        // torchrun under srun: torchrun's variables describe this process.
        let g = group(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "h"),
        ])
        .unwrap();
        assert_eq!((g.source, g.rank), (LaunchSource::Torchrun, 1));
    }
}
