//! The model side of a captured decode step: [`DecodeModel`] for [`Qwen2Model`], so a backend
//! can replay the model's paged forward and LM head inside a CUDA graph
//! ([`crate::backend::Backend::decode_step_graph`]) without depending on the model.

use super::qwen2::{PagedKv, Qwen2Model};
use crate::backend::{Backend, DecodeModel, PagedLayout};
use anyhow::Result;

impl<B: Backend> DecodeModel<B> for Qwen2Model<B> {
    type Cache = PagedKv<B::Tensor>;

    fn heads_local(&self) -> (usize, usize) {
        (self.local.heads_local, self.local.kv_heads_local)
    }

    fn cache_blocks(&self, cache: &PagedKv<B::Tensor>) -> usize {
        match cache.layers.is_empty() {
            true => 0,
            false => cache.num_blocks,
        }
    }

    fn step_tensors<'a>(&'a self, cache: &'a PagedKv<B::Tensor>) -> Vec<&'a B::Tensor> {
        (self.params.iter())
            .chain(cache.layers.iter().flat_map(|(k, v)| [k, v]))
            .collect()
    }

    fn step_logits(
        &self,
        backend: &B,
        cache: &mut PagedKv<B::Tensor>,
        tokens: &[u32],
        positions: &[u32],
        layout: &PagedLayout,
    ) -> Result<B::Tensor> {
        let hidden = self.forward_paged(backend, tokens, positions, layout, cache)?;
        self.lm_head(backend, &hidden)
    }
}
