//! [`LossTiles`]: how much of the logits the fused loss (`loss.rs`) holds at a time. Its `vocab`
//! is also the vocabulary chunk of the canonical log-softmax order (kernels/logsumexp.cuh) that
//! the sampler and `token_logprobs` walk, so the backend keeps one value for all three
//! ([`super::CudaBackend::loss_tiles`]).

/// Tile sizes of the fused loss: `rows x vocab` logits live at a time.
///
/// Why these: every GEMM keeps a large inner dimension (the logits GEMM K = d; the hidden
/// gradient's K = `vocab`; the LM-head gradient's K = `rows`), so the fp32 read-modify-write of
/// the accumulated outputs (`d_weight` chunk, `dh_acc`) costs 4 bytes per 2 x 8192 FLOPs, far
/// below the bf16 GEMM ridge point of an H100/H200; 76 tiles at T = 32k, V = 152k, with the
/// element-wise passes moving ~6 bytes per logit against ~2 d = 7168 FLOPs per logit per GEMM.
/// Rejected without a measurement yet (no GPU in the session that wrote this): a whole-vocabulary
/// row chunk (no recompute, but its `d_weight` GEMM has K = rows ~1.3k with an fp32 C of V x d
/// read and written per chunk: near the ridge, and 0.8 GB of scratch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LossTiles {
    /// Token rows per tile (at most 65535: the gradient kernel's grid y).
    pub rows: usize,
    /// Vocabulary entries per tile.
    pub vocab: usize,
}

impl LossTiles {
    pub const DEFAULT: LossTiles = LossTiles {
        rows: 8192,
        vocab: 8192,
    };

    /// Device bytes the loss allocates for `tokens` rows, a vocabulary of `vocab` and hidden
    /// width `d` (the bound the issue asks for: <= 1 GB at T = 32k, V = 152k, d = 3584).
    pub fn scratch_bytes(&self, tokens: usize, vocab: usize, d: usize) -> usize {
        let (r, v) = (self.rows.min(tokens), self.vocab.min(vocab));
        // logits f32 + g bf16 per tile element; dh_acc f32; stats (16) + lse + coef + targets.
        r * v * (4 + 2) + r * d * 4 + tokens * (16 + 4 + 4 + 4)
    }
}
