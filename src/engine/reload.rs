//! Weight updates between engine steps, always in place: from a checkpoint folder (the server's
//! `/v1/weights/reload`), from host tensors or from device memory (the RL loop's trainer). Every
//! update checks what it is given before it writes, overwrites the existing parameter storage
//! tensor by tensor (no second model), forgets the prefix cache and bumps the weight version.

use crate::backend::{Backend, DeviceSpan, Rotary};
use crate::config::ModelConfig;
use crate::engine::engine::Engine;
use crate::model::weights::Checkpoint;
use crate::model::Qwen2Params;
use crate::tensor::HostTensor;
use anyhow::{bail, ensure, Context, Result};
use std::path::Path;

impl<B: Backend> Engine<B> {
    /// Overwrites the weights in place with those in `dir` (same architecture), forgets the
    /// prefix cache (its KV came from the old weights) and bumps the weight version every record
    /// carries. Called between steps, so no step mixes two versions; running requests continue
    /// on the new weights.
    ///
    /// Every tensor's name, shape and dtype, and the files' integrity, are checked before the
    /// first byte is written: a bad checkpoint (missing tensor, wrong shape, truncated file) is
    /// an error and the old weights serve on. The checkpoint is read through its memory map
    /// tensor by tensor into the existing parameter storage: no second model is built.
    pub fn update_weights(&mut self, dir: &Path) -> Result<u64> {
        if self.weights_released {
            // Asleep at level 2: the parameters have no storage to overwrite; load them anew.
            return self.restore_weights(dir);
        }
        let source = dir.display().to_string();
        let config = ModelConfig::from_dir(dir)?;
        self.check_same_architecture(&config, &source)?;
        let checkpoint = Checkpoint::open(dir)?;
        let host = checkpoint.qwen2_params(&config, &self.model.local)?;
        self.overwrite_weights(&host, &source)?;
        self.model.rotary = Rotary {
            inv_freq: config.rope.inv_freq(config.head_dim),
            attention_scaling: config.rope.attention_scaling(),
        };
        self.model.config = config;
        Ok(self.stats.weight_version)
    }

    /// Overwrites the weights in place with weights handed over in memory (the RL loop's
    /// trainer): same checks and effects as [`Engine::update_weights`], no disk.
    pub fn update_weights_from_host(&mut self, host: &Qwen2Params<HostTensor<'_>>) -> Result<u64> {
        self.overwrite_weights(host, "the weights handed over")?;
        Ok(self.stats.weight_version)
    }

    /// [`Engine::update_weights_from_host`] from whole tensors (checkpoint shapes): this rank's
    /// part of each is taken first (all of it at TP = 1).
    pub fn update_weights_from_whole(
        &mut self,
        whole: &Qwen2Params<HostTensor<'_>>,
    ) -> Result<u64> {
        if self.model.local.tp_size == 1 {
            return self.update_weights_from_host(whole);
        }
        let shards = Qwen2Params::<()>::shards(&self.model.config, &self.model.local);
        let given: Vec<&HostTensor<'_>> = whole.iter().collect();
        ensure!(
            given.len() == shards.len(),
            "the weights handed over: {} tensors for the model's {}",
            given.len(),
            shards.len()
        );
        let mut sliced = Vec::with_capacity(given.len());
        for (tensor, (name, shard)) in given.into_iter().zip(&shards) {
            ensure!(
                tensor.shape == shard.full_shape,
                "the weights handed over: tensor {name} has shape {:?}; the model's is {:?}",
                tensor.shape,
                shard.full_shape
            );
            sliced.push(match &shard.split {
                None => tensor.clone(),
                Some((dim, range)) => tensor.clone().slice(*dim, range.clone())?,
            });
        }
        let mut parts = sliced.into_iter();
        let host = Qwen2Params::try_build(&self.model.config, &self.model.local, |_, _, _| {
            parts
                .next()
                .ok_or_else(|| anyhow::anyhow!("fewer tensors than parameters"))
        })?;
        self.update_weights_from_host(&host)
    }

    /// The architecture fields that fix the parameters' shapes must not change in a reload.
    pub(super) fn check_same_architecture(&self, new: &ModelConfig, source: &str) -> Result<()> {
        let old = &self.model.config;
        let fields = [
            ("hidden_size", old.hidden_size, new.hidden_size),
            (
                "num_hidden_layers",
                old.num_hidden_layers,
                new.num_hidden_layers,
            ),
            (
                "num_attention_heads",
                old.num_attention_heads,
                new.num_attention_heads,
            ),
            (
                "num_key_value_heads",
                old.num_key_value_heads,
                new.num_key_value_heads,
            ),
            ("head_dim", old.head_dim, new.head_dim),
            ("vocab_size", old.vocab_size, new.vocab_size),
            (
                "intermediate_size",
                old.intermediate_size,
                new.intermediate_size,
            ),
            (
                "tie_word_embeddings",
                old.tie_word_embeddings as usize,
                new.tie_word_embeddings as usize,
            ),
        ];
        let differ: Vec<String> = fields
            .iter()
            .filter(|(_, a, b)| a != b)
            .map(|(name, a, b)| format!("{name} {b} (loaded: {a})"))
            .collect();
        ensure!(
            differ.is_empty(),
            "{source}: a different architecture than the loaded model: {}",
            differ.join(", ")
        );
        Ok(())
    }

    /// Checks every host tensor against the loaded parameters (count, shape, byte length), then
    /// overwrites them one by one; resets the prefix cache and bumps the weight version.
    fn overwrite_weights(
        &mut self,
        host: &Qwen2Params<HostTensor<'_>>,
        source: &str,
    ) -> Result<()> {
        let expected = Qwen2Params::<()>::expected_tensors(&self.model.config, &self.model.local);
        let given: Vec<&HostTensor<'_>> = host.iter().collect();
        ensure!(
            given.len() == expected.len(),
            "{source}: {} tensors for the model's {}",
            given.len(),
            expected.len()
        );
        for ((name, shape), tensor) in expected.iter().zip(&given) {
            ensure!(
                tensor.shape == *shape,
                "{source}: tensor {name} has shape {:?}; the model's is {shape:?}",
                tensor.shape
            );
            tensor
                .check()
                .with_context(|| format!("{source}: tensor {name}"))?;
        }
        // Captured graphs are checked against their eager warm-up when captured: start over.
        self.backend.reset_graphs();
        let params = self.model.params.iter_mut();
        for ((param, tensor), (name, _)) in params.zip(given).zip(&expected) {
            if let Err(e) = self.backend.overwrite(param, tensor) {
                // Only a device failure gets here, after the checks: say what state it left.
                self.scheduler.kv.reset_prefix_cache();
                bail!("{source}: writing {name} failed, the weights are now partly overwritten (reload again): {e:#}");
            }
        }
        self.scheduler.kv.reset_prefix_cache();
        self.stats.weight_version += 1;
        Ok(())
    }

    /// Overwrites the weights in place from device memory of another backend on this device
    /// (the RL loop's trainer), one span per parameter in checkpoint order: no host round trip.
    ///
    /// # Safety
    /// Every span must be live device memory of this device that nobody writes until this
    /// returns (the trainer waits for the reply).
    pub unsafe fn update_weights_from_device(&mut self, spans: &[DeviceSpan]) -> Result<u64> {
        let count = self.model.params.iter().count();
        ensure!(
            spans.len() == count,
            "{} device tensors handed over for {count} parameters",
            spans.len()
        );
        // Captured graphs keep reading the same (now updated) buffers, but drop them anyway:
        // a graph is checked against its eager warm-up when captured.
        self.backend.reset_graphs();
        for (param, span) in self.model.params.iter_mut().zip(spans) {
            // SAFETY: forwarded from the caller.
            unsafe { self.backend.copy_from_span(param, span) }?;
        }
        self.scheduler.kv.reset_prefix_cache();
        self.stats.weight_version += 1;
        Ok(self.stats.weight_version)
    }
}
