//! The collectives of tensor parallelism as the model code calls them (Megatron-LM, with
//! sequence parallelism as Korthikanti et al. 2022): where the residual stream's rows live, what
//! happens at the edges of the column- and row-parallel halves of a block, the vocabulary-parallel
//! embedding and loss statistics, and the gradients of replicated parameters.
//!
//! ```text
//!              AllRows (inference)                  Sequence (training)
//!  residual    [T, d] on every rank                 [T/tp, d]: rank r's rows
//!  norm ─► ·   identity                             all-gather rows ─► [T, d]
//!  column-parallel GEMMs, attention, SwiGLU on local heads / MLP columns: [T, local]
//!  row-parallel GEMM ─► partial [T, d]
//!  ─► residual all-reduce (sum)                     reduce-scatter ─► [T/tp, d]
//! ```
//!
//! The backward mirrors it: an all-gather's gradient is a reduce-scatter and the reverse; an
//! all-reduce's gradient is an all-reduce. Norm weights see only their rank's rows under sequence
//! parallelism, so their gradients are partial sums, summed once per step
//! ([`Qwen2Model::reduce_replicated_grads`]), as are the gradients of a KV head that several
//! ranks hold (fewer KV heads than ranks). With TP = 1 every function here is the identity and
//! calls no collective.

use crate::backend::loss::RowStats;
use crate::backend::{Backend, OTHER_SHARD};
use crate::dist::ReduceOp;
use crate::model::params::Qwen2Params;
use crate::model::qwen2::{Layout, PackedBatch, Qwen2Model};
use anyhow::{ensure, Result};
use std::borrow::Cow;

impl PackedBatch {
    /// The batch with a padding sequence of token 0 appended so that its length is a multiple of
    /// `multiple` (itself when it already is). The padding attends only to itself and is never in
    /// a loss.
    pub fn padded_to(&self, multiple: usize) -> Cow<'_, PackedBatch> {
        let t = self.num_tokens();
        let pad = t.next_multiple_of(multiple.max(1)) - t;
        if pad == 0 {
            return Cow::Borrowed(self);
        }
        let mut padded = self.clone();
        padded.tokens.extend(std::iter::repeat_n(0, pad));
        padded.positions.extend(0..pad as u32);
        padded.cu_seqlens.push((t + pad) as u32);
        Cow::Owned(padded)
    }
}

impl<B: Backend> Qwen2Model<B> {
    pub fn tp_size(&self) -> usize {
        self.local.tp_size
    }

    /// Rows of the residual stream this rank holds for `t` tokens.
    pub(crate) fn residual_rows(&self, t: usize, layout: Layout) -> usize {
        match layout {
            Layout::Sequence => t / self.tp_size(),
            Layout::AllRows => t,
        }
    }

    /// Sequence parallelism is in effect (and not the identity).
    pub(crate) fn sequence_parallel(&self, layout: Layout) -> bool {
        layout == Layout::Sequence && self.tp_size() > 1
    }

    /// Token ids as indices into this rank's vocabulary shard ([`OTHER_SHARD`] for the others').
    pub(crate) fn shard_ids<'a>(&self, ids: &'a [u32]) -> Cow<'a, [u32]> {
        if self.tp_size() == 1 {
            return Cow::Borrowed(ids);
        }
        let range = self.local.vocab_range();
        Cow::Owned(
            ids.iter()
                .map(|&id| match id as usize {
                    id if range.contains(&id) => (id - range.start) as u32,
                    _ => OTHER_SHARD,
                })
                .collect(),
        )
    }

    /// A norm's output on this rank's rows, `local`, made the column-parallel GEMMs' input: all
    /// rows into `full` under sequence parallelism. Returns which of the two holds the input.
    pub(crate) fn gather_rows<'t>(
        &self,
        backend: &B,
        layout: Layout,
        local: &'t B::Tensor,
        full: &'t mut B::Tensor,
    ) -> Result<&'t B::Tensor> {
        if self.sequence_parallel(layout) {
            self.comm.all_gather_rows(backend, local, full)?;
            Ok(full)
        } else {
            Ok(local)
        }
    }

    /// A row-parallel GEMM's partial sums `partial [T, d]` made the residual stream's update
    /// `delta`: reduce-scattered into it under sequence parallelism, else all-reduced in place
    /// (`partial` is then `delta` itself and `delta` is `None`).
    pub(crate) fn reduce_partial(
        &self,
        backend: &B,
        layout: Layout,
        partial: &mut B::Tensor,
        delta: Option<&mut B::Tensor>,
    ) -> Result<()> {
        match delta {
            Some(delta) if self.sequence_parallel(layout) => {
                self.comm.reduce_scatter_rows(backend, partial, delta)
            }
            Some(_) => unreachable!("a separate delta only under sequence parallelism"),
            None if self.tp_size() > 1 => self.comm.all_reduce_sum(backend, partial),
            None => Ok(()),
        }
    }

    /// Every row's statistics over the whole vocabulary from this rank's shard's `local` ones
    /// (`targets` global ids): all ranks' pieces merged in rank order, the target logit from the
    /// rank holding it. The same bits on every rank; `local` unchanged at TP = 1.
    pub(crate) fn merge_vocab_stats(
        &self,
        local: Vec<RowStats>,
        targets: &[u32],
    ) -> Result<Vec<RowStats>> {
        let tp = self.tp_size();
        if tp == 1 {
            return Ok(local);
        }
        let flat: Vec<f64> = local
            .iter()
            .flat_map(|s| [s.max, s.sum_exp, s.sum_exp_centered, s.target_logit])
            .collect();
        let all = self.comm.all_gather_f64(&flat)?;
        let t = local.len();
        let shards = self.config.shards(tp)?;
        let owner = |id: u32| {
            shards
                .iter()
                .position(|s| s.vocab_range().contains(&(id as usize)))
                .unwrap_or(0)
        };
        let mut pieces = Vec::with_capacity(tp);
        Ok((0..t)
            .map(|r| {
                pieces.clear();
                pieces.extend((0..tp).map(|k| {
                    let s = &all[(k * t + r) * 4..][..4];
                    RowStats {
                        max: s[0],
                        sum_exp: s[1],
                        sum_exp_centered: s[2],
                        target_logit: s[3],
                    }
                }));
                RowStats::merge_shards(&pieces, owner(targets[r]))
            })
            .collect())
    }

    /// After every micro-batch of a step, once: the gradients of parameters several ranks hold
    /// summed over them. Norm weights under sequence parallelism (each rank saw its rows); KV
    /// heads held by several ranks (each saw its query heads). Then every holder has the whole
    /// gradient, and identical updates keep the copies identical.
    pub fn reduce_replicated_grads(
        &self,
        backend: &B,
        grads: &mut Qwen2Params<B::Tensor>,
    ) -> Result<()> {
        if self.tp_size() == 1 {
            return Ok(());
        }
        // The norms, in one host all-reduce.
        let mut norms: Vec<&mut B::Tensor> = grads
            .layers
            .iter_mut()
            .flat_map(|l| [&mut l.input_layernorm, &mut l.post_attention_layernorm])
            .collect();
        norms.push(&mut grads.norm);
        let mut values = Vec::new();
        for g in &norms {
            values.extend(backend.to_host(g)?);
        }
        self.comm.all_reduce_f32(&mut values, ReduceOp::Sum)?;
        let mut at = 0;
        for g in norms {
            let n = backend.shape(g).iter().product::<usize>();
            backend.write_f32(g, &values[at..at + n])?;
            at += n;
        }
        if self.local.kv_replicated {
            self.sum_kv_grads_over_holders(backend, grads)?;
        }
        Ok(())
    }

    /// Each rank's K and V projection gradients placed at their heads' rows of the whole
    /// `[kv_heads * head_dim, ...]` tensors, summed over the ranks, and read back: a KV head's
    /// gradient is then the sum over every rank that holds it.
    fn sum_kv_grads_over_holders(
        &self,
        backend: &B,
        grads: &mut Qwen2Params<B::Tensor>,
    ) -> Result<()> {
        let hd = self.config.head_dim;
        let kv_all = self.config.num_key_value_heads * hd;
        let rows = self.local.kv_head_start * hd
            ..(self.local.kv_head_start + self.local.kv_heads_local) * hd;
        let tensors: Vec<&mut B::Tensor> = grads
            .layers
            .iter_mut()
            .flat_map(|l| {
                [
                    &mut l.k_proj_weight,
                    &mut l.k_proj_bias,
                    &mut l.v_proj_weight,
                    &mut l.v_proj_bias,
                ]
            })
            .collect();
        let mut whole = Vec::new();
        let mut widths = Vec::with_capacity(tensors.len());
        for g in &tensors {
            let local = backend.to_host(g)?;
            let width = local.len() / rows.len();
            ensure!(
                width * rows.len() == local.len(),
                "KV gradient of {} values",
                local.len()
            );
            let mut full = vec![0.0f32; kv_all * width];
            full[rows.start * width..rows.end * width].copy_from_slice(&local);
            whole.extend(full);
            widths.push(width);
        }
        self.comm.all_reduce_f32(&mut whole, ReduceOp::Sum)?;
        let mut at = 0;
        for (g, width) in tensors.into_iter().zip(widths) {
            let full = &whole[at..at + kv_all * width];
            backend.write_f32(g, &full[rows.start * width..rows.end * width])?;
            at += kv_all * width;
        }
        Ok(())
    }
}
