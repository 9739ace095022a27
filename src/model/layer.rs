//! The decoder layer's forward: the only implementation, used by scoring and the engine (which
//! keep nothing) and by the trainer (which keeps the layer's input, or everything its backward
//! reads). One forward means the trainer's logprobs and the server's come from the same ops in the
//! same order (DESIGN.md decisions 1 and 10).
//!
//! One layer over a packed batch of `T` rows (what is kept for the backward is named):
//!
//! ```text
//! residual += pending ─ rmsnorm ─ normed_attn ─ q,k,v (+bias) ─ rope ─ attention ─ attn (+lse)
//!   (residual is now x_in)                                                          │
//! residual += o_proj(attn) ─ rmsnorm ─ normed_mlp ─ gate,up ─ silu(gate)*up ─ act ─ down_proj
//!   (residual is now x_mid)                                                         │
//! pending = down_proj(act) ◄────────────────────────────────────────────────────────┘
//! ```
//!
//! The residual add is fused into the next norm (`add_rmsnorm`: the sum is rounded to the
//! residual's precision, then normalised), so a layer's MLP output stays `pending` until the next
//! layer (or the final norm) adds it. A layer recomputed from its kept input starts with nothing
//! pending and a plain `rmsnorm` of that input: the same numbers as the fused add gave.
//!
//! Tensor parallelism ([`crate::model::parallel`]): q/k/v, gate/up are this rank's heads and MLP
//! columns; o_proj and down_proj give partial sums, reduced into `delta`; under sequence
//! parallelism the residual stream, `x_in` and `x_mid` are this rank's rows only, and each norm's
//! output is gathered to all rows (`normed_attn`, `normed_mlp` hold all rows).

use crate::backend::Backend;
use crate::model::params::LayerParams;
use crate::model::qwen2::{AttentionFn, Keep, Layout, Qwen2Model};
use anyhow::{anyhow, bail, ensure, Result};

/// Everything one layer's backward reads.
pub struct LayerActivations<T> {
    pub x_in: T,
    pub normed_attn: T,
    /// q and k after rope, `[T, heads_local, head_dim]` / `[T, kv_heads_local, head_dim]`.
    pub q: T,
    pub k: T,
    pub v: T,
    pub attn: T,
    /// `[T, heads_local]` f32 logsumexp of each attention row.
    pub lse: T,
    pub x_mid: T,
    pub normed_mlp: T,
    pub gate: T,
    pub up: T,
    pub act: T,
}

/// What the forward kept of one layer.
pub enum SavedLayer<T> {
    /// Checkpointed: the layer's input only; the backward recomputes the rest.
    Input(T),
    Full(LayerActivations<T>),
}

/// The residual stream between layers: `residual`, plus the previous layer's MLP output in
/// `delta` when `pending` (not yet added: the next norm adds it).
pub struct ResidualStream<T> {
    pub residual: T,
    pub delta: T,
    pub pending: bool,
}

/// The buffers one layer writes (besides the residual stream).
struct LayerBuffers<T> {
    /// Sequence parallelism only: a norm's output on this rank's rows (before the gather) and a
    /// row-parallel GEMM's partial sums over all rows (before the reduce-scatter).
    sequence: Option<(T, T)>,
    normed_attn: T,
    q: T,
    k: T,
    v: T,
    attn: T,
    lse: Option<T>,
    normed_mlp: T,
    gate: T,
    up: T,
    act: T,
}

impl<T> LayerBuffers<T> {
    /// The buffers a layer wrote, kept for its backward with its input and mid-layer residual.
    fn into_activations(self, index: usize, x_in: T, x_mid: T) -> Result<LayerActivations<T>> {
        Ok(LayerActivations {
            x_in,
            normed_attn: self.normed_attn,
            q: self.q,
            k: self.k,
            v: self.v,
            attn: self.attn,
            lse: self
                .lse
                .ok_or_else(|| anyhow!("layer {index}: no lse buffer to keep"))?,
            x_mid,
            normed_mlp: self.normed_mlp,
            gate: self.gate,
            up: self.up,
            act: self.act,
        })
    }
}

impl<B: Backend> Qwen2Model<B> {
    fn layer_buffers(
        &self,
        backend: &B,
        t: usize,
        layout: Layout,
        with_lse: bool,
    ) -> Result<LayerBuffers<B::Tensor>> {
        let (d, hd) = (self.config.hidden_size, self.config.head_dim);
        let (heads, kv_heads, inter) = (
            self.local.heads_local,
            self.local.kv_heads_local,
            self.local.intermediate_local,
        );
        let sequence = if self.sequence_parallel(layout) {
            let rows = self.residual_rows(t, layout);
            Some((backend.zeros(&[rows, d])?, backend.zeros(&[t, d])?))
        } else {
            None
        };
        Ok(LayerBuffers {
            sequence,
            normed_attn: backend.zeros(&[t, d])?,
            q: backend.zeros(&[t, heads, hd])?,
            k: backend.zeros(&[t, kv_heads, hd])?,
            v: backend.zeros(&[t, kv_heads, hd])?,
            attn: backend.zeros(&[t, heads, hd])?,
            lse: if with_lse {
                Some(backend.zeros_f32(&[t, heads])?)
            } else {
                None
            },
            normed_mlp: backend.zeros(&[t, d])?,
            gate: backend.zeros(&[t, inter])?,
            up: backend.zeros(&[t, inter])?,
            act: backend.zeros(&[t, inter])?,
        })
    }

    /// The embedding of `tokens` as a residual stream with nothing pending: each rank looks up
    /// the tokens of its vocabulary shard (zero rows for the others') and the ranks' rows are
    /// summed, into this rank's rows under sequence parallelism.
    pub(crate) fn embed(
        &self,
        backend: &B,
        tokens: &[u32],
        layout: Layout,
    ) -> Result<ResidualStream<B::Tensor>> {
        let d = self.config.hidden_size;
        let rows = self.residual_rows(tokens.len(), layout);
        let mut embedded = backend.zeros(&[tokens.len(), d])?;
        backend.embedding(
            &self.params.embed_tokens,
            &self.shard_ids(tokens),
            &mut embedded,
        )?;
        let residual = if self.sequence_parallel(layout) {
            let mut mine = backend.zeros(&[rows, d])?;
            self.reduce_partial(backend, layout, &mut embedded, Some(&mut mine))?;
            mine
        } else {
            self.reduce_partial(backend, layout, &mut embedded, None)?;
            embedded
        };
        Ok(ResidualStream {
            residual,
            delta: backend.zeros(&[rows, d])?,
            pending: false,
        })
    }

    /// Every layer from the embedding of `tokens`, keeping what `keep` says, then the final
    /// norm: returns the hidden states `[T, d]` (all rows) the LM head reads, the residual stream
    /// the final norm read (this rank's rows), and each layer's kept activations (empty with
    /// [`Keep::Nothing`]).
    #[allow(clippy::type_complexity, clippy::too_many_arguments)]
    pub(crate) fn run_layers(
        &self,
        backend: &B,
        tokens: &[u32],
        positions: &[u32],
        layout: Layout,
        with_lse: bool,
        keep: Keep,
        attention: &mut impl AttentionFn<B::Tensor>,
    ) -> Result<(B::Tensor, B::Tensor, Vec<SavedLayer<B::Tensor>>)> {
        let t = tokens.len();
        ensure!(t > 0, "forward of an empty batch");
        ensure!(
            positions.len() == t,
            "{t} tokens but {} positions",
            positions.len()
        );
        ensure!(
            !self.sequence_parallel(layout) || t.is_multiple_of(self.tp_size()),
            "a sequence-parallel forward of {t} rows over {} ranks (pad the batch)",
            self.tp_size()
        );
        let mut stream = self.embed(backend, tokens, layout)?;
        let with_lse = with_lse || keep == Keep::Everything;
        // Allocated by the first layer, reused by the next ones, or (keeping everything) moved
        // into each layer's activations and allocated again by the next.
        let mut buffers = None;
        let mut saved = Vec::new();
        for (i, layer) in self.params.layers.iter().enumerate() {
            let kept = self.forward_layer(
                backend,
                i,
                layer,
                &mut stream,
                positions,
                layout,
                &mut buffers,
                with_lse,
                keep,
                attention,
            )?;
            saved.extend(kept);
        }
        let d = self.config.hidden_size;
        let mut hidden = backend.zeros(&[t, d])?;
        if self.sequence_parallel(layout) {
            let rows = self.residual_rows(t, layout);
            let mut normed_local = match buffers.and_then(|b| b.sequence) {
                Some((normed_local, _)) => normed_local,
                None => backend.zeros(&[rows, d])?,
            };
            self.enter_norm(backend, &mut stream, &self.params.norm, &mut normed_local)?;
            self.gather_rows(backend, layout, &normed_local, &mut hidden)?;
        } else {
            self.enter_norm(backend, &mut stream, &self.params.norm, &mut hidden)?;
        }
        Ok((hidden, stream.residual, saved))
    }

    /// `out = rmsnorm(residual (+= delta, if pending))`.
    fn enter_norm(
        &self,
        backend: &B,
        stream: &mut ResidualStream<B::Tensor>,
        weight: &B::Tensor,
        out: &mut B::Tensor,
    ) -> Result<()> {
        let eps = self.config.rms_norm_eps as f32;
        if stream.pending {
            stream.pending = false;
            backend.add_rmsnorm(&mut stream.residual, &stream.delta, weight, eps, out)
        } else {
            backend.rmsnorm(&stream.residual, weight, eps, out)
        }
    }

    /// `normed = rmsnorm(residual (+= delta, if pending))` for every row: this rank's rows
    /// gathered under sequence parallelism.
    fn norm_all_rows(
        &self,
        backend: &B,
        stream: &mut ResidualStream<B::Tensor>,
        weight: &B::Tensor,
        layout: Layout,
        sequence: &mut Option<(B::Tensor, B::Tensor)>,
        normed: &mut B::Tensor,
    ) -> Result<()> {
        match sequence {
            Some((normed_local, _)) => {
                self.enter_norm(backend, stream, weight, normed_local)?;
                self.gather_rows(backend, layout, normed_local, normed)?;
                Ok(())
            }
            None => self.enter_norm(backend, stream, weight, normed),
        }
    }

    /// `delta = input W^T` for a row-parallel `W`: this rank's partial sums reduced over the
    /// ranks (all-reduced, or reduce-scattered to this rank's rows).
    fn row_parallel(
        &self,
        backend: &B,
        input: &B::Tensor,
        weight: &B::Tensor,
        layout: Layout,
        sequence: &mut Option<(B::Tensor, B::Tensor)>,
        delta: &mut B::Tensor,
    ) -> Result<()> {
        match sequence {
            Some((_, partial)) => {
                backend.linear(input, weight, None, partial)?;
                self.reduce_partial(backend, layout, partial, Some(delta))
            }
            None => {
                backend.linear(input, weight, None, delta)?;
                self.reduce_partial(backend, layout, delta, None)
            }
        }
    }

    /// Layer `index` (see the module doc): advances `stream` by one layer and returns what
    /// `keep` asks for. The layer writes into `buffers` (allocated here when `None`); with
    /// [`Keep::Everything`] they move into the result, leaving `None`.
    #[allow(clippy::too_many_arguments)]
    fn forward_layer(
        &self,
        backend: &B,
        index: usize,
        layer: &LayerParams<B::Tensor>,
        stream: &mut ResidualStream<B::Tensor>,
        positions: &[u32],
        layout: Layout,
        buffers: &mut Option<LayerBuffers<B::Tensor>>,
        with_lse: bool,
        keep: Keep,
        attention: &mut impl AttentionFn<B::Tensor>,
    ) -> Result<Option<SavedLayer<B::Tensor>>> {
        let t = positions.len();
        let rows = self.residual_rows(t, layout);
        if buffers.is_none() {
            *buffers = Some(self.layer_buffers(backend, t, layout, with_lse)?);
        }
        let b = buffers.as_mut().expect("allocated above");

        // Attention block.
        let ln = &layer.input_layernorm;
        self.norm_all_rows(
            backend,
            stream,
            ln,
            layout,
            &mut b.sequence,
            &mut b.normed_attn,
        )?;
        let x_in = match keep {
            Keep::Nothing => None,
            Keep::Input | Keep::Everything => Some(backend.slice_rows(&stream.residual, 0..rows)?),
        };
        let n = &b.normed_attn;
        backend.linear(n, &layer.q_proj_weight, Some(&layer.q_proj_bias), &mut b.q)?;
        backend.linear(n, &layer.k_proj_weight, Some(&layer.k_proj_bias), &mut b.k)?;
        backend.linear(n, &layer.v_proj_weight, Some(&layer.v_proj_bias), &mut b.v)?;
        backend.rope(&mut b.q, &mut b.k, positions, &self.rotary)?;
        attention(index, &b.q, &b.k, &b.v, &mut b.attn, b.lse.as_mut())?;
        let o = &layer.o_proj_weight;
        self.row_parallel(
            backend,
            &b.attn,
            o,
            layout,
            &mut b.sequence,
            &mut stream.delta,
        )?;

        // MLP block.
        stream.pending = true;
        let ln = &layer.post_attention_layernorm;
        self.norm_all_rows(
            backend,
            stream,
            ln,
            layout,
            &mut b.sequence,
            &mut b.normed_mlp,
        )?;
        let x_mid = match keep {
            Keep::Everything => Some(backend.slice_rows(&stream.residual, 0..rows)?),
            Keep::Nothing | Keep::Input => None,
        };
        backend.linear(&b.normed_mlp, &layer.gate_proj_weight, None, &mut b.gate)?;
        backend.linear(&b.normed_mlp, &layer.up_proj_weight, None, &mut b.up)?;
        backend.swiglu(&b.gate, &b.up, &mut b.act)?;
        let down = &layer.down_proj_weight;
        self.row_parallel(
            backend,
            &b.act,
            down,
            layout,
            &mut b.sequence,
            &mut stream.delta,
        )?;
        stream.pending = true;

        Ok(match (keep, x_in, x_mid) {
            (Keep::Input, Some(x_in), _) => Some(SavedLayer::Input(x_in)),
            (Keep::Everything, Some(x_in), Some(x_mid)) => {
                let used = buffers.take().expect("the layer's buffers");
                Some(SavedLayer::Full(used.into_activations(index, x_in, x_mid)?))
            }
            _ => None,
        })
    }

    /// One layer's activations recomputed from its kept input (activation checkpointing): the
    /// same [`Self::forward_layer`] the forward ran, so the same numbers.
    pub(crate) fn recompute_layer(
        &self,
        backend: &B,
        index: usize,
        x_in: B::Tensor,
        positions: &[u32],
        layout: Layout,
        attention: &mut impl AttentionFn<B::Tensor>,
    ) -> Result<LayerActivations<B::Tensor>> {
        let t = positions.len();
        let rows = self.residual_rows(t, layout);
        let mut stream = ResidualStream {
            residual: x_in,
            delta: backend.zeros(&[rows, self.config.hidden_size])?,
            pending: false,
        };
        let layer = &self.params.layers[index];
        match self.forward_layer(
            backend,
            index,
            layer,
            &mut stream,
            positions,
            layout,
            &mut None,
            true,
            Keep::Everything,
            attention,
        )? {
            Some(SavedLayer::Full(acts)) => Ok(acts),
            _ => bail!("layer {index}: the recompute kept no activations"),
        }
    }
}
