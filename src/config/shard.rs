//! How a model splits over the `tp_size` ranks of a tensor-parallel group (Megatron's layout,
//! DESIGN.md decision 11): which query heads, KV heads, MLP columns and vocabulary rows each rank
//! holds. Nothing has to divide evenly.
//!
//! ```text
//!  query heads, KV heads   KV heads >= ranks: the KV groups (a KV head and its heads / kv_heads
//!                          query heads) are dealt out in contiguous near-equal runs.
//!                          KV heads < ranks: the ranks are dealt out over the KV groups; a
//!                          group's ranks each hold its KV head (replicated) and a near-equal run
//!                          of its query heads. Qwen2.5-7B (28 heads, 4 KV) at TP 8: 4 + 3 heads.
//!                          Either way every local query head reads local KV head
//!                          h / (heads_local / kv_heads_local), as attention expects.
//!  intermediate, vocab     contiguous near-equal runs, longer ones first (151,936 = 8 x 18,992;
//!                          a vocabulary that does not divide gives the last ranks one row less,
//!                          and the collectives over logits pad those shards: a padded column is
//!                          never sampled and never in a loss).
//! ```

use super::ModelConfig;
use anyhow::{bail, Result};

/// The part of the model one rank of a tensor-parallel group holds (all ranges contiguous, in
/// global indices). With `tp_size` 1 it is the whole model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalSizes {
    pub tp_size: usize,
    pub tp_rank: usize,
    pub heads_local: usize,
    pub head_start: usize,
    pub kv_heads_local: usize,
    pub kv_head_start: usize,
    /// Fewer KV heads than ranks: each KV head is held by several ranks, whose gradients of it
    /// must be summed.
    pub kv_replicated: bool,
    pub intermediate_local: usize,
    pub intermediate_start: usize,
    pub vocab_local: usize,
    pub vocab_start: usize,
}

impl LocalSizes {
    /// The vocabulary rows this rank holds.
    pub fn vocab_range(&self) -> std::ops::Range<usize> {
        self.vocab_start..self.vocab_start + self.vocab_local
    }
}

/// `0..total` in `parts` contiguous runs, longer (by one) first: `(start, len)` of run `i`.
pub fn near_equal(total: usize, parts: usize, i: usize) -> (usize, usize) {
    let (base, extra) = (total / parts, total % parts);
    (i * base + i.min(extra), base + usize::from(i < extra))
}

impl ModelConfig {
    /// Rank `tp_rank`'s part of the model in a tensor-parallel group of `tp_size`, or why the
    /// model cannot be split that way.
    pub fn shard(&self, tp_size: usize, tp_rank: usize) -> Result<LocalSizes> {
        if tp_size == 0 || tp_rank >= tp_size {
            bail!("tensor-parallel rank {tp_rank} of {tp_size}");
        }
        let (heads, kv_heads) = (self.num_attention_heads, self.num_key_value_heads);
        for (name, total) in [
            ("num_attention_heads", heads),
            ("intermediate_size", self.intermediate_size),
            ("vocab_size", self.vocab_size),
        ] {
            if total < tp_size {
                bail!("tensor-parallel size {tp_size} is more than {name} ({total}): every rank needs a part");
            }
        }
        let group = heads / kv_heads;
        let (head_start, heads_local, kv_head_start, kv_heads_local) = if kv_heads >= tp_size {
            let (kv_start, kv_len) = near_equal(kv_heads, tp_size, tp_rank);
            (kv_start * group, kv_len * group, kv_start, kv_len)
        } else {
            // Ranks dealt over the KV groups: group j has ranks [first, first + ranks).
            let (mut kv, mut first) = (0, 0);
            let ranks = loop {
                let (_, ranks) = near_equal(tp_size, kv_heads, kv);
                if tp_rank < first + ranks {
                    break ranks;
                }
                first += ranks;
                kv += 1;
            };
            // Unreachable after the check above (heads >= ranks makes group >= ranks per KV
            // head), kept so that a change there cannot slice a group into empty parts.
            if group < ranks {
                bail!(
                    "tensor-parallel size {tp_size}: KV head {kv} has {group} query heads, too few \
                     for its {ranks} ranks (num_attention_heads {heads}, num_key_value_heads {kv_heads})"
                );
            }
            let (offset, len) = near_equal(group, ranks, tp_rank - first);
            (kv * group + offset, len, kv, 1)
        };
        let (intermediate_start, intermediate_local) =
            near_equal(self.intermediate_size, tp_size, tp_rank);
        let (vocab_start, vocab_local) = near_equal(self.vocab_size, tp_size, tp_rank);
        Ok(LocalSizes {
            tp_size,
            tp_rank,
            heads_local,
            head_start,
            kv_heads_local,
            kv_head_start,
            kv_replicated: kv_heads < tp_size,
            intermediate_local,
            intermediate_start,
            vocab_local,
            vocab_start,
        })
    }

    /// Every rank's part, in rank order.
    pub fn shards(&self, tp_size: usize) -> Result<Vec<LocalSizes>> {
        (0..tp_size).map(|r| self.shard(tp_size, r)).collect()
    }

    /// Rank 0's part (the largest: runs are longer first), e.g. for one rank's benchmark shapes.
    pub fn local_sizes(&self, tp_size: usize) -> Result<LocalSizes> {
        self.shard(tp_size, 0)
    }
}

#[cfg(test)]
mod tests {
    use crate::config::ModelConfig;

    fn config(heads: usize, kv_heads: usize, intermediate: usize, vocab: usize) -> ModelConfig {
        ModelConfig::from_json_str(&format!(
            r#"{{"architectures": ["Qwen2ForCausalLM"], "hidden_size": {}, "intermediate_size": {intermediate},
               "num_hidden_layers": 1, "num_attention_heads": {heads}, "num_key_value_heads": {kv_heads},
               "vocab_size": {vocab}, "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
               "rope_theta": 10000.0, "tie_word_embeddings": true}}"#,
            heads * 8
        ))
        .unwrap()
    }

    /// Every query head on exactly one rank, each reading its own KV head; ranges tile.
    fn check_cover(c: &ModelConfig, tp: usize) {
        let shards = c.shards(tp).unwrap();
        let group = c.num_attention_heads / c.num_key_value_heads;
        let mut next = (0, 0, 0);
        for s in &shards {
            assert_eq!(
                (s.head_start, s.intermediate_start, s.vocab_start),
                next,
                "{s:?}"
            );
            next = (
                s.head_start + s.heads_local,
                s.intermediate_start + s.intermediate_local,
                s.vocab_start + s.vocab_local,
            );
            assert!(
                s.heads_local > 0 && s.heads_local % s.kv_heads_local == 0,
                "{s:?}"
            );
            let local_group = s.heads_local / s.kv_heads_local;
            for h in 0..s.heads_local {
                let global_kv = (s.head_start + h) / group;
                assert_eq!(
                    s.kv_head_start + h / local_group,
                    global_kv,
                    "{s:?} head {h}"
                );
            }
        }
        assert_eq!(
            next,
            (c.num_attention_heads, c.intermediate_size, c.vocab_size)
        );
    }

    #[test]
    fn every_split_covers_the_model_with_uniform_local_groups() {
        for (heads, kv) in [
            (28, 4),
            (14, 2),
            (12, 2),
            (64, 8),
            (40, 8),
            (6, 3),
            (6, 2),
            (4, 4),
            (8, 1),
        ] {
            for tp in 1..=8 {
                let c = config(heads, kv, 37, 101);
                match c.shards(tp) {
                    Ok(_) => check_cover(&c, tp),
                    Err(e) => {
                        let message = format!("{e:#}");
                        assert!(
                            message.contains("too few") || message.contains("more than"),
                            "{message}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn qwen_7b_at_tp8_replicates_each_kv_head_over_two_ranks() {
        let c = config(28, 4, 18944, 152064);
        let heads: Vec<(usize, usize, usize)> = c
            .shards(8)
            .unwrap()
            .iter()
            .map(|s| (s.head_start, s.heads_local, s.kv_head_start))
            .collect();
        assert_eq!(
            heads,
            vec![
                (0, 4, 0),
                (4, 3, 0),
                (7, 4, 1),
                (11, 3, 1),
                (14, 4, 2),
                (18, 3, 2),
                (21, 4, 3),
                (25, 3, 3)
            ]
        );
        assert!(c.shard(8, 0).unwrap().kv_replicated);
        assert!(!config(28, 4, 64, 64).shard(4, 1).unwrap().kv_replicated);
    }

    #[test]
    fn impossible_splits_name_the_field() {
        let message = format!("{:#}", config(4, 4, 64, 64).shard(8, 0).unwrap_err());
        assert!(
            message.contains("more than num_attention_heads (4)"),
            "{message}"
        );
    }
}
