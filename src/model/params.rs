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

impl<T> Qwen2Params<T> {
    /// Tensors of one decoder layer (the fields of [`LayerParams`]).
    pub const TENSORS_PER_LAYER: usize = 12;

    /// Builds every parameter in checkpoint order by calling `make(hf_name, local_shape, kind)`.
    pub fn try_build(
        config: &ModelConfig,
        local: &LocalSizes,
        mut make: impl FnMut(&str, &[usize], ParamKind) -> Result<T>,
    ) -> Result<Self> {
        use ParamKind::*;
        let d = config.hidden_size;
        let hd = config.head_dim;
        let q = local.heads_local * hd;
        let kv = local.kv_heads_local * hd;
        let inter = local.intermediate_local;
        let embed_tokens = make(
            "model.embed_tokens.weight",
            &[local.vocab_local, d],
            ColumnParallel,
        )?;
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for i in 0..config.num_hidden_layers {
            let p = format!("model.layers.{i}");
            layers.push(LayerParams {
                input_layernorm: make(&format!("{p}.input_layernorm.weight"), &[d], Norm)?,
                q_proj_weight: make(
                    &format!("{p}.self_attn.q_proj.weight"),
                    &[q, d],
                    ColumnParallel,
                )?,
                q_proj_bias: make(&format!("{p}.self_attn.q_proj.bias"), &[q], ColumnParallel)?,
                k_proj_weight: make(
                    &format!("{p}.self_attn.k_proj.weight"),
                    &[kv, d],
                    ColumnParallel,
                )?,
                k_proj_bias: make(&format!("{p}.self_attn.k_proj.bias"), &[kv], ColumnParallel)?,
                v_proj_weight: make(
                    &format!("{p}.self_attn.v_proj.weight"),
                    &[kv, d],
                    ColumnParallel,
                )?,
                v_proj_bias: make(&format!("{p}.self_attn.v_proj.bias"), &[kv], ColumnParallel)?,
                o_proj_weight: make(
                    &format!("{p}.self_attn.o_proj.weight"),
                    &[d, q],
                    RowParallel,
                )?,
                post_attention_layernorm: make(
                    &format!("{p}.post_attention_layernorm.weight"),
                    &[d],
                    Norm,
                )?,
                gate_proj_weight: make(
                    &format!("{p}.mlp.gate_proj.weight"),
                    &[inter, d],
                    ColumnParallel,
                )?,
                up_proj_weight: make(
                    &format!("{p}.mlp.up_proj.weight"),
                    &[inter, d],
                    ColumnParallel,
                )?,
                down_proj_weight: make(
                    &format!("{p}.mlp.down_proj.weight"),
                    &[d, inter],
                    RowParallel,
                )?,
            });
        }
        let norm = make("model.norm.weight", &[d], Norm)?;
        let lm_head = if config.tie_word_embeddings {
            None
        } else {
            Some(make(
                "lm_head.weight",
                &[local.vocab_local, d],
                ColumnParallel,
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
