//! Sleep levels, as vLLM's `/sleep` names them: level 1 gives the KV cache's memory back, level
//! 2 the weights' too. Both need an idle engine. The KV cache comes back by itself with the
//! next request (or [`Engine::restore_kv_cache`]); released weights come back only from a model
//! folder ([`Engine::restore_weights`], or a weight update, which loads them anew), and until
//! then every request is refused.
//!
//! Sizes are bytes as the backend stores them (bf16 on a GPU, f32 on the CPU reference).

use crate::backend::{Backend, Rotary};
use crate::config::ModelConfig;
use crate::engine::engine::Engine;
use crate::model::weights::Checkpoint;
use crate::tensor::HostTensor;
use anyhow::{ensure, Result};
use std::path::Path;

/// Memory given back by a sleep, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Released {
    pub kv_cache_bytes: usize,
    pub weight_bytes: usize,
}

/// Bytes of one tensor as the backend stores it: the device span where there is one, else f32.
fn tensor_bytes<B: Backend>(backend: &B, tensor: &B::Tensor) -> Result<usize> {
    Ok(match backend.device_span(tensor)? {
        Some(span) => span.bytes,
        None => backend.shape(tensor).iter().product::<usize>() * 4,
    })
}

/// Hands freed heap memory back to the system: glibc keeps large freed blocks for reuse once its
/// mmap threshold has grown, so without this a released CPU KV cache or CPU weights would stay
/// resident. (Device memory goes back through `Backend::release_cached_memory`.)
fn return_freed_host_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks glibc's own heap bookkeeping.
    unsafe {
        libc::malloc_trim(0);
    }
}

impl<B: Backend> Engine<B> {
    /// Whether the weights are released (sleep level 2).
    pub fn weights_released(&self) -> bool {
        self.weights_released
    }

    /// Frees the KV cache (level 1) and, at level 2, the weights; refused with requests in
    /// flight. Returns the bytes given back (0 for what was released already).
    pub fn sleep(&mut self, level: u8) -> Result<Released> {
        ensure!(
            (1..=2).contains(&level),
            "level: {level} is not a sleep level (1: the KV cache, 2: the weights too)"
        );
        ensure!(
            !self.has_unfinished(),
            "the engine cannot sleep with {} requests running and {} waiting",
            self.scheduler.num_running(),
            self.scheduler.num_waiting()
        );
        let mut released = Released::default();
        let kv_bytes = self.kv_cache_bytes()?;
        if self.release_kv_cache()? > 0 {
            released.kv_cache_bytes = kv_bytes;
        }
        if level == 2 && !self.weights_released {
            released.weight_bytes = self.release_weights()?;
        }
        return_freed_host_memory();
        Ok(released)
    }

    /// Bytes the KV cache holds now (0 while released).
    fn kv_cache_bytes(&self) -> Result<usize> {
        let mut bytes = 0;
        for (k, v) in &self.kv.layers {
            bytes += tensor_bytes(&self.backend, k)? + tensor_bytes(&self.backend, v)?;
        }
        Ok(bytes)
    }

    /// Frees every parameter's storage (a one-element placeholder stays), forgets the prefix
    /// cache and refuses requests until [`Engine::restore_weights`]. Returns the bytes freed.
    fn release_weights(&mut self) -> Result<usize> {
        let mut bytes = 0;
        for param in self.model.params.iter() {
            bytes += tensor_bytes(&self.backend, param)?;
        }
        // Captured graphs read the weights' memory.
        self.backend.reset_graphs();
        for param in self.model.params.iter_mut() {
            *param = self.backend.zeros(&[1])?;
        }
        self.backend.release_cached_memory();
        self.scheduler.kv.reset_prefix_cache();
        self.weights_released = true;
        Ok(bytes)
    }

    /// Loads the weights of `dir` (the loaded model's architecture) into new storage after
    /// [`Engine::sleep`] at level 2, forgets the prefix cache and bumps the weight version (the
    /// folder may hold other weights than before). A no-op load is never skipped: the files are
    /// read again.
    pub fn restore_weights(&mut self, dir: &Path) -> Result<u64> {
        ensure!(
            self.weights_released,
            "the weights are loaded: use a weight update to change them"
        );
        let source = dir.display().to_string();
        let config = ModelConfig::from_dir(dir)?;
        self.check_same_architecture(&config, &source)?;
        let checkpoint = Checkpoint::open(dir)?;
        let host = checkpoint.qwen2_params(&config, &self.model.local)?;
        let tensors: Vec<&HostTensor<'_>> = host.iter().collect();
        let uploads = self.backend.upload_params(&tensors)?;
        ensure!(
            uploads.len() == self.model.params.iter().count(),
            "{source}: {} tensors for the model's {}",
            uploads.len(),
            self.model.params.iter().count()
        );
        for (param, upload) in self.model.params.iter_mut().zip(uploads) {
            *param = upload;
        }
        self.model.rotary = Rotary {
            inv_freq: config.rope.inv_freq(config.head_dim),
            attention_scaling: config.rope.attention_scaling(),
        };
        self.model.config = config;
        self.weights_released = false;
        self.scheduler.kv.reset_prefix_cache();
        self.stats.weight_version += 1;
        Ok(self.stats.weight_version)
    }

    /// Forgets every cached prefix (vLLM's `/reset_prefix_cache`, SGLang's `/flush_cache`):
    /// running requests keep their blocks but cache no more of them. Returns the entries dropped.
    pub fn reset_prefix_cache(&mut self) -> usize {
        self.scheduler.kv.reset_prefix_cache()
    }
}
