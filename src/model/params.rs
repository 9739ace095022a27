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

/// A split along a dimension: `(dimension, range)`.
type Split = Option<(usize, std::ops::Range<usize>)>;

/// One rank's ranges of a layer's tensors (see `config::shard`).
struct Slices {
    d: usize,
    tp: bool,
    /// Query-head and KV-head rows (`heads x head_dim`), MLP columns, and their whole sizes.
    heads: std::ops::Range<usize>,
    kv: std::ops::Range<usize>,
    inter: std::ops::Range<usize>,
    q_all: usize,
    kv_all: usize,
    inter_all: usize,
    kv_replicated: bool,
}

impl Slices {
    fn new(config: &ModelConfig, local: &LocalSizes) -> Self {
        let hd = config.head_dim;
        Self {
            d: config.hidden_size,
            tp: local.tp_size > 1,
            heads: local.head_start * hd..(local.head_start + local.heads_local) * hd,
            kv: local.kv_head_start * hd..(local.kv_head_start + local.kv_heads_local) * hd,
            inter: local.intermediate_start..local.intermediate_start + local.intermediate_local,
            q_all: config.num_attention_heads * hd,
            kv_all: config.num_key_value_heads * hd,
            inter_all: config.intermediate_size,
            kv_replicated: local.kv_replicated,
        }
    }

    /// Layer `i`'s tensors, each made by `param(name, kind, whole shape, split, replicated)`, in
    /// the order of [`LayerParams`]' fields.
    fn layer<T>(
        &self,
        i: usize,
        param: &mut impl FnMut(&str, ParamKind, &[usize], Split, bool) -> Result<T>,
    ) -> Result<LayerParams<T>> {
        let mut tensors =
            self.layer_tensors()
                .into_iter()
                .map(|(name, kind, full, split, replicated)| {
                    param(
                        &format!("model.layers.{i}.{name}"),
                        kind,
                        &full,
                        split,
                        replicated,
                    )
                });
        let mut next = || tensors.next().expect("twelve tensors");
        Ok(LayerParams {
            input_layernorm: next()?,
            q_proj_weight: next()?,
            q_proj_bias: next()?,
            k_proj_weight: next()?,
            k_proj_bias: next()?,
            v_proj_weight: next()?,
            v_proj_bias: next()?,
            o_proj_weight: next()?,
            post_attention_layernorm: next()?,
            gate_proj_weight: next()?,
            up_proj_weight: next()?,
            down_proj_weight: next()?,
        })
    }

    /// A layer's tensors: (name after `model.layers.N.`, kind, whole shape, this rank's split,
    /// replicated), in the order of [`LayerParams`]' fields.
    fn layer_tensors(&self) -> [(&'static str, ParamKind, Vec<usize>, Split, bool); 12] {
        use ParamKind::*;
        let (d, rep, tp) = (self.d, self.kv_replicated, self.tp);
        let rows = |r: &std::ops::Range<usize>| Some((0, r.clone()));
        let cols = |r: &std::ops::Range<usize>| Some((1, r.clone()));
        let (q, kv, inter) = (&self.heads, &self.kv, &self.inter);
        let (q_all, kv_all, inter_all) = (self.q_all, self.kv_all, self.inter_all);
        [
            ("input_layernorm.weight", Norm, vec![d], None, tp),
            (
                "self_attn.q_proj.weight",
                ColumnParallel,
                vec![q_all, d],
                rows(q),
                false,
            ),
            (
                "self_attn.q_proj.bias",
                ColumnParallel,
                vec![q_all],
                rows(q),
                false,
            ),
            (
                "self_attn.k_proj.weight",
                ColumnParallel,
                vec![kv_all, d],
                rows(kv),
                rep,
            ),
            (
                "self_attn.k_proj.bias",
                ColumnParallel,
                vec![kv_all],
                rows(kv),
                rep,
            ),
            (
                "self_attn.v_proj.weight",
                ColumnParallel,
                vec![kv_all, d],
                rows(kv),
                rep,
            ),
            (
                "self_attn.v_proj.bias",
                ColumnParallel,
                vec![kv_all],
                rows(kv),
                rep,
            ),
            (
                "self_attn.o_proj.weight",
                RowParallel,
                vec![d, q_all],
                cols(q),
                false,
            ),
            ("post_attention_layernorm.weight", Norm, vec![d], None, tp),
            (
                "mlp.gate_proj.weight",
                ColumnParallel,
                vec![inter_all, d],
                rows(inter),
                false,
            ),
            (
                "mlp.up_proj.weight",
                ColumnParallel,
                vec![inter_all, d],
                rows(inter),
                false,
            ),
            (
                "mlp.down_proj.weight",
                RowParallel,
                vec![d, inter_all],
                cols(inter),
                false,
            ),
        ]
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
        let slices = Slices::new(config, local);
        let d = config.hidden_size;
        let mut param = |name: &str, kind, full: &[usize], split, replicated| {
            let shard = ParamShard::new(kind, full, split, replicated);
            make(name, &shard.local_shape(), &shard)
        };
        let vocab = Some((0, local.vocab_range()));
        let embed_tokens = param(
            "model.embed_tokens.weight",
            ParamKind::ColumnParallel,
            &[config.vocab_size, d],
            vocab.clone(),
            false,
        )?;
        let layers = (0..config.num_hidden_layers)
            .map(|i| slices.layer(i, &mut param))
            .collect::<Result<Vec<_>>>()?;
        let norm = param("model.norm.weight", ParamKind::Norm, &[d], None, slices.tp)?;
        let lm_head = if config.tie_word_embeddings {
            None
        } else {
            let full = [config.vocab_size, d];
            Some(param(
                "lm_head.weight",
                ParamKind::ColumnParallel,
                &full,
                vocab,
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
