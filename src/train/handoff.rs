//! A learner's compute weights leaving it for an engine ([`crate::model::handoff`]): this
//! rank's device spans (an engine rank on the same GPU copies them device to device), or this
//! rank's shard streamed one tensor at a time through host memory; and, for tools and tests, the
//! whole model gathered on the host.

use crate::backend::grad::BackendGrad;
use crate::model::handoff::{RankSpans, ShardSender, ShardTensor};
use crate::model::params::ParamShard;
use crate::model::Qwen2Params;
use crate::tensor::HostTensor;
use crate::train::learner::Learner;
use anyhow::{anyhow, Result};

impl<B: BackendGrad> Learner<'_, B> {
    /// This rank's compute weights' device memory (one span per parameter, checkpoint order)
    /// and its part of the model, once all queued work is done; `None` on a host backend.
    pub fn compute_weight_spans(&self) -> Result<Option<RankSpans>> {
        let mut spans = Vec::new();
        for param in self.model.params.iter() {
            match self.backend.device_span(param)? {
                Some(span) => spans.push(span),
                None => return Ok(None),
            }
        }
        Ok(Some(RankSpans {
            local: self.model.local,
            spans,
        }))
    }

    /// Sends this rank's compute weights into `out`, one tensor at a time in checkpoint order,
    /// each in its own element type (bf16 on CUDA, f32 on the CPU): what the engine computes with
    /// is bit for bit what the trainer does. Each send waits until the engine has taken the
    /// tensor, so this rank's host memory holds one tensor of its shard at a time.
    pub fn send_compute_weights(&self, out: &ShardSender) -> Result<()> {
        let shards = Qwen2Params::<()>::shards(&self.model.config, &self.model.local);
        let rank = self.model.local.tp_rank;
        for (param, (name, shard)) in self.model.params.iter().zip(shards) {
            let tensor = self.backend.to_host_tensor(param)?;
            let given = ShardTensor {
                rank,
                name,
                shard,
                tensor,
            };
            out.send(given).map_err(|refused| {
                anyhow!(
                    "the engine stopped taking weights at rank {rank}'s {}",
                    refused.0.name
                )
            })?;
        }
        Ok(())
    }

    /// The compute weights as whole f32 host tensors (HF names and shapes, checkpoint order),
    /// gathered from the tensor-parallel ranks of this replica (the replicas hold the same
    /// weights): `Some` on each replica's first rank, `None` on the others. Every rank calls it.
    /// The whole model in f32 on one host (~290 GB at 72B): the RL loop hands over shards
    /// instead ([`Self::send_compute_weights`]).
    pub fn gather_compute_weights(&self) -> Result<Option<Qwen2Params<HostTensor<'static>>>> {
        let backend = self.backend;
        let tp = &self.model.comm;
        let config = &self.model.config;
        let all_shards: Vec<Vec<(String, ParamShard)>> = config
            .shards(tp.size())?
            .iter()
            .map(|local| Qwen2Params::<()>::shards(config, local))
            .collect();
        let mut whole = Vec::with_capacity(all_shards[0].len());
        for (i, param) in self.model.params.iter().enumerate() {
            let values = backend.to_host(param)?;
            let pieces = if tp.size() > 1 {
                tp.all_gather_bytes(bytemuck::cast_slice(&values))?
            } else {
                vec![bytemuck::cast_slice(&values).to_vec()]
            };
            if tp.rank() != 0 {
                continue;
            }
            let shape = &all_shards[0][i].1.full_shape;
            let mut full = vec![0.0f32; shape.iter().product()];
            for (rank, piece) in pieces.iter().enumerate() {
                all_shards[rank][i]
                    .1
                    .place(&crate::dist::f32s_from_bytes(piece), &mut full);
            }
            whole.push(HostTensor::from_f32(shape.clone(), &full));
        }
        if tp.rank() != 0 {
            return Ok(None);
        }
        let mut tensors = whole.into_iter();
        let everything = config.shard(1, 0)?;
        Ok(Some(Qwen2Params::try_build(
            config,
            &everything,
            |_, _, _| {
                tensors
                    .next()
                    .ok_or_else(|| anyhow!("fewer tensors than parameters"))
            },
        )?))
    }
}
