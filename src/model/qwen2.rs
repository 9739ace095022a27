//! The Qwen2 forward pass, written once over [`Backend`] with one rank's local sizes.
//!
//! Per layer, for a packed batch of `T` tokens (`d` hidden, local heads `h`, kv heads `g`):
//!
//! ```text
//! residual ─┬─ rmsnorm ─ q,k,v (+bias) ─ rope(q,k) ─ causal GQA attention ─ o_proj ─┐
//!           └──────────────────────────── + ◄─────────────────────────────────────────┘
//!           ┬─ rmsnorm ─ gate, up ─ silu(gate)*up ─ down_proj ─┐
//!           └──────────────── + ◄──────────────────────────────┘
//! ```
//!
//! The layer itself is [`crate::model::layer`]'s, the one forward scoring, the engine and the
//! trainer share. The residual add is fused into the next norm (`add_rmsnorm`). After the last
//! layer: the final norm, then the LM head (tied to the embedding or not).
//!
//! A model is one tensor-parallel rank's part ([`LocalSizes`], DESIGN.md 11) with the
//! [`Communicator`] of its group; [`crate::model::parallel`] has the collectives the layer calls
//! between its column- and row-parallel halves. With TP = 1 ([`Solo`]) nothing is communicated
//! and every op is what it was before tensor parallelism.

use crate::backend::{Backend, PagedLayout, Rotary};
use crate::config::{LocalSizes, ModelConfig};
use crate::dist::{Communicator, Solo};
use crate::model::params::Qwen2Params;
use crate::model::weights::Checkpoint;
use crate::tensor::HostTensor;
use anyhow::{anyhow, bail, Result};
use std::path::Path;
use std::sync::Arc;

pub struct Qwen2Model<B: Backend> {
    pub config: ModelConfig,
    /// This rank's part of the model (all of it at TP = 1).
    pub local: LocalSizes,
    pub params: Qwen2Params<B::Tensor>,
    pub rotary: Rotary,
    /// The tensor-parallel group this rank computes with ([`Solo`] at TP = 1).
    pub comm: Arc<dyn Communicator<B>>,
}

/// The paged KV cache's device memory: per layer, the K and V block pools (DESIGN.md 7).
pub struct PagedKv<T> {
    pub num_blocks: usize,
    pub block_size: usize,
    pub layers: Vec<(T, T)>,
}

impl<T> PagedKv<T> {
    /// Bytes of K and V per cached token, all layers (`elem_bytes` per element).
    pub fn bytes_per_token(config: &ModelConfig, local: &LocalSizes, elem_bytes: usize) -> usize {
        2 * config.num_hidden_layers * local.kv_heads_local * config.head_dim * elem_bytes
    }
}

/// Sequences packed back to back: token ids, positions within each sequence, and `cu_seqlens`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PackedBatch {
    pub tokens: Vec<u32>,
    pub positions: Vec<u32>,
    pub cu_seqlens: Vec<u32>,
}

impl PackedBatch {
    /// Packs whole sequences, each starting at position 0. Empty sequences are skipped by the
    /// attention (they occupy no rows) but keep their slot in `cu_seqlens`.
    pub fn from_sequences<S: AsRef<[u32]>>(sequences: &[S]) -> Self {
        let mut batch = PackedBatch {
            cu_seqlens: vec![0],
            ..Default::default()
        };
        for seq in sequences {
            let seq = seq.as_ref();
            batch.tokens.extend_from_slice(seq);
            batch.positions.extend(0..seq.len() as u32);
            batch.cu_seqlens.push(batch.tokens.len() as u32);
        }
        batch
    }

    pub fn num_tokens(&self) -> usize {
        self.tokens.len()
    }

    pub fn num_sequences(&self) -> usize {
        self.cu_seqlens.len() - 1
    }

    /// Row range of sequence `i` in the packed tensors.
    pub fn sequence_range(&self, i: usize) -> std::ops::Range<usize> {
        self.cu_seqlens[i] as usize..self.cu_seqlens[i + 1] as usize
    }
}

/// How a forward lays out the residual stream's rows over the tensor-parallel ranks (see the
/// module doc). Identical at TP = 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Every rank holds every row; row-parallel outputs are all-reduced. Inference.
    AllRows,
    /// Sequence parallelism: rank `r` holds rows `r T / tp .. (r + 1) T / tp` between the
    /// blocks (`T` a multiple of `tp`: `PackedBatch::padded_to`). Training: the activations
    /// kept per layer shrink by `tp`.
    Sequence,
}

/// What a layer's forward keeps for the backward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keep {
    /// Inference: buffers are reused from layer to layer.
    Nothing,
    /// Activation checkpointing: each layer's input.
    Input,
    Everything,
}

/// Attention supplied by the caller (packed prefill, paged decode, or training's with its
/// logsumexp): `(layer index, q, k, v, out, lse)`; `lse` is `Some` exactly when the caller asked
/// for it.
pub trait AttentionFn<T>: FnMut(usize, &T, &T, &T, &mut T, Option<&mut T>) -> Result<()> {}
impl<T, F: FnMut(usize, &T, &T, &T, &mut T, Option<&mut T>) -> Result<()>> AttentionFn<T> for F {}

impl<B: Backend> Qwen2Model<B> {
    /// Loads `DIR/config.json` and the safetensors checkpoint beside it (TP = 1).
    pub fn load(backend: &B, dir: &Path) -> Result<Self> {
        Self::load_shard(backend, dir, Arc::new(Solo))
    }

    /// Loads this rank's part of `DIR`'s model for the tensor-parallel group `comm`: only its
    /// slices of each tensor are read from the mapped files and uploaded.
    pub fn load_shard(backend: &B, dir: &Path, comm: Arc<dyn Communicator<B>>) -> Result<Self> {
        let config = ModelConfig::from_dir(dir)?;
        let local = config
            .shard(comm.size(), comm.rank())
            .map_err(|e| anyhow!("{}: {e}", dir.join("config.json").display()))?;
        let checkpoint = Checkpoint::open(dir)?;
        let host = checkpoint.qwen2_params(&config, &local)?;
        Self::from_host_params(backend, config, local, &host)?.with_comm(comm)
    }

    /// The same model computing with the tensor-parallel group `comm`, whose size and this
    /// rank's index must be `self.local`'s.
    pub fn with_comm(mut self, comm: Arc<dyn Communicator<B>>) -> Result<Self> {
        if (comm.size(), comm.rank()) != (self.local.tp_size, self.local.tp_rank) {
            bail!(
                "a model shard for rank {} of {} given the communicator of rank {} of {}",
                self.local.tp_rank,
                self.local.tp_size,
                comm.rank(),
                comm.size()
            );
        }
        self.comm = comm;
        Ok(self)
    }

    /// Uploads host parameters (from a checkpoint or built in memory) to the backend; the model
    /// computes alone ([`Solo`]) until [`Self::with_comm`] gives it its group.
    pub fn from_host_params(
        backend: &B,
        config: ModelConfig,
        local: LocalSizes,
        host: &Qwen2Params<HostTensor<'_>>,
    ) -> Result<Self> {
        let host_tensors: Vec<&HostTensor<'_>> = host.iter().collect();
        backend.set_lm_head_shards(local.tp_size);
        let mut uploads = backend.upload_params(&host_tensors)?.into_iter();
        let params = Qwen2Params::try_build(&config, &local, |name, shape, _| {
            let index = host_tensors.len() - uploads.len();
            let tensor = uploads
                .next()
                .ok_or_else(|| anyhow!("host parameters end before {name}"))?;
            let host_shape = &host_tensors[index].shape;
            if host_shape != shape {
                bail!("parameter {name}: shape {host_shape:?}, expected {shape:?}");
            }
            Ok(tensor)
        })?;
        let rotary = Rotary {
            inv_freq: config.rope.inv_freq(config.head_dim),
            attention_scaling: config.rope.attention_scaling(),
        };
        Ok(Self {
            config,
            local,
            params,
            rotary,
            comm: Arc::new(Solo),
        })
    }

    /// Runs every layer and the final norm: the hidden states `[T, d]` the LM head reads.
    pub fn forward_hidden(&self, backend: &B, batch: &PackedBatch) -> Result<B::Tensor> {
        let scale = self.softmax_scale();
        self.forward_layers(
            backend,
            &batch.tokens,
            &batch.positions,
            |_, q, k, v, out, _| backend.attention(q, k, v, &batch.cu_seqlens, scale, out),
        )
    }

    /// One engine step over the paged KV cache: this step's tokens (`layout` says which sequence
    /// and position each belongs to) write their K/V into `kv`, then attend to their whole cached
    /// context. Returns the hidden states `[T, d]` of this step's tokens.
    pub fn forward_paged(
        &self,
        backend: &B,
        tokens: &[u32],
        positions: &[u32],
        layout: &PagedLayout,
        kv: &mut PagedKv<B::Tensor>,
    ) -> Result<B::Tensor> {
        if kv.layers.len() != self.config.num_hidden_layers {
            bail!(
                "paged KV cache has {} layers, the model {}",
                kv.layers.len(),
                self.config.num_hidden_layers
            );
        }
        let scale = self.softmax_scale();
        self.forward_layers(backend, tokens, positions, |i, q, k, v, out, _| {
            let (k_cache, v_cache) = &mut kv.layers[i];
            backend.write_kv(k, v, &layout.slot_mapping, k_cache, v_cache)?;
            backend.paged_attention(q, k_cache, v_cache, layout, scale, out)
        })
    }

    pub(crate) fn softmax_scale(&self) -> f32 {
        1.0 / (self.config.head_dim as f32).sqrt()
    }

    /// The inference forward ([`Self::run_layers`] keeping nothing), with attention supplied by
    /// the caller (packed prefill or paged).
    fn forward_layers(
        &self,
        backend: &B,
        tokens: &[u32],
        positions: &[u32],
        mut attention: impl AttentionFn<B::Tensor>,
    ) -> Result<B::Tensor> {
        // `tokens`, `positions` and whatever `attention` captures are borrowed for the whole call:
        // the backend may upload them once for all layers.
        backend.begin_step();
        let ran = self.run_layers(
            backend,
            tokens,
            positions,
            Layout::AllRows,
            false,
            Keep::Nothing,
            &mut attention,
        );
        backend.end_step();
        Ok(ran?.0)
    }

    /// An empty paged KV cache for this model: per layer, K and V pools of
    /// `[num_blocks, block_size, kv_heads_local, head_dim]`.
    pub fn new_paged_kv(
        &self,
        backend: &B,
        num_blocks: usize,
        block_size: usize,
    ) -> Result<PagedKv<B::Tensor>> {
        let shape = [
            num_blocks,
            block_size,
            self.local.kv_heads_local,
            self.config.head_dim,
        ];
        // A new cache: graphs captured over another one (CUDA) must not replay on this one.
        backend.reset_graphs();
        let layers = (0..self.config.num_hidden_layers)
            .map(|_| Ok((backend.zeros(&shape)?, backend.zeros(&shape)?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(PagedKv {
            num_blocks,
            block_size,
            layers,
        })
    }

    /// Logits `[T, vocab_size]` for every token of the batch.
    pub fn forward_logits(&self, backend: &B, batch: &PackedBatch) -> Result<B::Tensor> {
        let hidden = self.forward_hidden(backend, batch)?;
        self.lm_head(backend, &hidden)
    }

    /// `hidden [T, d] -> logits [T, vocab_size]` (f32), on every rank: each rank's vocabulary
    /// shard of the LM head, then the shards' columns gathered.
    pub fn lm_head(&self, backend: &B, hidden: &B::Tensor) -> Result<B::Tensor> {
        let t = backend.shape(hidden)[0];
        let mut logits = backend.zeros_f32(&[t, self.local.vocab_local])?;
        backend.linear(hidden, self.params.lm_head_weight(), None, &mut logits)?;
        if self.local.tp_size == 1 {
            return Ok(logits);
        }
        let widths: Vec<usize> = self
            .config
            .shards(self.local.tp_size)?
            .iter()
            .map(|s| s.vocab_local)
            .collect();
        let mut all = backend.zeros_f32(&[t, self.config.vocab_size])?;
        self.comm
            .all_gather_columns(backend, &logits, &widths, &mut all)?;
        Ok(all)
    }
}
