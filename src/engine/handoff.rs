//! Weights handed over by a trainer in memory, the engine's side ([`crate::model::handoff`]):
//! an engine rank takes only its own shard, from the trainer rank of the same index. Device to
//! device from that rank's spans on the same GPU ([`RankSpans`]), or one host tensor at a time
//! from a stream ([`ShardTensor`]), each written in place into the existing parameter storage.
//! Either way the trainer's layout is checked against this rank's before anything is written; a
//! streamed update ends with [`Engine::finish_streamed_update`] (prefix cache reset, weight
//! version + 1), which a tensor-parallel engine runs on every rank once every shard is in.

use crate::backend::Backend;
use crate::config::LocalSizes;
use crate::engine::engine::Engine;
use crate::model::handoff::{RankSpans, ShardTensor};
use crate::model::Qwen2Params;
use anyhow::{anyhow, ensure, Context, Result};
use std::sync::mpsc::Receiver;

impl<B: Backend> Engine<B> {
    /// Refuses weights of another part of the model than this rank's.
    pub fn check_shard_layout(&self, local: &LocalSizes) -> Result<()> {
        let mine = &self.model.local;
        ensure!(
            local == mine,
            "the weights handed over are tensor-parallel rank {} of {} ({local:?}); this engine \
             rank is {} of {} ({mine:?})",
            local.tp_rank,
            local.tp_size,
            mine.tp_rank,
            mine.tp_size
        );
        Ok(())
    }

    /// Overwrites this rank's weights from its trainer rank's device memory, once the two are
    /// known to hold the same shard (see [`Engine::update_weights_from_device`]); returns the
    /// new weight version.
    ///
    /// # Safety
    /// As [`Engine::update_weights_from_device`].
    pub unsafe fn update_weights_from_rank_spans(&mut self, rank: &RankSpans) -> Result<u64> {
        self.check_shard_layout(&rank.local)?;
        // SAFETY: forwarded from the caller.
        unsafe { self.update_weights_from_device(&rank.spans) }
    }

    /// Takes this rank's shard from `stream`, one tensor per parameter in checkpoint order, and
    /// writes each in place as it comes (the host holds one tensor at a time, not the shard).
    /// Each tensor is checked before it is written: this rank's, the parameter's name, the same
    /// slice of the whole tensor, the shape and byte count. The weights are new only after
    /// [`Engine::finish_streamed_update`]; an error part way leaves them partly overwritten.
    pub fn overwrite_from_stream(&mut self, stream: &Receiver<ShardTensor>) -> Result<()> {
        ensure!(
            !self.weights_released,
            "the engine's weights are released (asleep at level 2): wake it up first"
        );
        let expected = Qwen2Params::<()>::shards(&self.model.config, &self.model.local);
        let rank = self.model.local.tp_rank;
        // Captured graphs are checked against their eager warm-up when captured: start over.
        self.backend.reset_graphs();
        let params = self.model.params.iter_mut();
        for (index, (param, (name, shard))) in params.zip(&expected).enumerate() {
            let given = stream.recv().map_err(|_| {
                anyhow!(
                    "the weights handed over ended after {index} of rank {rank}'s {} tensors",
                    expected.len()
                )
            })?;
            ensure!(
                given.rank == rank && given.name == *name && given.shard == *shard,
                "the weights handed over: rank {}'s {} ({:?}) where engine rank {rank} takes \
                 {name} ({shard:?})",
                given.rank,
                given.name,
                given.shard
            );
            given
                .tensor
                .check()
                .with_context(|| format!("the weights handed over: tensor {name}"))?;
            self.backend
                .overwrite(param, &given.tensor)
                .with_context(|| format!("the weights handed over: writing {name}"))?;
        }
        Ok(())
    }

    /// Ends a streamed update: forgets the prefix cache (its KV came from the old weights) and
    /// bumps the weight version; returns it.
    pub fn finish_streamed_update(&mut self) -> u64 {
        self.scheduler.kv.reset_prefix_cache();
        self.stats.weight_version += 1;
        self.stats.weight_version
    }

    /// A whole streamed update of a one-rank engine: [`Engine::overwrite_from_stream`], then
    /// [`Engine::finish_streamed_update`].
    pub fn update_weights_streamed(&mut self, stream: &Receiver<ShardTensor>) -> Result<u64> {
        self.overwrite_from_stream(stream)
            .context("the weights may now be partly overwritten: hand them over again")?;
        Ok(self.finish_streamed_update())
    }
}
