//! `--offload-optimizer`: the optimizer state a replica owns (the f32 masters and both AdamW
//! moments, 12 bytes a parameter of its ZeRO-1 share) moved to host memory while the rollouts
//! run, and back before the next step, so that its device memory goes to the engine's KV cache.
//!
//! ```text
//!   offload:   every owned master and moment copied to the host ─ then the device tensors
//!              dropped and the backend's cache given back (a failed copy leaves them as they were)
//!   restore:   every one uploaded again ─ then the host copies dropped (a failed upload leaves
//!              the state offloaded)
//! ```
//!
//! The round trip is exact (f32 both ways), so a run gives the same results with or without it.
//! On the CPU backend the "device" is host memory too: the state moves from one host buffer to
//! another and nothing is freed, but the same code runs.

use crate::backend::grad::BackendGrad;
use crate::train::optimizer::AdamW;
use anyhow::{ensure, Context, Result};

/// The owned masters and moments in host memory, in parameter order (the order of the moments).
pub struct HostOptimizerState {
    masters: Vec<Vec<f32>>,
    exp_avg: Vec<Vec<f32>>,
    exp_avg_sq: Vec<Vec<f32>>,
}

impl HostOptimizerState {
    /// Copies the owned masters (the `Some`s of `masters`) and `adamw`'s moments to the host,
    /// then drops the device tensors (`masters` all `None`, the moments empty) and gives the
    /// backend's cached memory back.
    pub fn offload<B: BackendGrad>(
        backend: &B,
        masters: &mut [Option<B::Tensor>],
        adamw: &mut AdamW<B::Tensor>,
    ) -> Result<Self> {
        let host = Self {
            masters: copy_to_host(backend, masters.iter().flatten())?,
            exp_avg: copy_to_host(backend, adamw.exp_avg.iter())?,
            exp_avg_sq: copy_to_host(backend, adamw.exp_avg_sq.iter())?,
        };
        for master in masters.iter_mut() {
            *master = None;
        }
        adamw.exp_avg.clear();
        adamw.exp_avg_sq.clear();
        backend.release_cached_memory();
        Ok(host)
    }

    /// Uploads the state again into `masters` (`shapes[i]`: master `i`'s shape where this
    /// replica owns it, else `None`) and `adamw`'s moments; the caller drops `self` after.
    pub fn restore<B: BackendGrad>(
        &self,
        backend: &B,
        shapes: &[Option<Vec<usize>>],
        masters: &mut [Option<B::Tensor>],
        adamw: &mut AdamW<B::Tensor>,
    ) -> Result<()> {
        let owned: Vec<&Vec<usize>> = shapes.iter().flatten().collect();
        ensure!(
            owned.len() == self.masters.len() && shapes.len() == masters.len(),
            "the offloaded optimizer state holds {} masters; this replica owns {}",
            self.masters.len(),
            owned.len()
        );
        let upload = |values: &[Vec<f32>]| -> Result<Vec<B::Tensor>> {
            owned
                .iter()
                .zip(values)
                .map(|(shape, v)| backend.upload_f32(shape, v))
                .collect::<Result<_>>()
                .context("bringing the optimizer state back to the device")
        };
        let mut uploaded = upload(&self.masters)?.into_iter();
        let exp_avg = upload(&self.exp_avg)?;
        let exp_avg_sq = upload(&self.exp_avg_sq)?;
        for (master, shape) in masters.iter_mut().zip(shapes) {
            if shape.is_some() {
                *master = uploaded.next();
            }
        }
        adamw.exp_avg = exp_avg;
        adamw.exp_avg_sq = exp_avg_sq;
        Ok(())
    }

    /// The `k`th owned parameter's master and moments, concatenated (what a checkpoint saves).
    pub fn values(&self, k: usize) -> Vec<f32> {
        [
            self.masters[k].as_slice(),
            &self.exp_avg[k],
            &self.exp_avg_sq[k],
        ]
        .concat()
    }
}

fn copy_to_host<'t, B: BackendGrad>(
    backend: &B,
    tensors: impl Iterator<Item = &'t B::Tensor>,
) -> Result<Vec<Vec<f32>>>
where
    B::Tensor: 't,
{
    tensors.map(|t| backend.to_host(t)).collect()
}
