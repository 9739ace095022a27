//! Training: the shared layer forward ([`crate::model::layer`]) keeping what the backward needs,
//! and the backward, written by hand as the forward in reverse (no autograd graph), over
//! [`BackendGrad`].
//!
//! One layer, forward (what is saved is named; `x_out` is the next layer's input, the fused add
//! of the next norm) and backward:
//!
//! ```text
//! x_in ─ rmsnorm ─ normed_attn ─ q,k,v (+bias) ─ rope ─ q,k,v ─ attention ─ attn (+lse) ─ o_proj ─┐
//! x_in ──────────────────────────────────────────────────────────────────────────────────── + ────┴─ x_mid
//! x_mid ─ rmsnorm ─ normed_mlp ─ gate,up ─ silu(gate)*up ─ act ─ down_proj ─┐
//! x_mid ─────────────────────────────────────────────────────────────────── + ─ x_out
//!
//! backward: d_x (the residual stream's gradient, one buffer) enters as d x_out and leaves as
//! d x_in: the skip paths pass it through unchanged, each norm's backward adds its branch.
//! ```
//!
//! Activation checkpointing (on by default): the forward keeps only each layer's input `x_in`,
//! and the backward recomputes that layer's activations from it (the same ops, so the same
//! numbers) just before running its backward. Memory is then `layers x [T, d]` plus one layer's
//! activations, instead of every layer's.
//!
//! With tensor parallelism the training forward is sequence-parallel ([`Layout::Sequence`]: the
//! batch is padded to a multiple of the ranks, kept inputs are `[T / tp, d]`), the loss is
//! vocabulary-parallel (each rank's shard's row statistics merged before the host half), and the
//! backward mirrors each collective: the gradient of an all-gather of rows is a reduce-scatter,
//! and the reverse. Norm and replicated-KV gradients are partial per rank until
//! [`Qwen2Model::reduce_replicated_grads`] (once per optimizer step).

use crate::backend::grad::BackendGrad;
use crate::backend::loss::{check_rows, finish_rows, LossOutput, LossRows, Objective};
use crate::model::layer::{LayerActivations, SavedLayer};
use crate::model::params::{LayerParams, Qwen2Params};
use crate::model::qwen2::{AttentionFn, Keep, Layout, PackedBatch, Qwen2Model};
use anyhow::{bail, ensure, Result};

/// The training forward's result: the final hidden states (what the LM head reads) and what the
/// backward needs.
pub struct TrainActivations<T> {
    pub layers: Vec<SavedLayer<T>>,
    /// The residual stream after the last layer (the final norm's input).
    pub final_residual: T,
    /// `[T, d]`: the final norm's output.
    pub hidden: T,
}

impl<B: BackendGrad> Qwen2Model<B> {
    /// Zero gradients shaped like the parameters (f32 on every backend). A tied model has no
    /// `lm_head` entry: the LM head's gradient goes into `embed_tokens`.
    pub fn zero_grads(&self, backend: &B) -> Result<Qwen2Params<B::Tensor>> {
        let params: Vec<&B::Tensor> = self.params.iter().collect();
        let mut next = params.into_iter();
        Qwen2Params::try_build(&self.config, &self.local, |name, shape, _| {
            let param = next
                .next()
                .ok_or_else(|| anyhow::anyhow!("parameters end before {name}"))?;
            debug_assert_eq!(backend.shape(param), shape);
            backend.zeros_f32(shape)
        })
    }

    /// The forward pass for training: the layer forward every path shares, with attention that
    /// also gives its logsumexp, sequence-parallel over the tensor-parallel ranks (`batch` must be
    /// padded to a multiple of them: [`PackedBatch::padded_to`]). With `checkpoint_layers`, keeps
    /// only each layer's input.
    pub fn forward_train(
        &self,
        backend: &B,
        batch: &PackedBatch,
        checkpoint_layers: bool,
    ) -> Result<TrainActivations<B::Tensor>> {
        let keep = if checkpoint_layers {
            Keep::Input
        } else {
            Keep::Everything
        };
        self.forward_keeping(backend, batch, keep)
    }

    /// Per row of `batch`, `log p(targets[r])` under the current weights, through exactly the
    /// path [`Self::loss_and_backward`] takes (the same forward, the fused loss's forward), with
    /// no gradient: DAPO's recomputed old logprobs, so the ratio is 1 before the first update.
    pub fn train_logprobs(
        &self,
        backend: &B,
        batch: &PackedBatch,
        targets: &[u32],
    ) -> Result<Vec<f32>> {
        let t = batch.num_tokens();
        let no_action = vec![false; t];
        let rows = LossRows {
            targets,
            action_mask: &no_action,
            ..Default::default()
        };
        check_rows(&rows, &Objective::MaskedCe, t, self.config.vocab_size)?;
        let padded = batch.padded_to(self.tp_size());
        let ran = self.forward_keeping(backend, &padded, Keep::Nothing)?;
        let targets = pad_rows(targets, padded.num_tokens(), 0);
        let stats = self.vocab_stats(backend, &ran.hidden, &targets)?;
        let (out, _, _) = finish_rows(&stats[..t], &rows, &Objective::MaskedCe, 1.0);
        Ok(out.logprobs)
    }

    /// Pass 1 of the fused loss over this rank's vocabulary shard, merged over the ranks.
    fn vocab_stats(
        &self,
        backend: &B,
        hidden: &B::Tensor,
        targets: &[u32],
    ) -> Result<Vec<crate::backend::loss::RowStats>> {
        let weight = self.params.lm_head_weight();
        let local = backend.lm_head_stats(hidden, weight, &self.shard_ids(targets))?;
        self.merge_vocab_stats(local, targets)
    }

    fn forward_keeping(
        &self,
        backend: &B,
        batch: &PackedBatch,
        keep: Keep,
    ) -> Result<TrainActivations<B::Tensor>> {
        let mut attention = self.training_attention(backend, batch);
        backend.begin_step();
        let ran = self.run_layers(
            backend,
            &batch.tokens,
            &batch.positions,
            Layout::Sequence,
            true,
            keep,
            &mut attention,
        );
        backend.end_step();
        let (hidden, final_residual, layers) = ran?;
        Ok(TrainActivations {
            layers,
            final_residual,
            hidden,
        })
    }

    /// Packed causal attention that also writes each row's logsumexp (what the backward reads).
    fn training_attention<'a>(
        &self,
        backend: &'a B,
        batch: &'a PackedBatch,
    ) -> impl AttentionFn<B::Tensor> + 'a {
        let scale = self.softmax_scale();
        move |_, q, k, v, out, lse| match lse {
            Some(lse) => backend.attention_with_lse(q, k, v, &batch.cu_seqlens, scale, out, lse),
            None => bail!("training attention without an lse buffer"),
        }
    }

    /// The backward pass from `d_hidden` (the loss's gradient with respect to the final hidden
    /// states, all rows; with tensor parallelism this rank's vocabulary shard's part of it),
    /// accumulating every parameter's gradient into `grads`. `batch` is the one the forward ran
    /// (padded).
    pub fn backward(
        &self,
        backend: &B,
        batch: &PackedBatch,
        saved: TrainActivations<B::Tensor>,
        d_hidden: &mut B::Tensor,
        grads: &mut Qwen2Params<B::Tensor>,
    ) -> Result<()> {
        let layout = Layout::Sequence;
        let t = batch.num_tokens();
        let rows = self.residual_rows(t, layout);
        let d = self.config.hidden_size;
        let eps = self.config.rms_norm_eps as f32;
        // The final norm ran on this rank's rows, then its rows were gathered: the ranks' parts
        // of d_hidden sum, and this rank keeps its rows.
        let mut d_mine = backend.zeros(&[rows, d])?;
        let d_hidden = self.reduce_grad_rows(backend, layout, d_hidden, &mut d_mine)?;
        let mut d_x = backend.zeros(&[rows, d])?;
        backend.rmsnorm_backward(
            &saved.final_residual,
            &self.params.norm,
            eps,
            d_hidden,
            &mut d_x,
            &mut grads.norm,
        )?;
        let mut layers = saved.layers;
        for i in (0..self.params.layers.len()).rev() {
            let layer = &self.params.layers[i];
            let acts = match layers.pop() {
                Some(SavedLayer::Full(acts)) => acts,
                Some(SavedLayer::Input(x_in)) => self.recompute_layer(
                    backend,
                    i,
                    x_in,
                    &batch.positions,
                    layout,
                    &mut self.training_attention(backend, batch),
                )?,
                None => bail!("backward: no saved activations for layer {i}"),
            };
            self.layer_backward(backend, layer, batch, &acts, &mut d_x, &mut grads.layers[i])?;
        }
        let mut d_all = backend.zeros(&[t, d])?;
        let d_embedded = self.gather_rows(backend, layout, &d_x, &mut d_all)?;
        let ids = self.shard_ids(&batch.tokens);
        backend.embedding_backward(d_embedded, &ids, &mut grads.embed_tokens)
    }

    /// The gradient of a column-parallel GEMM's input, partial on each rank (`partial`, all
    /// rows), made the gradient of the norm that fed it: reduce-scattered to this rank's rows
    /// into `mine` under sequence parallelism, all-reduced in place otherwise (the mirror of
    /// [`Self::gather_rows`]). Returns which of the two holds it.
    fn reduce_grad_rows<'t>(
        &self,
        backend: &B,
        layout: Layout,
        partial: &'t mut B::Tensor,
        mine: &'t mut B::Tensor,
    ) -> Result<&'t B::Tensor> {
        if self.sequence_parallel(layout) {
            self.comm.reduce_scatter_rows(backend, partial, mine)?;
            Ok(mine)
        } else {
            self.reduce_partial(backend, layout, partial, None)?;
            Ok(partial)
        }
    }

    /// One layer's backward: `d_x` (this rank's rows) enters as the gradient of the layer's
    /// output and leaves as that of its input.
    fn layer_backward(
        &self,
        backend: &B,
        layer: &LayerParams<B::Tensor>,
        batch: &PackedBatch,
        acts: &LayerActivations<B::Tensor>,
        d_x: &mut B::Tensor,
        grads: &mut LayerParams<B::Tensor>,
    ) -> Result<()> {
        let t = batch.num_tokens();
        let d = self.config.hidden_size;
        let mut d_all = backend.zeros(&[t, d])?;
        let mut d_normed = backend.zeros(&[t, d])?;
        let mut d_mine = backend.zeros(backend.shape(d_x))?;
        self.mlp_backward(
            backend,
            layer,
            acts,
            d_x,
            grads,
            &mut d_all,
            &mut d_normed,
            &mut d_mine,
        )?;
        backend.fill_zero(&mut d_normed)?;
        self.attention_backward(
            backend,
            layer,
            batch,
            acts,
            d_x,
            grads,
            &mut d_all,
            &mut d_normed,
            &mut d_mine,
        )
    }

    /// The MLP block's backward: `x_out = x_mid + down(silu(gate(n)) * up(n))`,
    /// `n = rmsnorm(x_mid)`. `d_all`, `d_normed` (zero) and `d_mine` are scratch.
    #[allow(clippy::too_many_arguments)]
    fn mlp_backward(
        &self,
        backend: &B,
        layer: &LayerParams<B::Tensor>,
        acts: &LayerActivations<B::Tensor>,
        d_x: &mut B::Tensor,
        grads: &mut LayerParams<B::Tensor>,
        d_all: &mut B::Tensor,
        d_normed: &mut B::Tensor,
        d_mine: &mut B::Tensor,
    ) -> Result<()> {
        let layout = Layout::Sequence;
        let t = backend.shape(&acts.act)[0];
        let inter = self.local.intermediate_local;
        let eps = self.config.rms_norm_eps as f32;
        let d_out = self.gather_rows(backend, layout, d_x, d_all)?;
        let mut d_act = backend.zeros(&[t, inter])?;
        backend.linear_backward(
            &acts.act,
            &layer.down_proj_weight,
            d_out,
            &mut d_act,
            &mut grads.down_proj_weight,
            None,
        )?;
        let mut d_gate = backend.zeros(&[t, inter])?;
        let mut d_up = backend.zeros(&[t, inter])?;
        backend.swiglu_backward(&acts.gate, &acts.up, &d_act, &mut d_gate, &mut d_up)?;
        backend.linear_backward(
            &acts.normed_mlp,
            &layer.gate_proj_weight,
            &d_gate,
            d_normed,
            &mut grads.gate_proj_weight,
            None,
        )?;
        backend.linear_backward(
            &acts.normed_mlp,
            &layer.up_proj_weight,
            &d_up,
            d_normed,
            &mut grads.up_proj_weight,
            None,
        )?;
        let d_normed = self.reduce_grad_rows(backend, layout, d_normed, d_mine)?;
        backend.rmsnorm_backward(
            &acts.x_mid,
            &layer.post_attention_layernorm,
            eps,
            d_normed,
            d_x,
            &mut grads.post_attention_layernorm,
        )
    }

    /// The attention block's backward:
    /// `x_mid = x_in + o(attention(rope(q(n)), rope(k(n)), v(n)))`, `n = rmsnorm(x_in)`.
    #[allow(clippy::too_many_arguments)]
    fn attention_backward(
        &self,
        backend: &B,
        layer: &LayerParams<B::Tensor>,
        batch: &PackedBatch,
        acts: &LayerActivations<B::Tensor>,
        d_x: &mut B::Tensor,
        grads: &mut LayerParams<B::Tensor>,
        d_all: &mut B::Tensor,
        d_normed: &mut B::Tensor,
        d_mine: &mut B::Tensor,
    ) -> Result<()> {
        let layout = Layout::Sequence;
        let t = batch.num_tokens();
        let hd = self.config.head_dim;
        let (heads, kv_heads) = (self.local.heads_local, self.local.kv_heads_local);
        let eps = self.config.rms_norm_eps as f32;
        let d_out = self.gather_rows(backend, layout, d_x, d_all)?;
        let mut d_attn = backend.zeros(&[t, heads, hd])?;
        backend.linear_backward(
            &acts.attn,
            &layer.o_proj_weight,
            d_out,
            &mut d_attn,
            &mut grads.o_proj_weight,
            None,
        )?;
        let mut d_q = backend.zeros(&[t, heads, hd])?;
        let mut d_k = backend.zeros(&[t, kv_heads, hd])?;
        let mut d_v = backend.zeros(&[t, kv_heads, hd])?;
        backend.attention_backward(
            &acts.q,
            &acts.k,
            &acts.v,
            &acts.attn,
            &acts.lse,
            &d_attn,
            &batch.cu_seqlens,
            self.softmax_scale(),
            &mut d_q,
            &mut d_k,
            &mut d_v,
        )?;
        backend.rope_backward(&mut d_q, &mut d_k, &batch.positions, &self.rotary)?;
        backend.linear_backward(
            &acts.normed_attn,
            &layer.q_proj_weight,
            &d_q,
            d_normed,
            &mut grads.q_proj_weight,
            Some(&mut grads.q_proj_bias),
        )?;
        backend.linear_backward(
            &acts.normed_attn,
            &layer.k_proj_weight,
            &d_k,
            d_normed,
            &mut grads.k_proj_weight,
            Some(&mut grads.k_proj_bias),
        )?;
        backend.linear_backward(
            &acts.normed_attn,
            &layer.v_proj_weight,
            &d_v,
            d_normed,
            &mut grads.v_proj_weight,
            Some(&mut grads.v_proj_bias),
        )?;
        let d_normed = self.reduce_grad_rows(backend, layout, d_normed, d_mine)?;
        backend.rmsnorm_backward(
            &acts.x_in,
            &layer.input_layernorm,
            eps,
            d_normed,
            d_x,
            &mut grads.input_layernorm,
        )
    }

    /// Forward, fused LM-head loss and backward of one micro-batch: accumulates every
    /// parameter's gradient into `grads` and returns the loss's report. `num_action_tokens` is
    /// the optimizer batch's (RL-SPEC), so micro-batches' gradients add up to the batch's. With
    /// tensor parallelism every rank calls it with the same batch and gets the same report;
    /// [`Self::reduce_replicated_grads`] completes the gradients once per optimizer step.
    #[allow(clippy::too_many_arguments)]
    pub fn loss_and_backward(
        &self,
        backend: &B,
        batch: &PackedBatch,
        rows: &LossRows<'_>,
        objective: &Objective,
        num_action_tokens: f64,
        checkpoint_layers: bool,
        grads: &mut Qwen2Params<B::Tensor>,
    ) -> Result<LossOutput> {
        let t = batch.num_tokens();
        check_rows(rows, objective, t, self.config.vocab_size)?;
        ensure!(
            num_action_tokens > 0.0,
            "loss: the global action-token count is {num_action_tokens}"
        );
        let padded = batch.padded_to(self.tp_size());
        let t_padded = padded.num_tokens();
        let saved = self.forward_train(backend, &padded, checkpoint_layers)?;
        let targets = pad_rows(rows.targets, t_padded, 0);
        let stats = self.vocab_stats(backend, &saved.hidden, &targets)?;
        let (mut out, mut lse, mut coef) =
            finish_rows(&stats[..t], rows, objective, num_action_tokens);
        lse.resize(t_padded, 0.0);
        coef.resize(t_padded, 0.0);
        let mut d_hidden = backend.zeros(backend.shape(&saved.hidden))?;
        if coef.iter().any(|&c| c != 0.0) {
            backend.lm_head_loss_grad(
                &saved.hidden,
                self.params.lm_head_weight(),
                &self.shard_ids(&targets),
                &lse,
                &coef,
                &mut d_hidden,
                grads.lm_head_weight_mut(),
            )?;
        }
        self.backward(backend, &padded, saved, &mut d_hidden, grads)?;
        out.logprobs.truncate(t);
        out.entropy.truncate(t);
        Ok(out)
    }
}

/// `values` extended to `len` with `fill` (the padding rows of a sequence-parallel batch).
fn pad_rows<T: Copy>(values: &[T], len: usize, fill: T) -> std::borrow::Cow<'_, [T]> {
    if values.len() >= len {
        return std::borrow::Cow::Borrowed(values);
    }
    let mut padded = values.to_vec();
    padded.resize(len, fill);
    std::borrow::Cow::Owned(padded)
}
