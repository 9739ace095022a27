//! The parameters of a Qwen2 model, their HF names and their shapes on one tensor-parallel rank.
//!
//! `Qwen2Params<T>` is generic over the storage: checkpoint views while loading, backend tensors
//! when running. [`Qwen2Params::try_build`] visits every expected tensor in a fixed order with
//! its HF name and local shape, so the checkpoint loader, the synthetic-model builder and the
//! checkpoint writer all agree on one layout.

use crate::config::{LocalSizes, ModelConfig};
use anyhow::Result;

#[derive(Clone, Debug)]
pub struct LayerParams<T> {
    pub input_layernorm: T,
    pub q_proj_weight: T,
    pub q_proj_bias: T,
    pub k_proj_weight: T,
    pub k_proj_bias: T,
    pub v_proj_weight: T,
    pub v_proj_bias: T,
    pub o_proj_weight: T,
    pub post_attention_layernorm: T,
    pub gate_proj_weight: T,
    pub up_proj_weight: T,
    pub down_proj_weight: T,
}

#[derive(Clone, Debug)]
pub struct Qwen2Params<T> {
    pub embed_tokens: T,
    pub layers: Vec<LayerParams<T>>,
    pub norm: T,
    /// `None` when the LM head is tied to `embed_tokens`.
    pub lm_head: Option<T>,
}

/// What kind of parameter a tensor is; tells how tensor parallelism slices it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamKind {
    /// Norm weights: replicated.
    Norm,
    /// Split along the output rows (q/k/v with bias, gate/up; embedding and LM head by vocabulary).
    ColumnParallel,
    /// Split along the input columns (o_proj, down_proj).
    RowParallel,
}

/// Where one rank's tensor sits in the whole one (Megatron layout, `config::shard`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamShard {
    pub kind: ParamKind,
    /// The whole tensor's shape, as in an HF checkpoint.
    pub full_shape: Vec<usize>,
    /// The dimension this rank's slice runs along and its range there; `None`: the whole tensor
    /// (norms, and everything at TP 1).
    pub split: Option<(usize, std::ops::Range<usize>)>,
    /// Other ranks hold the same values (norms at TP > 1; KV heads when there are fewer than
    /// ranks): their gradients are partial sums, or copies, to be combined across ranks.
    pub replicated: bool,
}

impl ParamShard {
    /// The slice of the whole tensor with `range` along `dim` (`None` for the whole).
    fn new(
        kind: ParamKind,
        full_shape: &[usize],
        split: Option<(usize, std::ops::Range<usize>)>,
        replicated: bool,
    ) -> Self {
        let split = split.filter(|(dim, range)| *range != (0..full_shape[*dim]));
        Self {
            kind,
            full_shape: full_shape.to_vec(),
            split,
            replicated,
        }
    }

    /// Writes this rank's `local` values (row-major, [`Self::local_shape`]) into their place in
    /// `whole` (row-major, `full_shape`): how checkpoints gather the ranks' pieces.
    pub fn place<T: Copy>(&self, local: &[T], whole: &mut [T]) {
        match &self.split {
            None => whole.copy_from_slice(local),
            Some((dim, range)) => {
                let (outer, extent, inner) = self.geometry(*dim);
                let run = range.len() * inner;
                for o in 0..outer {
                    let at = (o * extent + range.start) * inner;
                    whole[at..at + run].copy_from_slice(&local[o * run..(o + 1) * run]);
                }
            }
        }
    }

    /// This rank's slice of `whole` (row-major, `full_shape`), row-major in its local shape.
    pub fn take<T: Copy>(&self, whole: &[T]) -> Vec<T> {
        match &self.split {
            None => whole.to_vec(),
            Some((dim, range)) => {
                let (outer, extent, inner) = self.geometry(*dim);
                let run = range.len() * inner;
                let mut out = Vec::with_capacity(outer * run);
                for o in 0..outer {
                    let at = (o * extent + range.start) * inner;
                    out.extend_from_slice(&whole[at..at + run]);
                }
                out
            }
        }
    }

    /// (elements before `dim`, its extent, elements after it) of the whole tensor.
    fn geometry(&self, dim: usize) -> (usize, usize, usize) {
        let shape = &self.full_shape;
        (
            shape[..dim].iter().product(),
            shape[dim],
            shape[dim + 1..].iter().product(),
        )
    }

    /// This rank's shape.
    pub fn local_shape(&self) -> Vec<usize> {
        let mut shape = self.full_shape.clone();
        if let Some((dim, range)) = &self.split {
            shape[*dim] = range.len();
        }
        shape
    }
}

impl<T> Qwen2Params<T> {
    /// Tensors of one decoder layer (the fields of [`LayerParams`]).
    pub const TENSORS_PER_LAYER: usize = 12;

    /// Builds every parameter in checkpoint order by calling `make(hf_name, local_shape, shard)`
    /// for this rank's part (`local`) of each tensor.
    pub fn try_build(
        config: &ModelConfig,
        local: &LocalSizes,
        mut make: impl FnMut(&str, &[usize], &ParamShard) -> Result<T>,
    ) -> Result<Self> {
        use ParamKind::*;
        let d = config.hidden_size;
        let hd = config.head_dim;
        let tp = local.tp_size > 1;
        let heads = (local.head_start * hd)..(local.head_start + local.heads_local) * hd;
        let kv = (local.kv_head_start * hd)..(local.kv_head_start + local.kv_heads_local) * hd;
        let (q_all, kv_all) = (
            config.num_attention_heads * hd,
            config.num_key_value_heads * hd,
        );
        let inter = local.intermediate_start..local.intermediate_start + local.intermediate_local;
        let inter_all = config.intermediate_size;
        let vocab = local.vocab_range();
        let mut param = |name: &str,
                         kind,
                         full: &[usize],
                         split: Option<(usize, std::ops::Range<usize>)>,
                         replicated| {
            let shard = ParamShard::new(kind, full, split, replicated);
            make(name, &shard.local_shape(), &shard)
        };
        let embed_tokens = param(
            "model.embed_tokens.weight",
            ColumnParallel,
            &[config.vocab_size, d],
            Some((0, vocab.clone())),
            false,
        )?;
        let kv_replicated = local.kv_replicated;
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for i in 0..config.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let rows = |r: &std::ops::Range<usize>| Some((0, r.clone()));
            let cols = |r: &std::ops::Range<usize>| Some((1, r.clone()));
            layers.push(LayerParams {
                input_layernorm: param(
                    &format!("{p}.input_layernorm.weight"),
                    Norm,
                    &[d],
                    None,
                    tp,
                )?,
                q_proj_weight: param(
                    &format!("{p}.self_attn.q_proj.weight"),
                    ColumnParallel,
                    &[q_all, d],
                    rows(&heads),
                    false,
                )?,
                q_proj_bias: param(
                    &format!("{p}.self_attn.q_proj.bias"),
                    ColumnParallel,
                    &[q_all],
                    rows(&heads),
                    false,
                )?,
                k_proj_weight: param(
                    &format!("{p}.self_attn.k_proj.weight"),
                    ColumnParallel,
                    &[kv_all, d],
                    rows(&kv),
                    kv_replicated,
                )?,
                k_proj_bias: param(
                    &format!("{p}.self_attn.k_proj.bias"),
                    ColumnParallel,
                    &[kv_all],
                    rows(&kv),
                    kv_replicated,
                )?,
                v_proj_weight: param(
                    &format!("{p}.self_attn.v_proj.weight"),
                    ColumnParallel,
                    &[kv_all, d],
                    rows(&kv),
                    kv_replicated,
                )?,
                v_proj_bias: param(
                    &format!("{p}.self_attn.v_proj.bias"),
                    ColumnParallel,
                    &[kv_all],
                    rows(&kv),
                    kv_replicated,
                )?,
                o_proj_weight: param(
                    &format!("{p}.self_attn.o_proj.weight"),
                    RowParallel,
                    &[d, q_all],
                    cols(&heads),
                    false,
                )?,
                post_attention_layernorm: param(
                    &format!("{p}.post_attention_layernorm.weight"),
                    Norm,
                    &[d],
                    None,
                    tp,
                )?,
                gate_proj_weight: param(
                    &format!("{p}.mlp.gate_proj.weight"),
                    ColumnParallel,
                    &[inter_all, d],
                    rows(&inter),
                    false,
                )?,
                up_proj_weight: param(
                    &format!("{p}.mlp.up_proj.weight"),
                    ColumnParallel,
                    &[inter_all, d],
                    rows(&inter),
                    false,
                )?,
                down_proj_weight: param(
                    &format!("{p}.mlp.down_proj.weight"),
                    RowParallel,
                    &[d, inter_all],
                    cols(&inter),
                    false,
                )?,
            });
        }
        let norm = param("model.norm.weight", Norm, &[d], None, tp)?;
        let lm_head = if config.tie_word_embeddings {
            None
        } else {
            Some(param(
                "lm_head.weight",
                ColumnParallel,
                &[config.vocab_size, d],
                Some((0, vocab)),
                false,
            )?)
        };
        Ok(Self {
            embed_tokens,
            layers,
            norm,
            lm_head,
        })
    }

    /// Every parameter in checkpoint order (the order [`Qwen2Params::try_build`] visits them).
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        std::iter::once(&self.embed_tokens)
            .chain(self.layers.iter().flat_map(|l| {
                [
                    &l.input_layernorm,
                    &l.q_proj_weight,
                    &l.q_proj_bias,
                    &l.k_proj_weight,
                    &l.k_proj_bias,
                    &l.v_proj_weight,
                    &l.v_proj_bias,
                    &l.o_proj_weight,
                    &l.post_attention_layernorm,
                    &l.gate_proj_weight,
                    &l.up_proj_weight,
                    &l.down_proj_weight,
                ]
            }))
            .chain(std::iter::once(&self.norm))
            .chain(self.lm_head.iter())
    }

    /// Every parameter in checkpoint order, mutably (gradients, optimizer masters).
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut T> {
        std::iter::once(&mut self.embed_tokens)
            .chain(self.layers.iter_mut().flat_map(|l| {
                [
                    &mut l.input_layernorm,
                    &mut l.q_proj_weight,
                    &mut l.q_proj_bias,
                    &mut l.k_proj_weight,
                    &mut l.k_proj_bias,
                    &mut l.v_proj_weight,
                    &mut l.v_proj_bias,
                    &mut l.o_proj_weight,
                    &mut l.post_attention_layernorm,
                    &mut l.gate_proj_weight,
                    &mut l.up_proj_weight,
                    &mut l.down_proj_weight,
                ]
            }))
            .chain(std::iter::once(&mut self.norm))
            .chain(self.lm_head.iter_mut())
    }

    /// The LM head weight, mutably (its gradient, when tied, is the embedding's).
    pub fn lm_head_weight_mut(&mut self) -> &mut T {
        self.lm_head.as_mut().unwrap_or(&mut self.embed_tokens)
    }

    /// The LM head weight `[vocab_local, hidden]`: `lm_head` or, when tied, the embedding.
    pub fn lm_head_weight(&self) -> &T {
        self.lm_head.as_ref().unwrap_or(&self.embed_tokens)
    }

    /// HF names and this rank's [`ParamShard`] of every tensor, in checkpoint order.
    pub fn shards(config: &ModelConfig, local: &LocalSizes) -> Vec<(String, ParamShard)> {
        let mut out = Vec::new();
        Qwen2Params::<()>::try_build(config, local, |name, _, shard| {
            out.push((name.to_string(), shard.clone()));
            Ok(())
        })
        .expect("listing names cannot fail");
        out
    }

    /// HF names and local shapes of every tensor a checkpoint of `config` holds, in order.
    pub fn expected_tensors(config: &ModelConfig, local: &LocalSizes) -> Vec<(String, Vec<usize>)> {
        let mut out = Vec::new();
        Qwen2Params::<()>::try_build(config, local, |name, shape, _| {
            out.push((name.to_string(), shape.to_vec()));
            Ok(())
        })
        .expect("listing names cannot fail");
        out
    }
}
