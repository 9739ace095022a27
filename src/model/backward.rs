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

use crate::backend::grad::BackendGrad;
use crate::backend::loss::{LossOutput, LossRows, Objective};
use crate::model::layer::{LayerActivations, SavedLayer};
use crate::model::params::{LayerParams, Qwen2Params};
use crate::model::qwen2::{AttentionFn, Keep, PackedBatch, Qwen2Model};
use anyhow::{bail, Result};

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
    /// also gives its logsumexp. With `checkpoint_layers`, keeps only each layer's input.
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
        let ran = self.forward_keeping(backend, batch, Keep::Nothing)?;
        let (logprobs, _entropy) =
            backend.lm_head_logprobs(&ran.hidden, self.params.lm_head_weight(), targets)?;
        Ok(logprobs)
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
    /// states), accumulating every parameter's gradient into `grads`.
    pub fn backward(
        &self,
        backend: &B,
        batch: &PackedBatch,
        saved: TrainActivations<B::Tensor>,
        d_hidden: &B::Tensor,
        grads: &mut Qwen2Params<B::Tensor>,
    ) -> Result<()> {
        let t = batch.num_tokens();
        let d = self.config.hidden_size;
        let eps = self.config.rms_norm_eps as f32;
        let mut d_x = backend.zeros(&[t, d])?;
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
                    &mut self.training_attention(backend, batch),
                )?,
                None => bail!("backward: no saved activations for layer {i}"),
            };
            self.layer_backward(backend, layer, batch, &acts, &mut d_x, &mut grads.layers[i])?;
        }
        backend.embedding_backward(&d_x, &batch.tokens, &mut grads.embed_tokens)
    }

    /// One layer's backward: `d_x` enters as the gradient of the layer's output and leaves as
    /// that of its input. The forward's two blocks in reverse: the MLP block, then attention.
    fn layer_backward(
        &self,
        backend: &B,
        layer: &LayerParams<B::Tensor>,
        batch: &PackedBatch,
        acts: &LayerActivations<B::Tensor>,
        d_x: &mut B::Tensor,
        grads: &mut LayerParams<B::Tensor>,
    ) -> Result<()> {
        self.mlp_block_backward(backend, layer, batch, acts, d_x, grads)?;
        self.attention_block_backward(backend, layer, batch, acts, d_x, grads)
    }

    /// The MLP block's backward: x_out = x_mid + down(silu(gate(n)) * up(n)), n = rmsnorm(x_mid).
    /// `d_x` enters as d x_out and leaves as d x_mid.
    fn mlp_block_backward(
        &self,
        backend: &B,
        layer: &LayerParams<B::Tensor>,
        batch: &PackedBatch,
        acts: &LayerActivations<B::Tensor>,
        d_x: &mut B::Tensor,
        grads: &mut LayerParams<B::Tensor>,
    ) -> Result<()> {
        let t = batch.num_tokens();
        let (d, inter) = (self.config.hidden_size, self.local.intermediate_local);
        let eps = self.config.rms_norm_eps as f32;
        let mut d_act = backend.zeros(&[t, inter])?;
        backend.linear_backward(
            &acts.act,
            &layer.down_proj_weight,
            d_x,
            &mut d_act,
            &mut grads.down_proj_weight,
            None,
        )?;
        let mut d_gate = backend.zeros(&[t, inter])?;
        let mut d_up = backend.zeros(&[t, inter])?;
        backend.swiglu_backward(&acts.gate, &acts.up, &d_act, &mut d_gate, &mut d_up)?;
        let mut d_normed = backend.zeros(&[t, d])?;
        backend.linear_backward(
            &acts.normed_mlp,
            &layer.gate_proj_weight,
            &d_gate,
            &mut d_normed,
            &mut grads.gate_proj_weight,
            None,
        )?;
        backend.linear_backward(
            &acts.normed_mlp,
            &layer.up_proj_weight,
            &d_up,
            &mut d_normed,
            &mut grads.up_proj_weight,
            None,
        )?;
        backend.rmsnorm_backward(
            &acts.x_mid,
            &layer.post_attention_layernorm,
            eps,
            &d_normed,
            d_x,
            &mut grads.post_attention_layernorm,
        )
    }

    /// The attention block's backward: x_mid = x_in + o(attention(rope(q(n)), rope(k(n)), v(n))),
    /// n = rmsnorm(x_in). `d_x` enters as d x_mid and leaves as d x_in.
    fn attention_block_backward(
        &self,
        backend: &B,
        layer: &LayerParams<B::Tensor>,
        batch: &PackedBatch,
        acts: &LayerActivations<B::Tensor>,
        d_x: &mut B::Tensor,
        grads: &mut LayerParams<B::Tensor>,
    ) -> Result<()> {
        let t = batch.num_tokens();
        let (d, hd) = (self.config.hidden_size, self.config.head_dim);
        let (heads, kv_heads) = (self.local.heads_local, self.local.kv_heads_local);
        let eps = self.config.rms_norm_eps as f32;
        let mut d_attn = backend.zeros(&[t, heads, hd])?;
        backend.linear_backward(
            &acts.attn,
            &layer.o_proj_weight,
            d_x,
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
            1.0 / (hd as f32).sqrt(),
            &mut d_q,
            &mut d_k,
            &mut d_v,
        )?;
        backend.rope_backward(&mut d_q, &mut d_k, &batch.positions, &self.rotary)?;
        let mut d_normed = backend.zeros(&[t, d])?;
        backend.linear_backward(
            &acts.normed_attn,
            &layer.q_proj_weight,
            &d_q,
            &mut d_normed,
            &mut grads.q_proj_weight,
            Some(&mut grads.q_proj_bias),
        )?;
        backend.linear_backward(
            &acts.normed_attn,
            &layer.k_proj_weight,
            &d_k,
            &mut d_normed,
            &mut grads.k_proj_weight,
            Some(&mut grads.k_proj_bias),
        )?;
        backend.linear_backward(
            &acts.normed_attn,
            &layer.v_proj_weight,
            &d_v,
            &mut d_normed,
            &mut grads.v_proj_weight,
            Some(&mut grads.v_proj_bias),
        )?;
        backend.rmsnorm_backward(
            &acts.x_in,
            &layer.input_layernorm,
            eps,
            &d_normed,
            d_x,
            &mut grads.input_layernorm,
        )
    }

    /// Forward, fused LM-head loss and backward of one micro-batch: accumulates every
    /// parameter's gradient into `grads` and returns the loss's report. `num_action_tokens` is
    /// the optimizer batch's (RL-SPEC), so micro-batches' gradients add up to the batch's.
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
        let saved = self.forward_train(backend, batch, checkpoint_layers)?;
        let mut d_hidden = backend.zeros(backend.shape(&saved.hidden))?;
        let out = backend.lm_head_loss(
            &saved.hidden,
            self.params.lm_head_weight(),
            rows,
            objective,
            num_action_tokens,
            &mut d_hidden,
            grads.lm_head_weight_mut(),
        )?;
        self.backward(backend, batch, saved, &d_hidden, grads)?;
        Ok(out)
    }
}
