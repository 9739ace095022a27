//! The paged KV cache's bookkeeping (DESIGN.md decision 7, vLLM v1's design): which blocks of the
//! per-layer K and V pools `[blocks, block_size, kv_heads, head_dim]` each request owns, which
//! full blocks are shared through the prefix cache, and which free blocks get reused next. Pure
//! CPU logic: no tensors here; the engine turns block tables into the kernels' inputs.
//!
//! One request with a 30-token prompt, `block_size` 4, in the step where the scheduler gives it 7
//! new tokens (a chunk of its prefill; in decode it is 1 token, the last one sampled):
//!
//! ```text
//!   token   0    4    8    12   16   20   24   28
//!   region  HHHH HHHH CCCC CCNN NNNN N... ---- --
//!   block   [ 7] [ 3] [12] [ 5] [ 9] [ 2]            block_table(req) = [7, 3, 12, 5, 9, 2]
//!
//!   H  prefix-cache hit: full blocks another request computed, shared (ref_cnt 2)  \ computed:
//!   C  computed by this request in earlier steps                                   / 14 tokens
//!   N  scheduled this step: num_new_tokens = 7
//!   .  not scheduled yet; its slot is allocated
//!   -  not scheduled yet; no block allocated yet
//! ```
//!
//! Blocks 7, 3 and 12 are full and cached. Blocks 5 and 9 are full once this step runs, so
//! `allocate_slots` hashes and caches them now (vLLM v1 does the same); block 2 is partly filled
//! and has no hash. Only full blocks are ever cached, and a block is only ever written while one
//! request holds it: hits cover computed tokens only.
//!
//! Token `t` lives in block `block_table[t / block_size]`, slot `t % block_size`. One step:
//!
//! 1. A request new to the cache asks [`KvCacheManager::get_computed_blocks`] for the longest
//!    cached prefix of full blocks (never the whole prompt: one token is always left to compute,
//!    whose logits give the first sample), and starts with `num_computed_tokens` = the hit tokens.
//! 2. [`KvCacheManager::allocate_slots`] makes the request own blocks for `num_computed_tokens +
//!    num_new_tokens` tokens (taking the hits on first call) and caches every block that is full
//!    once the step runs; or it answers `Ok(None)`, changing nothing, when too few blocks are
//!    free: the scheduler preempts a request ([`KvCacheManager::free`]) and retries.
//! 3. The step writes the new tokens' K and V into their slots, layer by layer, before any
//!    attention of that layer reads them, so a request scheduled in the same step may already hit
//!    blocks cached in step 2.
//! 4. A finished or preempted request is freed; its blocks keep their hashes while free and are
//!    evicted lazily, least recently freed first.
//!
//! Contract: a request must not be freed between `allocate_slots` and the step that computes the
//! tokens it scheduled (the blocks registered for them would be cached without their KV). vLLM's
//! scheduler keeps this by only preempting requests not yet scheduled in the current step.
//!
//! When weights change, [`KvCacheManager::reset_prefix_cache`] forgets every hash, and running
//! requests stop registering blocks: their KV mixes old and new weights.

pub mod block_pool;
pub mod manager;
pub mod prefix;
#[cfg(test)]
mod test_support;

pub use block_pool::{BlockPool, DEFAULT_BLOCK_SIZE, NULL_BLOCK};
pub use manager::{KvCacheManager, PrefixCacheStats, RequestId};
pub use prefix::{hash_block, hash_request_blocks, BlockHash, BlockHasher, PrefixCache};

/// Index of a block in the per-layer K and V pools `[blocks, block_size, kv_heads, head_dim]`.
/// Defined here, below its three users, so that `prefix` (which names blocks) and `block_pool`
/// (which owns the prefix cache) depend on each other in one direction only:
/// `manager -> block_pool -> prefix`, each of them -> this module's shared types.
pub type BlockId = u32;

/// What the KV cache refuses. Running out of free blocks is not an error but `Ok(None)` from
/// [`KvCacheManager::allocate_slots`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvCacheError {
    /// The pool's shape cannot work (too few blocks, block size 0).
    BadConfig(String),
    /// The request needs more blocks than the whole pool has: it can never run.
    NeverFits {
        request: RequestId,
        num_tokens: usize,
        blocks_needed: usize,
        num_usable_blocks: usize,
        block_size: usize,
    },
    /// The arguments contradict each other or what the cache knows about the request.
    BadArguments { request: RequestId, message: String },
}

impl std::fmt::Display for KvCacheError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::BadConfig(message) => write!(f, "KV cache: {message}"),
            Self::NeverFits {
                request,
                num_tokens,
                blocks_needed,
                num_usable_blocks,
                block_size,
            } => {
                write!(
                    f,
                    "request {request}: {num_tokens} tokens need {blocks_needed} KV blocks of \
                     {block_size} tokens, but the whole cache has {num_usable_blocks} blocks \
                     ({} tokens)",
                    num_usable_blocks * block_size
                )
            }
            Self::BadArguments { request, message } => write!(f, "request {request}: {message}"),
        }
    }
}

impl std::error::Error for KvCacheError {}

/// Scenarios through the public API: prefix sharing, multi-turn growth, weight resets, and a
/// seeded randomized stress test checked against a model of what each KV slot holds.
#[cfg(test)]
mod tests {
    use super::test_support::{admit, decode, tokens};
    use super::*;

    #[test]
    fn group_of_ten_computes_the_shared_prompt_once() {
        // A DAPO group: G = 10 samples of one 100-token prompt (6 full blocks of 16 + 4 tokens),
        // scheduled one after the other in the same step.
        let mut m = KvCacheManager::new(64, 16, true).unwrap();
        let prompt: Vec<u32> = (0..100).map(|i| i * 7919 % 151_643).collect();
        let mut seqs: Vec<Vec<u32>> = vec![prompt.clone(); 10];
        for g in 0..10 {
            let (hits, n) = m.get_computed_blocks(&prompt);
            assert_eq!(n, if g == 0 { 0 } else { 96 }, "sample {g}");
            let new = m
                .allocate_slots(g, &prompt, n, 100 - n, &hits)
                .unwrap()
                .unwrap();
            assert_eq!(new.len(), if g == 0 { 7 } else { 1 }, "sample {g}");
            m.check_invariants().unwrap();
        }
        let stats = m.prefix_cache_stats();
        assert_eq!(
            stats,
            PrefixCacheStats {
                queries: 10 * 100,
                hits: 9 * 96
            }
        );
        let shared = m.block_table(0)[..6].to_vec();
        assert!(shared.iter().all(|&b| m.pool().ref_count(b) == 10));
        assert_eq!(m.num_used_blocks(), 6 + 10);
        assert_eq!(m.pool().num_cached_blocks(), 6);

        // Each sample decodes 20 different tokens: block 6 fills with its own tokens (cached),
        // block 7 opens (4 tokens, not cached).
        for (g, toks) in seqs.iter_mut().enumerate() {
            decode(&mut m, g as RequestId, toks, 20, 1000 * g as u32);
        }
        assert_eq!(m.num_used_blocks(), 6 + 10 * 2);
        assert_eq!(m.pool().num_cached_blocks(), 6 + 10);
        for g in 0..10 {
            assert!(m.free(g));
        }
        assert_eq!((m.num_used_blocks(), m.num_requests()), (0, 0));
        assert_eq!(m.pool().num_cached_blocks(), 16, "freed blocks stay cached");

        // The next group of the same prompt finds all 6 full blocks, now free, and revives them.
        m.reset_prefix_cache_stats();
        for g in 10..20 {
            let (hits, n) = m.get_computed_blocks(&prompt);
            assert_eq!((&hits, n), (&shared, 96));
            m.allocate_slots(g, &prompt, n, 4, &hits).unwrap().unwrap();
        }
        assert_eq!(m.prefix_cache_stats().hits, 10 * 96);
        assert_eq!(m.num_used_blocks(), 6 + 10);
        m.check_invariants().unwrap();
    }

    #[test]
    fn multi_turn_conversation_reuses_every_full_block() {
        let mut m = KvCacheManager::new(64, 16, true).unwrap();
        let mut toks = tokens(0..40);
        admit(&mut m, 1, &toks).unwrap();
        decode(&mut m, 1, &mut toks, 10, 500); // 50 tokens: blocks 0-2 full
        m.free(1);
        // Turn 2: the 50 tokens and a tool result. The whole history is in full blocks 0-2.
        toks.extend(600..615);
        let (hits, n) = m.get_computed_blocks(&toks);
        assert_eq!((hits.len(), n), (3, 48));
        m.allocate_slots(2, &toks, n, toks.len() - n, &hits)
            .unwrap()
            .unwrap();
        decode(&mut m, 2, &mut toks, 15, 700); // 80 tokens: blocks 0-4 full
        m.free(2);
        // Turn 3: 85 tokens; the cap ((85 - 1) / 16 = 5 blocks) and the cache agree.
        toks.extend(800..805);
        let (hits, n) = m.get_computed_blocks(&toks);
        assert_eq!((hits.len(), n), (5, 80));
        assert_eq!(
            m.allocate_slots(3, &toks, n, 5, &hits)
                .unwrap()
                .map(|b| b.len()),
            Some(1)
        );
        assert_eq!(
            m.prefix_cache_stats(),
            PrefixCacheStats {
                queries: 40 + 65 + 85,
                hits: 48 + 80
            }
        );
        m.free(3);
        assert_eq!(m.num_used_blocks(), 0);
        m.check_invariants().unwrap();
    }
    #[test]
    fn duplicate_content_keeps_the_first_cached_block() {
        let mut m = KvCacheManager::new(32, 4, true).unwrap();
        let toks = tokens(0..9);
        // Both look up before either allocates: both compute the prompt.
        let (h1, _) = m.get_computed_blocks(&toks);
        let (h2, _) = m.get_computed_blocks(&toks);
        assert!(h1.is_empty() && h2.is_empty());
        assert_eq!(
            m.allocate_slots(1, &toks, 0, 9, &[]).unwrap(),
            Some(vec![1, 2, 3])
        );
        assert_eq!(
            m.allocate_slots(2, &toks, 0, 9, &[]).unwrap(),
            Some(vec![4, 5, 6])
        );
        assert_eq!(m.pool().num_cached_blocks(), 2);
        assert_eq!(
            (m.pool().cached_hash(4), m.pool().cached_hash(5)),
            (None, None)
        );
        // Request 2 goes on registering its later blocks, chained on the shared hashes.
        let mut grown = toks.clone();
        grown.extend(9..12);
        m.allocate_slots(2, &grown, 9, 3, &[]).unwrap().unwrap();
        assert_eq!(m.pool().num_cached_blocks(), 3);
        m.free(1);
        let (hits, _) = m.get_computed_blocks(&[grown.clone(), vec![0]].concat());
        assert_eq!(
            hits,
            vec![1, 2, 6],
            "request 1's copies, then request 2's block"
        );
        m.check_invariants().unwrap();
    }

    #[test]
    fn reset_forgets_running_requests_blocks_for_good() {
        let mut m = KvCacheManager::new(32, 4, true).unwrap();
        let toks = tokens(0..9);
        admit(&mut m, 1, &toks).unwrap();
        admit(&mut m, 2, &tokens(50..55)).unwrap();
        m.free(2);
        assert_eq!(m.pool().num_cached_blocks(), 3);
        assert_eq!(m.reset_prefix_cache(), 3, "in-use and free entries alike");
        assert_eq!(m.get_computed_blocks(&toks), (vec![], 0));
        // Request 1 runs on with new weights: its KV mixes both, so nothing more is cached.
        let mut grown = toks.clone();
        grown.extend(9..17);
        m.allocate_slots(1, &grown, 9, 8, &[]).unwrap().unwrap();
        assert_eq!(m.pool().num_cached_blocks(), 0);
        // A request new after the reset caches again.
        admit(&mut m, 3, &tokens(0..9)).unwrap();
        assert_eq!(m.pool().num_cached_blocks(), 2);
        m.check_invariants().unwrap();
    }

    #[test]
    fn disabled_prefix_caching_never_hits_or_registers() {
        let mut m = KvCacheManager::new(16, 4, false).unwrap();
        let toks = tokens(0..9);
        assert_eq!(admit(&mut m, 1, &toks), Some(vec![1, 2, 3]));
        assert_eq!(admit(&mut m, 2, &toks), Some(vec![4, 5, 6]));
        assert_eq!(
            (m.pool().num_cached_blocks(), m.prefix_cache_stats()),
            (0, Default::default())
        );
        assert!(!m.prefix_caching_enabled());
        assert_eq!(m.reset_prefix_cache(), 0);
    }

    #[test]
    fn prefix_hit_leaves_at_least_one_token_to_compute() {
        let mut m = KvCacheManager::new(32, 4, true).unwrap();
        let prompt = tokens(100..108); // exactly 2 full blocks
        assert_eq!(admit(&mut m, 1, &prompt), Some(vec![1, 2]));
        assert_eq!(
            m.get_computed_blocks(&prompt),
            (vec![1], 4),
            "the last block is recomputed"
        );
        let longer = tokens(100..109);
        assert_eq!(m.get_computed_blocks(&longer), (vec![1, 2], 8));
        assert_eq!(
            m.get_computed_blocks(&tokens(100..103)),
            (vec![], 0),
            "no full block"
        );
        assert_eq!(m.get_computed_blocks(&[]), (vec![], 0));
        let other = [vec![100, 101, 102, 999], tokens(104..109)].concat();
        assert_eq!(
            m.get_computed_blocks(&other),
            (vec![], 0),
            "the chain breaks at block 0"
        );
        let stats = m.prefix_cache_stats();
        assert_eq!(
            stats,
            PrefixCacheStats {
                queries: 8 + 8 + 9 + 3 + 9,
                hits: 4 + 8
            }
        );
        assert!((stats.hit_rate() - 12.0 / 37.0).abs() < 1e-12);
        m.reset_prefix_cache_stats();
        assert_eq!(
            (m.prefix_cache_stats(), m.prefix_cache_stats().hit_rate()),
            (Default::default(), 0.0)
        );

        // A second request takes the two hits and owns only its tail block.
        assert_eq!(admit(&mut m, 2, &longer), Some(vec![3]));
        assert_eq!(m.block_table(2), &[1, 2, 3]);
        assert_eq!(
            (
                m.pool().ref_count(1),
                m.pool().ref_count(2),
                m.num_used_blocks()
            ),
            (2, 2, 3)
        );
        m.free(1);
        assert_eq!(
            m.num_used_blocks(),
            3,
            "request 2 still holds the shared blocks"
        );
        m.free(2);
        assert_eq!(m.num_used_blocks(), 0);
        m.check_invariants().unwrap();
    }

    use crate::rng::{Rng, SplitMix64};

    /// What each KV slot holds, as a fingerprint of the token at that position, the weights it
    /// was computed with (`epoch`), and the slot before it read through the block table, as
    /// attention would. A correct hit holds exactly what recomputing the prefix would.
    struct KvModel {
        slots: Vec<u64>,
        block_size: usize,
    }

    impl KvModel {
        fn next(prev: u64, token: u32, epoch: u64) -> u64 {
            hash_block(Some(BlockHash(prev)), &[token], Some(epoch)).0
        }

        /// The request computes its next `num_new` tokens into its blocks.
        fn compute(&mut self, m: &KvCacheManager, seq: &Seq, num_new: usize, epoch: u64) {
            let table = m.block_table(seq.id);
            let bs = self.block_size;
            let slot = |pos: usize| table[pos / bs] as usize * bs + pos % bs;
            for pos in seq.num_computed..seq.num_computed + num_new {
                let prev = pos.checked_sub(1).map_or(0, |p| self.slots[slot(p)]);
                let block = table[pos / bs];
                assert_eq!(
                    m.pool().ref_count(block),
                    1,
                    "a write into shared block {block}"
                );
                self.slots[slot(pos)] = Self::next(prev, seq.tokens[pos], epoch);
            }
        }

        /// The hit blocks hold what computing `toks` from scratch with the current weights gives.
        fn check_hits(&self, hits: &[BlockId], toks: &[u32], epoch: u64) {
            let (bs, mut expected) = (self.block_size, 0);
            for (pos, &token) in toks.iter().enumerate().take(hits.len() * bs) {
                expected = Self::next(expected, token, epoch);
                let block = hits[pos / bs];
                let held = self.slots[block as usize * bs + pos % bs];
                assert_eq!(held, expected, "hit block {block} slot {pos}: wrong KV");
            }
        }
    }

    struct Seq {
        id: RequestId,
        tokens: Vec<u32>,
        num_computed: usize,
    }

    #[derive(Default, Debug)]
    struct Counts {
        allocations: usize,
        queried: usize,
        looked_up: usize,
        refused: usize,
        preemptions: usize,
        hit_tokens: usize,
        revived_blocks: usize,
        resets: usize,
        finished: usize,
        later_turns: usize,
    }

    const BLOCK_SIZE: usize = 4;
    const MAX_TOKENS: usize = 80;

    /// The randomized stress test's world: the manager, what each slot holds, the requests by
    /// state, and the counts of what happened.
    struct Stress {
        rng: SplitMix64,
        m: KvCacheManager,
        kv: KvModel,
        /// Shared system prompts.
        systems: Vec<Vec<u32>>,
        running: Vec<Seq>,
        waiting: Vec<Seq>,
        /// Finished conversations a later turn may extend.
        done: Vec<Vec<u32>>,
        next_id: u64,
        /// Bumped by each weight update.
        epoch: u64,
        c: Counts,
    }

    #[test]
    fn randomized_stress_keeps_invariants_and_never_serves_wrong_kv() {
        let mut s = Stress::new();
        for op in 0..5000 {
            match s.rng.below(100) {
                0..=19 => s.new_request(),
                // Nothing to schedule (nothing changed): on to the next operation. A chunk that
                // was scheduled falls through to the checks below.
                20..=69 if !s.schedule_chunk() => continue,
                70..=79 => s.finish_one(),
                80..=81 => s.new_weights(),
                82..=85 => s.caller_errors_change_nothing(),
                _ => {}
            }
            s.check_after(op);
        }
        s.free_all_and_check_counts();
    }

    impl Stress {
        fn new() -> Self {
            let mut rng = SplitMix64::new(0x5eed);
            let m = KvCacheManager::new(40, BLOCK_SIZE, true).unwrap(); // 39 blocks: tight
            let (slots, block_size) = (vec![0; 40 * BLOCK_SIZE], BLOCK_SIZE);
            let kv = KvModel { slots, block_size };
            let systems: Vec<Vec<u32>> = [13, 22, 31]
                .iter()
                .map(|&n| (0..n).map(|_| rng.below(1000) as u32).collect())
                .collect();
            Self {
                rng,
                m,
                kv,
                systems,
                running: Vec::new(),
                waiting: Vec::new(),
                done: Vec::new(),
                next_id: 0,
                epoch: 0,
                c: Counts::default(),
            }
        }

        /// A new request: a shared system prompt and a user turn, or the next turn of a
        /// finished conversation.
        fn new_request(&mut self) {
            let rng = &mut self.rng;
            let tokens = if !self.done.is_empty() && rng.below(3) == 0 {
                self.c.later_turns += 1;
                let mut t = self.done.swap_remove(rng.below(self.done.len()));
                t.extend((0..1 + rng.below(8)).map(|_| rng.below(1000) as u32));
                t
            } else {
                let mut t = self.systems[rng.below(3)].clone();
                t.extend((0..1 + rng.below(10)).map(|_| rng.below(1000) as u32));
                t
            };
            self.next_id += 1;
            let (id, num_computed) = (self.next_id, 0);
            self.waiting.push(Seq {
                id,
                tokens,
                num_computed,
            });
        }

        /// Schedules a chunk for a running or waiting request, preempting one on refusal.
        /// `false` when there was nothing to schedule (nothing changed).
        fn schedule_chunk(&mut self) -> bool {
            let rng = &mut self.rng;
            let from_waiting =
                self.running.is_empty() || (!self.waiting.is_empty() && rng.below(3) == 0);
            if from_waiting && self.waiting.is_empty() {
                return false;
            }
            let mut seq = if from_waiting {
                self.waiting.swap_remove(rng.below(self.waiting.len()))
            } else {
                self.running.swap_remove(rng.below(self.running.len()))
            };
            if seq.num_computed == seq.tokens.len() {
                // Decode; a small alphabet makes samples share more.
                seq.tokens.push(rng.below(4) as u32);
            }
            let budget = 1 + rng.below(12);
            if self.allocate_chunk(&mut seq, budget) {
                self.running.push(seq);
            } else {
                if seq.num_computed < seq.tokens.len() && self.m.contains(seq.id) {
                    // Refused even after a preemption: it preempts itself.
                    assert!(self.m.free(seq.id));
                    self.c.preemptions += 1;
                }
                seq.num_computed = 0;
                self.waiting.push(seq);
            }
            true
        }

        /// Up to two attempts to allocate `seq`'s next `budget` tokens (its prefix hits first, if
        /// the cache does not know it), computing them on success; a refusal preempts a running
        /// request before the second attempt. Whether it was scheduled.
        fn allocate_chunk(&mut self, seq: &mut Seq, budget: usize) -> bool {
            let (m, c) = (&mut self.m, &mut self.c);
            for attempt in 0..2 {
                let (hits, n) = if m.contains(seq.id) {
                    (Vec::new(), seq.num_computed)
                } else {
                    let (hits, n) = m.get_computed_blocks(&seq.tokens);
                    c.queried += seq.tokens.len();
                    c.looked_up += n;
                    (hits, n)
                };
                let num_new = budget.min(seq.tokens.len() - n);
                let revived = hits.iter().filter(|&&b| m.pool().ref_count(b) == 0).count();
                match m
                    .allocate_slots(seq.id, &seq.tokens, n, num_new, &hits)
                    .unwrap()
                {
                    Some(_) => {
                        self.kv.check_hits(&hits, &seq.tokens, self.epoch);
                        seq.num_computed = n;
                        self.kv.compute(m, seq, num_new, self.epoch);
                        seq.num_computed += num_new;
                        c.allocations += 1;
                        c.hit_tokens += hits.len() * BLOCK_SIZE;
                        c.revived_blocks += revived;
                        return true;
                    }
                    None => {
                        c.refused += 1;
                        if attempt == 1 || self.running.is_empty() {
                            return false;
                        }
                        let i = self.rng.below(self.running.len());
                        let mut victim = self.running.swap_remove(i);
                        assert!(m.free(victim.id));
                        victim.num_computed = 0;
                        self.waiting.push(victim);
                        c.preemptions += 1;
                    }
                }
                m.check_invariants().unwrap();
            }
            false
        }

        /// A request finishes (also when it reaches its length limit).
        fn finish_one(&mut self) {
            let rng = &mut self.rng;
            if let Some(i) = (!self.running.is_empty()).then(|| rng.below(self.running.len())) {
                let seq = self.running.swap_remove(i);
                assert!(self.m.free(seq.id));
                self.c.finished += 1;
                if seq.tokens.len() < MAX_TOKENS - 20 {
                    self.done.push(seq.tokens);
                }
            }
        }

        /// New weights.
        fn new_weights(&mut self) {
            self.m.reset_prefix_cache();
            assert_eq!(self.m.pool().num_cached_blocks(), 0);
            self.epoch += 1;
            self.c.resets += 1;
        }

        /// Caller errors change nothing.
        fn caller_errors_change_nothing(&mut self) {
            let m = &mut self.m;
            let (used, cached) = (m.num_used_blocks(), m.pool().num_cached_blocks());
            let huge = vec![1; 40 * BLOCK_SIZE];
            let err = m.allocate_slots(self.next_id + 1, &huge, 0, huge.len(), &[]);
            assert!(matches!(err, Err(KvCacheError::NeverFits { .. })));
            if let Some(seq) = self.running.first() {
                let (id, past_end) = (seq.id, seq.tokens.len() + 1);
                let err = m.allocate_slots(id, &seq.tokens, seq.num_computed, past_end, &[]);
                assert!(matches!(err, Err(KvCacheError::BadArguments { .. })));
            }
            assert!(!m.free(u64::MAX));
            let after = (m.num_used_blocks(), m.pool().num_cached_blocks());
            assert_eq!(after, (used, cached));
        }

        /// After each operation: requests at their length limit finish, the invariants hold, and
        /// every running request owns exactly the blocks its computed tokens need.
        fn check_after(&mut self, op: usize) {
            let m = &mut self.m;
            // Requests at their length limit finish.
            self.running
                .retain(|seq| seq.tokens.len() < MAX_TOKENS || !m.free(seq.id));
            if let Err(e) = m.check_invariants() {
                panic!("after operation {op}: {e}");
            }
            for seq in &self.running {
                let blocks_needed = seq.num_computed.div_ceil(BLOCK_SIZE);
                assert_eq!(m.num_blocks_of(seq.id), blocks_needed);
            }
            assert!(self.waiting.iter().all(|seq| !m.contains(seq.id)));
            assert_eq!(m.num_requests(), self.running.len());
        }

        /// Frees every running request: no block leaked; the stats count what was looked up,
        /// and the run exercised every path.
        fn free_all_and_check_counts(mut self) {
            let (m, c) = (&mut self.m, &self.c);
            for seq in self.running.drain(..) {
                assert!(m.free(seq.id));
            }
            m.check_invariants().unwrap();
            let (used, free, live) = (m.num_used_blocks(), m.num_free_blocks(), m.num_requests());
            assert_eq!((used, free, live), (0, 39, 0), "leaked blocks");
            // The stats count what was looked up, and the run exercised every path.
            let stats = m.prefix_cache_stats();
            let (queries, hits) = (stats.queries as usize, stats.hits as usize);
            assert_eq!((queries, hits), (c.queried, c.looked_up));
            assert!(
                c.allocations > 1000 && c.refused > 20 && c.preemptions > 20,
                "{c:?}"
            );
            assert!(
                c.hit_tokens > 1000 && c.revived_blocks > 50 && c.resets > 20,
                "{c:?}"
            );
            assert!(c.finished > 100 && c.later_turns > 20, "{c:?}");
        }
    }
}
