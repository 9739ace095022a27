//! Collectives between the ranks of a parallel group (DESIGN.md decision 11): the tensor-parallel
//! ranks of one model replica, or the data-parallel replicas that hold the same shard.
//!
//! Two traits, one above the other:
//!
//! ```text
//!  Communicator<B>   on a backend's tensors: all-reduce, all-gather / reduce-scatter of rows,
//!       │            all-gather of column blocks (vocabulary-parallel logits), broadcast.
//!       │            Default bodies stage through the host (to_host, the Collectives below,
//!       │            write_f32): correct on every backend; NCCL overrides them on the device.
//!  Collectives       on host buffers: one primitive, the all-gather of each rank's bytes, and
//!                    the typed reductions built on it, always in rank order 0, 1, 2, ... so every
//!                    rank computes bitwise the same result.
//! ```
//!
//! Implementations: [`local`] (ranks as threads of one process, shared memory), [`tcp`] (ranks
//! as processes, through rank 0 over TCP, after [`rendezvous`]), [`nccl`] (one GPU per rank:
//! `NcclComm` overrides every tensor collective with one NCCL call on the backend's stream; its
//! id travels to the ranks through any of the others; the emulated device has a stand-in libnccl).
//!
//! Launch model: one process per node drives its GPUs with a thread per GPU. Tensor parallelism
//! stays inside a process (threads, [`local`] or NCCL communicators); processes meet only for
//! data parallelism (the gradient all-reduce, ZeRO-1) and to exchange NCCL unique ids. [`launch`]
//! reads the group of processes from torchrun's or Slurm's variables ([`launch::ProcessGroupEnv`]:
//! its world size counts nodes), [`rendezvous`] brings them together over TCP at `MASTER_ADDR:
//! MASTER_PORT`, and [`tcp::TcpComm`] runs the host collectives between them.
//!
//! A rank that fails leaves its group: the others' pending and later collectives return an
//! error naming it instead of waiting forever.

pub mod grid;
pub mod launch;
pub mod local;
pub mod nccl;
pub mod rendezvous;
mod slurm_lists;
pub mod tcp;
mod wire;

pub use grid::Groups;

use crate::backend::Backend;
use anyhow::{bail, ensure, Result};

/// The element-wise reduction of [`Collectives::all_reduce_f64`] and friends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    Max,
}

/// Collectives over host memory. Every rank of the group must call the same collectives in the
/// same order (SPMD); each call returns only when every rank has made it.
pub trait Collectives: Send + Sync {
    /// This rank's index in the group, `0..size`.
    fn rank(&self) -> usize;
    /// Ranks in the group.
    fn size(&self) -> usize;
    /// Every rank's `local` bytes (lengths may differ), in rank order. The primitive the typed
    /// collectives below are built on.
    fn all_gather_bytes(&self, local: &[u8]) -> Result<Vec<Vec<u8>>>;

    /// Waits until every rank has arrived.
    fn barrier(&self) -> Result<()> {
        self.all_gather_bytes(&[]).map(drop)
    }

    /// Root's bytes on every rank.
    fn broadcast_bytes(&self, bytes: &mut Vec<u8>, root: usize) -> Result<()> {
        ensure!(
            root < self.size(),
            "broadcast from rank {root} of {}",
            self.size()
        );
        let mine = if self.rank() == root {
            bytes.as_slice()
        } else {
            &[]
        };
        let mut all = self.all_gather_bytes(mine)?;
        *bytes = std::mem::take(&mut all[root]);
        Ok(())
    }

    /// Every rank's `local` values concatenated in rank order (lengths must be equal).
    fn all_gather_f32(&self, local: &[f32]) -> Result<Vec<f32>> {
        let parts = self.all_gather_bytes(bytemuck::cast_slice(local))?;
        concat_equal(&parts, local.len() * 4)
            .map(|bytes| bytes_to_values(&bytes, f32::from_le_bytes))
    }

    fn all_gather_f64(&self, local: &[f64]) -> Result<Vec<f64>> {
        let parts = self.all_gather_bytes(bytemuck::cast_slice(local))?;
        concat_equal(&parts, local.len() * 8)
            .map(|bytes| bytes_to_values(&bytes, f64::from_le_bytes))
    }

    /// `values` reduced element-wise over the ranks, in rank order, on every rank.
    fn all_reduce_f32(&self, values: &mut [f32], op: ReduceOp) -> Result<()> {
        if self.size() == 1 {
            return Ok(());
        }
        let all = self.all_gather_f32(values)?;
        reduce_in_rank_order(&all, values, op);
        Ok(())
    }

    fn all_reduce_f64(&self, values: &mut [f64], op: ReduceOp) -> Result<()> {
        if self.size() == 1 {
            return Ok(());
        }
        let all = self.all_gather_f64(values)?;
        reduce_in_rank_order(&all, values, op);
        Ok(())
    }

    /// `full` (`size` equal parts on every rank) summed element-wise over the ranks in rank
    /// order; this rank gets its part.
    fn reduce_scatter_f32(&self, full: &[f32]) -> Result<Vec<f32>> {
        let size = self.size();
        ensure!(
            full.len().is_multiple_of(size),
            "reduce-scatter of {} values over {size} ranks",
            full.len()
        );
        let part = full.len() / size;
        let mut summed = full.to_vec();
        self.all_reduce_f32(&mut summed, ReduceOp::Sum)?;
        let r = self.rank();
        Ok(summed[r * part..(r + 1) * part].to_vec())
    }
}

/// An element the reductions work on.
trait Element: Copy + PartialOrd + std::ops::Add<Output = Self> {
    fn is_nan(self) -> bool;
}

impl Element for f32 {
    fn is_nan(self) -> bool {
        f32::is_nan(self)
    }
}

impl Element for f64 {
    fn is_nan(self) -> bool {
        f64::is_nan(self)
    }
}

impl ReduceOp {
    fn apply<T: Element>(self, a: T, b: T) -> T {
        match self {
            ReduceOp::Sum => a + b,
            // NaN wins, as in NCCL's max: a poisoned value is never hidden.
            ReduceOp::Max if a.is_nan() => a,
            ReduceOp::Max if b.is_nan() || b > a => b,
            ReduceOp::Max => a,
        }
    }
}

/// `out[i] = op(all[0 * n + i], all[1 * n + i], ...)`, left to right.
fn reduce_in_rank_order<T: Element>(all: &[T], out: &mut [T], op: ReduceOp) {
    let n = out.len();
    let ranks = all.len().checked_div(n).unwrap_or(0);
    for (i, v) in out.iter_mut().enumerate() {
        let mut acc = all[i];
        for r in 1..ranks {
            acc = op.apply(acc, all[r * n + i]);
        }
        *v = acc;
    }
}

/// The canonical tensor-parallel sum, the reference of `kernels/rank_sum.cu`: `all` holds
/// `ranks` equal rows (rank r's values of the same elements); element i is
/// `((all[0][i] + all[1][i]) + all[2][i]) + ...` in f32, rank by rank.
pub fn sum_in_rank_order(all: &[f32], ranks: usize) -> Vec<f32> {
    let mut out = vec![0.0; all.len().checked_div(ranks).unwrap_or(0)];
    reduce_in_rank_order(all, &mut out, ReduceOp::Sum);
    out
}

fn concat_equal(parts: &[Vec<u8>], each: usize) -> Result<Vec<u8>> {
    if let Some((r, p)) = parts.iter().enumerate().find(|(_, p)| p.len() != each) {
        bail!(
            "collective: rank {r} contributed {} bytes where this rank has {each}",
            p.len()
        );
    }
    Ok(parts.concat())
}

/// Little-endian f32s from bytes (what the byte collectives carry).
pub fn f32s_from_bytes(bytes: &[u8]) -> Vec<f32> {
    bytes_to_values(bytes, f32::from_le_bytes)
}

fn bytes_to_values<const N: usize, T>(bytes: &[u8], from: fn([u8; N]) -> T) -> Vec<T> {
    bytes
        .chunks_exact(N)
        .map(|c| from(c.try_into().expect("chunk of N bytes")))
        .collect()
}

/// Collectives on a backend's tensors. The default bodies copy through the host
/// ([`Backend::to_host`], the [`Collectives`], [`Backend::write_f32`]): exact in f32, fine for the
/// CPU backend and for tests of device code; NCCL ([`nccl`]) works on the device instead.
/// Tensors are row-major; "rows" are the first dimension.
pub trait Communicator<B: Backend>: Collectives {
    /// `x` summed over the ranks (in rank order), in place on every rank.
    fn all_reduce_sum(&self, backend: &B, x: &mut B::Tensor) -> Result<()> {
        if self.size() == 1 {
            return Ok(());
        }
        let mut values = backend.to_host(x)?;
        self.all_reduce_f32(&mut values, ReduceOp::Sum)?;
        backend.write_f32(x, &values)
    }

    /// `x` summed over the ranks, in place on every rank, the same bits on every rank but in
    /// any order the implementation likes: for sums no logprob depends on (the data-parallel
    /// gradients, identical on every replica either way). The host path and the default sum in
    /// rank order; NCCL uses `ncclAllReduce`, which needs no scratch.
    fn all_reduce_sum_any_order(&self, backend: &B, x: &mut B::Tensor) -> Result<()> {
        self.all_reduce_sum(backend, x)
    }

    /// `out` = every rank's `local` rows stacked in rank order (`out` has `size` times the rows).
    fn all_gather_rows(&self, backend: &B, local: &B::Tensor, out: &mut B::Tensor) -> Result<()> {
        check_rows_scale(
            backend.shape(out),
            backend.shape(local),
            self.size(),
            "all-gather",
        )?;
        let values = self.all_gather_f32(&backend.to_host(local)?)?;
        backend.write_f32(out, &values)
    }

    /// `out` = this rank's part of `full` summed over the ranks: `full` has `size` times the
    /// rows of `out`, and rank r keeps rows `r * rows .. (r + 1) * rows`.
    fn reduce_scatter_rows(
        &self,
        backend: &B,
        full: &B::Tensor,
        out: &mut B::Tensor,
    ) -> Result<()> {
        check_rows_scale(
            backend.shape(full),
            backend.shape(out),
            self.size(),
            "reduce-scatter",
        )?;
        let part = self.reduce_scatter_f32(&backend.to_host(full)?)?;
        backend.write_f32(out, &part)
    }

    /// `out [rows, sum(widths)]` = every rank's `local [rows, widths[rank]]` side by side, in rank
    /// order (the vocabulary-parallel logits, whose shards may differ by a row).
    fn all_gather_columns(
        &self,
        backend: &B,
        local: &B::Tensor,
        widths: &[usize],
        out: &mut B::Tensor,
    ) -> Result<()> {
        let (local_shape, out_shape) = (backend.shape(local), backend.shape(out));
        let total: usize = widths.iter().sum();
        ensure!(
            widths.len() == self.size()
                && local_shape.len() == 2
                && out_shape.len() == 2
                && local_shape[0] == out_shape[0]
                && local_shape[1] == widths[self.rank()]
                && out_shape[1] == total,
            "all-gather of columns: local {local_shape:?}, out {out_shape:?}, widths {widths:?}"
        );
        let rows = local_shape[0];
        let parts = self.all_gather_bytes(bytemuck::cast_slice(&backend.to_host(local)?))?;
        let mut values = vec![0.0f32; rows * total];
        let mut column = 0;
        for (r, part) in parts.iter().enumerate() {
            let width = widths[r];
            ensure!(
                part.len() == rows * width * 4,
                "all-gather of columns: rank {r} sent {} bytes for {rows} x {width}",
                part.len()
            );
            let part = bytes_to_values(part, f32::from_le_bytes);
            for row in 0..rows {
                values[row * total + column..][..width]
                    .copy_from_slice(&part[row * width..][..width]);
            }
            column += width;
        }
        backend.write_f32(out, &values)
    }

    /// Root's `x` on every rank.
    fn broadcast(&self, backend: &B, x: &mut B::Tensor, root: usize) -> Result<()> {
        if self.size() == 1 {
            return Ok(());
        }
        let values = if self.rank() == root {
            backend.to_host(x)?
        } else {
            Vec::new()
        };
        let mut bytes = bytemuck::cast_slice(&values).to_vec();
        self.broadcast_bytes(&mut bytes, root)?;
        if self.rank() != root {
            backend.write_f32(x, &bytes_to_values(&bytes, f32::from_le_bytes))?;
        }
        Ok(())
    }
}

fn check_rows_scale(big: &[usize], small: &[usize], size: usize, what: &str) -> Result<()> {
    ensure!(
        !big.is_empty()
            && big.len() == small.len()
            && big[0] == small[0] * size
            && big[1..] == small[1..],
        "{what} over {size} ranks: shapes {big:?} and {small:?}"
    );
    Ok(())
}

/// A group of one: every collective is the identity. What a model runs with when it is not
/// split.
#[derive(Clone, Copy, Debug, Default)]
pub struct Solo;

impl Collectives for Solo {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn all_gather_bytes(&self, local: &[u8]) -> Result<Vec<Vec<u8>>> {
        Ok(vec![local.to_vec()])
    }
}

impl<B: Backend> Communicator<B> for Solo {}
