//! Running one task on every rank of this process's part of a `dp x tp` grid: a thread per rank
//! (a GPU each, or a share of the CPU cores), each with its own backend and its tensor- and
//! data-parallel groups (DESIGN.md decision 11; the launch model is [`super::launch`]'s: one
//! process per node).
//!
//! ```text
//!  process p of W (a node)            threads: replica-major, tp ranks inside a replica
//!  ┌──────────────────────────────┐   tp group    = the replica's ranks   (in-process: LocalComm)
//!  │ replica 0: tp0 tp1 ... tpN-1 │   dp group    = tp rank r of every replica of every process:
//!  │ replica 1: tp0 tp1 ... tpN-1 │                 LocalComm here, nested over TCP between the
//!  └──────────────────────────────┘                 processes ([`Nested`]) when W > 1
//! ```
//!
//! On GPUs the groups compute with NCCL (their unique ids carried by these host groups) where
//! libnccl is found. Global replica index: `p * dp_local + j`. The data-parallel group of tp rank `r` meets across
//! processes at rendezvous port `MASTER_PORT + 1 + r` (the process group itself uses the base
//! port for the run's own exchanges).

use super::launch::ProcessGroupEnv;
use super::local::LocalGroup;
use super::tcp::TcpComm;
use super::{Collectives, Communicator};
use crate::backend::cpu::CpuBackend;
use crate::backend::{BackendGrad, CudaBackend, DeviceChoice, Selected};
use anyhow::{anyhow, bail, Result};
use std::sync::Arc;

/// The groups one rank computes with: its tensor-parallel group (the model's shards) and its
/// data-parallel group (this shard in every replica).
pub struct Groups<B: BackendGrad> {
    pub tp: Arc<dyn Communicator<B>>,
    pub dp: Arc<dyn Communicator<B>>,
}

impl<B: BackendGrad> Groups<B> {
    /// One rank, one replica.
    pub fn solo() -> Self {
        Self {
            tp: Arc::new(super::Solo),
            dp: Arc::new(super::Solo),
        }
    }

    /// The rank that writes files: tensor-parallel rank 0 of replica 0.
    pub fn is_writer(&self) -> bool {
        self.tp.rank() == 0 && self.dp.rank() == 0
    }
}

/// How this process's ranks are laid out: `tp` ranks per replica, `dp_local` replicas here, and
/// the process group (the same layout in every process).
#[derive(Clone, Debug)]
pub struct GridSpec {
    pub tp: usize,
    pub dp_local: usize,
    pub process: ProcessGroupEnv,
}

impl GridSpec {
    /// One rank in one process.
    pub fn single() -> Self {
        Self {
            tp: 1,
            dp_local: 1,
            process: ProcessGroupEnv::single(),
        }
    }

    pub fn is_single(&self) -> bool {
        self.tp * self.dp_local * self.process.world_size == 1
    }

    /// Replicas in the whole run.
    pub fn replicas(&self) -> usize {
        self.dp_local * self.process.world_size
    }

    /// `"tensor-parallel 2 x data-parallel 4 (2 here x 2 processes)"`, for logs.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "tensor-parallel {} x data-parallel {}",
            self.tp,
            self.replicas()
        );
        if self.process.world_size > 1 {
            s += &format!(
                " ({} here x {} processes; {})",
                self.dp_local, self.process.world_size, self.process
            );
        }
        s
    }
}

/// Where one rank sits in the grid (all 0 for a single rank).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RankPlace {
    pub tp_rank: usize,
    /// Global replica index.
    pub replica: usize,
    /// This rank's index among the process's threads (its GPU's ordinal).
    pub local_index: usize,
}

/// How a rank's backend computes collectives with the members of a host group (an in-process
/// [`super::local::LocalComm`], or a [`Nested`] group spanning processes): on GPUs NCCL, whose
/// unique id the host group carries, where libnccl is found; through host memory otherwise.
pub trait RankComm: crate::backend::Backend + Sized {
    fn rank_comm<C: Communicator<Self> + 'static>(
        &self,
        host: C,
    ) -> Result<Arc<dyn Communicator<Self>>>;
}

impl RankComm for CpuBackend {
    fn rank_comm<C: Communicator<Self> + 'static>(
        &self,
        host: C,
    ) -> Result<Arc<dyn Communicator<Self>>> {
        Ok(Arc::new(host))
    }
}

impl RankComm for CudaBackend {
    fn rank_comm<C: Communicator<Self> + 'static>(
        &self,
        host: C,
    ) -> Result<Arc<dyn Communicator<Self>>> {
        if host.size() == 1 {
            return Ok(Arc::new(host));
        }
        // Whether libnccl loads is the same for every rank of a process, and every process runs
        // the same build: all ranks of a group take the same path.
        match super::nccl::probe() {
            Ok(_) => Ok(Arc::new(super::nccl::NcclComm::init(self, &host)?)),
            Err(e) => {
                if host.rank() == 0 {
                    eprintln!("warning: {e:#}; collectives go through host memory (slow)");
                }
                Ok(Arc::new(host))
            }
        }
    }
}

/// What every rank runs (SPMD): generic over the backend, which each rank makes for itself.
pub trait RankTask: Sync {
    type Output: Send;
    fn run<B: BackendGrad + 'static>(
        &self,
        backend: &B,
        groups: Groups<B>,
        place: RankPlace,
    ) -> Result<Self::Output>;
}

/// Runs `task` on every rank of this process's part of the grid, on `device`'s backend kind
/// (chosen once, here: the line saying which is printed), and returns each rank's output in
/// rank order, or the first rank's error that is not another rank's departure.
pub fn run_grid<T: RankTask>(
    device: DeviceChoice,
    spec: &GridSpec,
    task: &T,
) -> Result<Vec<T::Output>> {
    let ranks = spec.tp * spec.dp_local;
    let (selected, line) = crate::backend::select(device)?;
    eprintln!("{line}");
    if spec.process.world_size > 1 || ranks > 1 {
        eprintln!("ranks: {}", spec.describe());
    }
    match selected {
        Selected::Cpu(cpu) => {
            let cores = cpu.threads();
            let per_rank = (cores / ranks).max(1);
            spawn(spec, task, |_| Ok(CpuBackend::with_threads(per_rank)))
        }
        Selected::Cuda(first) => {
            let devices = first.device_count()?;
            let emulated = crate::backend::cuda::is_emulated();
            if ranks > devices && !emulated {
                bail!(
                    "{} ranks on this node need {ranks} GPUs; the driver reports {devices}",
                    spec.describe()
                );
            }
            drop(first);
            spawn(spec, task, |index| {
                CudaBackend::open(if emulated { index % devices } else { index })
            })
        }
    }
}

fn spawn<B: BackendGrad + RankComm + 'static, T: RankTask>(
    spec: &GridSpec,
    task: &T,
    make_backend: impl Fn(usize) -> Result<B> + Sync,
) -> Result<Vec<T::Output>> {
    let grid = LocalGroup::grid(spec.dp_local, spec.tp);
    let results: Vec<Result<T::Output>> = std::thread::scope(|s| {
        let handles: Vec<_> = grid
            .into_iter()
            .enumerate()
            .map(|(local_index, rank)| {
                let make_backend = &make_backend;
                std::thread::Builder::new()
                    .name(format!("swerve-rank-{local_index}"))
                    .spawn_scoped(s, move || -> Result<T::Output> {
                        let tp_rank = local_index % spec.tp;
                        let place = RankPlace {
                            tp_rank,
                            replica: spec.process.rank * spec.dp_local + rank.replica,
                            local_index,
                        };
                        let backend = make_backend(local_index)?;
                        let dp = if spec.process.world_size > 1 {
                            let nested = Nested::across_processes(rank.dp, &spec.process, tp_rank)?;
                            backend.rank_comm(nested)?
                        } else {
                            backend.rank_comm(rank.dp)?
                        };
                        let groups = Groups {
                            tp: backend.rank_comm(rank.tp)?,
                            dp,
                        };
                        task.run(&backend, groups, place)
                    })
                    .expect("spawning a rank thread")
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow!("a rank thread panicked")))
            })
            .collect()
    });
    first_cause(results)
}

/// Every output, or the error that caused the others: a rank's own failure before the
/// "left the group" errors it set off in the ranks waiting for it.
fn first_cause<R>(results: Vec<Result<R>>) -> Result<Vec<R>> {
    if results.iter().all(Result::is_ok) {
        return Ok(results.into_iter().map(|r| r.expect("checked")).collect());
    }
    let mut errors: Vec<anyhow::Error> = results.into_iter().filter_map(Result::err).collect();
    let is_echo = |e: &anyhow::Error| format!("{e:#}").contains("left the group");
    let at = errors.iter().position(|e| !is_echo(e)).unwrap_or(0);
    Err(errors.swap_remove(at))
}

/// A data-parallel group spanning processes: the replicas of this process (a [`LocalGroup`]),
/// and between processes a [`TcpComm`] that only the process's first replica joins. A
/// collective gathers within the process, exchanges the process's part between processes, and
/// hands the result to every replica here. Rank = process rank x replicas here + replica.
pub struct Nested {
    local: super::local::LocalComm,
    /// The process's first replica only.
    across: Option<TcpComm>,
    processes: usize,
    process: usize,
}

impl Nested {
    /// Joins tp rank `tp_rank`'s data-parallel group between processes (rendezvous at
    /// `MASTER_PORT + 1 + tp_rank`).
    pub fn across_processes(
        local: super::local::LocalComm,
        process: &ProcessGroupEnv,
        tp_rank: usize,
    ) -> Result<Self> {
        let across = if local.rank() == 0 {
            let mut env = process.clone();
            env.master_port =
                u16::try_from(process.master_port as usize + 1 + tp_rank).map_err(|_| {
                    anyhow!(
                        "rendezvous port {} + {} is past 65535",
                        process.master_port,
                        1 + tp_rank
                    )
                })?;
            Some(TcpComm::connect(&env, format!("dp group of tp rank {tp_rank}").as_bytes())?.0)
        } else {
            None
        };
        Ok(Self {
            local,
            across,
            processes: process.world_size,
            process: process.rank,
        })
    }
}

/// Length-prefixed byte strings in one buffer.
fn pack(parts: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in parts {
        out.extend_from_slice(&(p.len() as u64).to_le_bytes());
        out.extend_from_slice(p);
    }
    out
}

fn unpack(mut bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let Some((len, rest)) = bytes.split_first_chunk::<8>() else {
            bail!("nested collective: a truncated part");
        };
        let len = u64::from_le_bytes(*len) as usize;
        if rest.len() < len {
            bail!(
                "nested collective: a part of {len} bytes in {} left",
                rest.len()
            );
        }
        out.push(rest[..len].to_vec());
        bytes = &rest[len..];
    }
    Ok(out)
}

impl Collectives for Nested {
    fn rank(&self) -> usize {
        self.process * self.local.size() + self.local.rank()
    }

    fn size(&self) -> usize {
        self.processes * self.local.size()
    }

    fn all_gather_bytes(&self, local: &[u8]) -> Result<Vec<Vec<u8>>> {
        let here = self.local.all_gather_bytes(local)?;
        let mut everyone = match &self.across {
            Some(across) => pack(&across.all_gather_bytes(&pack(&here))?),
            None => Vec::new(),
        };
        self.local.broadcast_bytes(&mut everyone, 0)?;
        let mut out = Vec::with_capacity(self.size());
        for process in unpack(&everyone)? {
            out.extend(unpack(&process)?);
        }
        if out.len() != self.size() {
            bail!(
                "nested collective: {} parts from {} ranks",
                out.len(),
                self.size()
            );
        }
        Ok(out)
    }
}

impl<B: crate::backend::Backend> Communicator<B> for Nested {}
