//! [`KvCacheManager`]: each request's block table over one [`BlockPool`], prefix-cache lookups and
//! registration. The module doc of [`crate::kvcache`] draws a request's regions and the step.
//!
//! Per request the manager keeps:
//!
//! ```text
//!   blocks             [ 7 ][ 3 ][ 12 ][ 5 ][ 9 ][ 2 ]     the block table, in token order
//!   hasher.hashes()    [ h0 ][ h1 ][ h2 ][ h3 ][ h4 ]      hashes of the blocks full so far
//!   num_cached_blocks  ------------------------------> 5   blocks registered (or found cached
//!                                                          with equal content) in order
//!   cacheable          false after a weight reset or a hash collision: nothing more registered
//! ```

use super::block_pool::{BlockPool, NULL_BLOCK};
use super::prefix::{hash_block, BlockHasher, CacheInsert};
use super::{BlockId, KvCacheError};
use std::collections::HashMap;

/// The engine's id of a request (one sequence).
pub type RequestId = u64;

/// Prefix-cache lookups counted in tokens: `queries` sums the lengths of the token lists looked
/// up, `hits` the tokens found cached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    pub queries: u64,
    pub hits: u64,
}

impl PrefixCacheStats {
    /// `hits / queries`, 0 when nothing was looked up.
    pub fn hit_rate(&self) -> f64 {
        if self.queries == 0 {
            0.0
        } else {
            self.hits as f64 / self.queries as f64
        }
    }
}

#[derive(Clone, Debug)]
struct RequestBlocks {
    blocks: Vec<BlockId>,
    hasher: BlockHasher,
    num_cached_blocks: usize,
    cacheable: bool,
}

impl RequestBlocks {
    /// Registers the request's blocks that are full (the first `num_full_blocks`) and not yet
    /// cached, in order; on a hash collision stops caching this request's blocks for good.
    fn cache_full_blocks(&mut self, pool: &mut BlockPool, tokens: &[u32], num_full_blocks: usize) {
        let block_size = pool.block_size();
        let extra = self.hasher.extra();
        let hashes = self.hasher.update(&tokens[..num_full_blocks * block_size]);
        while self.num_cached_blocks < num_full_blocks {
            let i = self.num_cached_blocks;
            let parent = i.checked_sub(1).map(|p| hashes[p]);
            let block_tokens = &tokens[i * block_size..(i + 1) * block_size];
            match pool.cache_block(self.blocks[i], hashes[i], parent, block_tokens, extra) {
                CacheInsert::Inserted | CacheInsert::Duplicate => self.num_cached_blocks += 1,
                CacheInsert::Collision => {
                    // Blocks after this one would chain on a hash that names other content.
                    self.cacheable = false;
                    break;
                }
            }
        }
    }
}

/// [`KvCacheError::BadArguments`] for request `req`.
fn bad_arguments(req: RequestId, message: String) -> KvCacheError {
    KvCacheError::BadArguments {
        request: req,
        message,
    }
}

/// The paged KV cache's bookkeeping for all requests (see the module doc).
#[derive(Clone, Debug)]
pub struct KvCacheManager {
    pool: BlockPool,
    enable_prefix_caching: bool,
    requests: HashMap<RequestId, RequestBlocks>,
    stats: PrefixCacheStats,
}

impl KvCacheManager {
    /// `num_blocks` counts the reserved null block (so `num_blocks - 1` are usable).
    pub fn new(
        num_blocks: usize,
        block_size: usize,
        enable_prefix_caching: bool,
    ) -> Result<Self, KvCacheError> {
        Ok(Self {
            pool: BlockPool::new(num_blocks, block_size)?,
            enable_prefix_caching,
            requests: HashMap::new(),
            stats: PrefixCacheStats::default(),
        })
    }

    pub fn block_size(&self) -> usize {
        self.pool.block_size()
    }

    /// See [`BlockPool::set_evict_before_touching`].
    pub fn set_evict_before_touching(&mut self, evict_before_touching: bool) {
        self.pool.set_evict_before_touching(evict_before_touching);
    }

    /// All blocks, the null block included.
    pub fn num_blocks(&self) -> usize {
        self.pool.num_blocks()
    }

    pub fn num_free_blocks(&self) -> usize {
        self.pool.num_free_blocks()
    }

    pub fn num_used_blocks(&self) -> usize {
        self.pool.num_used_blocks()
    }

    /// Fraction of the usable blocks held by requests.
    pub fn usage(&self) -> f64 {
        self.pool.usage()
    }

    pub fn prefix_caching_enabled(&self) -> bool {
        self.enable_prefix_caching
    }

    /// Read-only view of the pool (ref counts, cached hashes, free-queue order).
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    pub fn prefix_cache_stats(&self) -> PrefixCacheStats {
        self.stats
    }

    pub fn reset_prefix_cache_stats(&mut self) {
        self.stats = PrefixCacheStats::default();
    }

    /// Requests that own blocks.
    pub fn num_requests(&self) -> usize {
        self.requests.len()
    }

    pub fn contains(&self, req: RequestId) -> bool {
        self.requests.contains_key(&req)
    }

    /// The request's blocks in token order (empty for a request the cache does not know).
    pub fn block_table(&self, req: RequestId) -> &[BlockId] {
        self.requests.get(&req).map_or(&[], |r| &r.blocks)
    }

    pub fn num_blocks_of(&self, req: RequestId) -> usize {
        self.block_table(req).len()
    }

    /// Blocks that hold `num_tokens` tokens.
    pub fn blocks_needed(&self, num_tokens: usize) -> usize {
        num_tokens.div_ceil(self.block_size())
    }

    /// `Err(NeverFits)` if `num_tokens` tokens need more blocks than the whole pool has; for
    /// admission checks (e.g. prompt + max_tokens) before a request is ever scheduled.
    pub fn check_fits(&self, req: RequestId, num_tokens: usize) -> Result<(), KvCacheError> {
        let blocks_needed = self.blocks_needed(num_tokens);
        if blocks_needed > self.pool.num_usable_blocks() {
            return Err(KvCacheError::NeverFits {
                request: req,
                num_tokens,
                blocks_needed,
                num_usable_blocks: self.pool.num_usable_blocks(),
                block_size: self.block_size(),
            });
        }
        Ok(())
    }

    /// The longest cached prefix of full blocks of `tokens`, and the tokens it covers. Never the
    /// whole list: at most `(tokens.len() - 1) / block_size` blocks, so at least one token is left
    /// to compute. Counts `tokens.len()` queries and the hit tokens in the stats (nothing when
    /// prefix caching is off). The blocks are not held until passed to
    /// [`allocate_slots`](Self::allocate_slots): call it before any other allocation or reset, or
    /// a hit may have been evicted meanwhile (`allocate_slots` then refuses it as stale).
    pub fn get_computed_blocks(&mut self, tokens: &[u32]) -> (Vec<BlockId>, usize) {
        self.get_computed_blocks_salted(tokens, None)
    }

    /// [`get_computed_blocks`](Self::get_computed_blocks) among the blocks cached with the
    /// extra key `salt` (a request's cache salt): blocks cached under another salt, or none,
    /// never match.
    pub fn get_computed_blocks_salted(
        &mut self,
        tokens: &[u32],
        salt: Option<u64>,
    ) -> (Vec<BlockId>, usize) {
        if !self.enable_prefix_caching {
            return (Vec::new(), 0);
        }
        let block_size = self.block_size();
        let max_blocks = tokens.len().saturating_sub(1) / block_size;
        let mut hits = Vec::new();
        let mut parent = None;
        for block_tokens in tokens.chunks_exact(block_size).take(max_blocks) {
            let hash = hash_block(parent, block_tokens, salt);
            match self.pool.lookup(hash, parent, block_tokens, salt) {
                Some(id) => hits.push(id),
                None => break,
            }
            parent = Some(hash);
        }
        let num_hit_tokens = hits.len() * block_size;
        self.stats.queries += tokens.len() as u64;
        self.stats.hits += num_hit_tokens as u64;
        (hits, num_hit_tokens)
    }

    /// Makes request `req` own blocks for `num_computed_tokens + num_new_tokens` tokens and caches
    /// each block that is full once those tokens are computed.
    ///
    /// - `tokens`: the request's whole known token list (prompt + generated so far). It must
    ///   extend the list given in earlier calls for the same request, and hold the scheduled
    ///   tokens: `num_computed_tokens + num_new_tokens <= tokens.len()`.
    /// - `num_computed_tokens`: tokens whose KV the request already has, hits included. For a
    ///   request new to the cache it equals the hit tokens, `new_computed_blocks.len() *
    ///   block_size`; afterwards at most what its blocks hold.
    /// - `new_computed_blocks`: the hits from [`get_computed_blocks`](Self::get_computed_blocks),
    ///   only on the request's first call; they are held (ref-counted) from now on.
    ///
    /// Returns the ids of the newly allocated blocks (appended to the block table after the hits),
    /// or `Ok(None)` when too few blocks are free right now; then nothing changed and the caller
    /// may free another request and retry. `Err` for requests that can never fit and for
    /// inconsistent arguments, also with nothing changed.
    pub fn allocate_slots(
        &mut self,
        req: RequestId,
        tokens: &[u32],
        num_computed_tokens: usize,
        num_new_tokens: usize,
        new_computed_blocks: &[BlockId],
    ) -> Result<Option<Vec<BlockId>>, KvCacheError> {
        self.allocate_slots_salted(
            req,
            tokens,
            num_computed_tokens,
            num_new_tokens,
            new_computed_blocks,
            None,
        )
    }

    /// [`allocate_slots`](Self::allocate_slots) for a request whose blocks are cached with the
    /// extra key `salt` (its cache salt; read on its first allocation, kept for its life).
    pub fn allocate_slots_salted(
        &mut self,
        req: RequestId,
        tokens: &[u32],
        num_computed_tokens: usize,
        num_new_tokens: usize,
        new_computed_blocks: &[BlockId],
        salt: Option<u64>,
    ) -> Result<Option<Vec<BlockId>>, KvCacheError> {
        let num_total = self.check_allocation(req, tokens, num_computed_tokens, num_new_tokens)?;
        let num_full_blocks = num_total / self.block_size();
        // A request new to the cache gets its state (hits checked) only once the blocks are free.
        let (num_owned, new_state) = match self.requests.get(&req) {
            Some(state) => {
                self.check_known_request(req, state, num_computed_tokens, new_computed_blocks)?;
                (state.blocks.len(), None)
            }
            None => {
                let tokens = &tokens[..num_full_blocks * self.block_size()];
                let state = self.first_allocation(
                    req,
                    tokens,
                    num_computed_tokens,
                    new_computed_blocks,
                    salt,
                )?;
                (new_computed_blocks.len(), Some(state))
            }
        };

        // Hits sitting in the free queue are taken out of it by `touch`.
        let num_new_blocks = self.blocks_needed(num_total).saturating_sub(num_owned);
        let num_reviving = new_computed_blocks
            .iter()
            .filter(|&&id| self.pool.ref_count(id) == 0);
        if num_new_blocks + num_reviving.count() > self.pool.num_free_blocks() {
            return Ok(None);
        }

        self.pool.touch(new_computed_blocks);
        let new_blocks = self
            .pool
            .allocate(num_new_blocks)
            .expect("free blocks counted above");
        let state = match new_state {
            Some(state) => self.requests.entry(req).or_insert(state),
            None => self.requests.get_mut(&req).expect("looked up above"),
        };
        state.blocks.extend_from_slice(new_computed_blocks);
        state.blocks.extend_from_slice(&new_blocks);
        if state.cacheable {
            state.cache_full_blocks(&mut self.pool, tokens, num_full_blocks);
        }
        Ok(Some(new_blocks))
    }

    /// [`Self::allocate_slots`]'s token counts: the scheduled tokens are given and fit the pool.
    /// Returns `num_computed_tokens + num_new_tokens`.
    fn check_allocation(
        &self,
        req: RequestId,
        tokens: &[u32],
        num_computed_tokens: usize,
        num_new_tokens: usize,
    ) -> Result<usize, KvCacheError> {
        let num_total = num_computed_tokens
            .checked_add(num_new_tokens)
            .ok_or_else(|| {
                bad_arguments(
                    req,
                    format!("num_computed_tokens {num_computed_tokens} + num_new_tokens overflows"),
                )
            })?;
        if num_total > tokens.len() {
            return Err(bad_arguments(
                req,
                format!(
                    "num_computed_tokens {num_computed_tokens} + num_new_tokens {num_new_tokens} = \
                     {num_total} is more than the {} tokens given",
                    tokens.len()
                ),
            ));
        }
        self.check_fits(req, num_total)?;
        Ok(num_total)
    }

    /// A request the cache knows takes no more hits and has computed at most what its blocks hold.
    fn check_known_request(
        &self,
        req: RequestId,
        state: &RequestBlocks,
        num_computed_tokens: usize,
        new_computed_blocks: &[BlockId],
    ) -> Result<(), KvCacheError> {
        if !new_computed_blocks.is_empty() {
            return Err(bad_arguments(
                req,
                format!(
                    "prefix-cache hits are taken on a request's first allocation only; it \
                     owns {} blocks already",
                    state.blocks.len()
                ),
            ));
        }
        let held = state.blocks.len() * self.block_size();
        if num_computed_tokens > held {
            return Err(bad_arguments(
                req,
                format!(
                    "num_computed_tokens {num_computed_tokens}, but its {} blocks hold {held}",
                    state.blocks.len()
                ),
            ));
        }
        Ok(())
    }

    /// The state of a request new to the cache, after checking its hits: it has computed exactly
    /// them, and each is the cached block for its tokens. `full_tokens`: the tokens of the
    /// blocks full after this allocation (hashed now, to prove the hits and register blocks).
    fn first_allocation(
        &self,
        req: RequestId,
        full_tokens: &[u32],
        num_computed_tokens: usize,
        new_computed_blocks: &[BlockId],
        salt: Option<u64>,
    ) -> Result<RequestBlocks, KvCacheError> {
        let block_size = self.block_size();
        let num_hit_tokens = new_computed_blocks.len() * block_size;
        if num_computed_tokens != num_hit_tokens {
            return Err(bad_arguments(
                req,
                format!(
                    "a request new to the cache has computed exactly its prefix hits ({} \
                     blocks = {num_hit_tokens} tokens), not num_computed_tokens {}",
                    new_computed_blocks.len(),
                    num_computed_tokens
                ),
            ));
        }
        if !new_computed_blocks.is_empty() && !self.enable_prefix_caching {
            return Err(bad_arguments(
                req,
                "prefix-cache hits given, but prefix caching is off".into(),
            ));
        }
        // The hash chain, needed to register blocks anyway, proves the hits are the cached
        // blocks for these very tokens.
        let mut hasher = BlockHasher::new(block_size, salt);
        if self.enable_prefix_caching {
            hasher.update(full_tokens);
        }
        for (i, &id) in new_computed_blocks.iter().enumerate() {
            if !self.pool.is_valid_block(id) {
                return Err(bad_arguments(
                    req,
                    format!("prefix hit {i}: {id} is not a usable block id"),
                ));
            }
            if self.pool.cached_hash(id) != Some(hasher.hashes()[i]) {
                return Err(bad_arguments(
                    req,
                    format!(
                        "prefix hit {i}: block {id} is not the cached block for these tokens \
                         (evicted or reset since get_computed_blocks?)"
                    ),
                ));
            }
        }
        Ok(RequestBlocks {
            blocks: Vec::new(),
            hasher,
            num_cached_blocks: new_computed_blocks.len(),
            cacheable: self.enable_prefix_caching,
        })
    }

    /// Releases the request's blocks (tail first; cached ones stay cached until reused) and
    /// forgets the request. `false` if the cache did not know it.
    pub fn free(&mut self, req: RequestId) -> bool {
        match self.requests.remove(&req) {
            Some(state) => {
                self.pool.free(&state.blocks);
                true
            }
            None => false,
        }
    }

    /// For a weight update: forgets every cached hash, also those of blocks running requests hold
    /// (their KV came from the old weights and must never serve a new request), and stops the
    /// running requests from caching their later blocks. Returns how many entries were dropped.
    pub fn reset_prefix_cache(&mut self) -> usize {
        for state in self.requests.values_mut() {
            state.cacheable = false;
        }
        self.pool.reset_prefix_cache()
    }

    /// Every invariant of the pool and of the requests' tables; the first violation, in words.
    /// Costs O(blocks + table entries): for tests and debug builds.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.pool.check_invariants()?;
        let mut holders = vec![0u32; self.num_blocks()];
        for (req, state) in &self.requests {
            for (i, &id) in state.blocks.iter().enumerate() {
                if id == NULL_BLOCK || !self.pool.is_valid_block(id) {
                    return Err(format!("request {req}: block table entry {i} is {id}"));
                }
                holders[id as usize] += 1;
                let own_hash = self.pool.cached_hash(id);
                if own_hash.is_some() && own_hash != state.hasher.hashes().get(i).copied() {
                    return Err(format!(
                        "request {req}: block {id} is cached under another hash"
                    ));
                }
            }
            if state.num_cached_blocks > state.blocks.len()
                || state.num_cached_blocks > state.hasher.hashes().len()
            {
                return Err(format!(
                    "request {req}: num_cached_blocks past its blocks or hashes"
                ));
            }
        }
        for (id, &n) in holders.iter().enumerate().skip(1) {
            let rc = self.pool.ref_count(id as BlockId);
            if rc != n {
                return Err(format!(
                    "block {id}: ref_cnt {rc} but {n} block tables hold it"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kvcache::prefix::hash_request_blocks;
    use crate::kvcache::test_support::{admit, tokens};

    /// Everything observable, to show that a refused call changed nothing.
    fn snapshot(m: &KvCacheManager) -> impl PartialEq + std::fmt::Debug {
        let mut tables: Vec<_> = m
            .requests
            .iter()
            .map(|(r, s)| (*r, s.blocks.clone()))
            .collect();
        tables.sort();
        let refs: Vec<u32> = (0..m.num_blocks() as BlockId)
            .map(|b| m.pool.ref_count(b))
            .collect();
        let hashes: Vec<_> = (0..m.num_blocks() as BlockId)
            .map(|b| m.pool.cached_hash(b))
            .collect();
        (tables, refs, hashes, m.pool.free_queue_order(), m.stats)
    }

    #[test]
    fn new_rejects_unusable_shapes() {
        for (num_blocks, block_size) in [(1, 16), (64, 0)] {
            let m = KvCacheManager::new(num_blocks, block_size, true);
            assert!(matches!(m, Err(KvCacheError::BadConfig(_))));
        }
        let m = KvCacheManager::new(64, 16, true).unwrap();
        let shape = (
            m.num_blocks(),
            m.block_size(),
            m.num_free_blocks(),
            m.num_used_blocks(),
        );
        assert_eq!((shape, m.usage()), ((64, 16, 63, 0), 0.0));
    }

    #[test]
    fn chunked_prefill_then_decode_grows_the_table() {
        let mut m = KvCacheManager::new(16, 4, true).unwrap();
        let mut toks = tokens(0..10);
        let first_chunk = m.allocate_slots(1, &toks, 0, 6, &[]).unwrap();
        // Block 1 is full once the chunk runs: cached now.
        assert_eq!(
            (first_chunk, m.pool().num_cached_blocks()),
            (Some(vec![1, 2]), 1)
        );
        let second_chunk = m.allocate_slots(1, &toks, 6, 4, &[]).unwrap();
        assert_eq!(second_chunk, Some(vec![3]));
        assert_eq!((m.num_blocks_of(1), m.pool().num_cached_blocks()), (3, 2));
        // Decode: tokens 10 and 11 fill block 3, token 12 opens block 4.
        let mut new_per_token = Vec::new();
        for t in 10..13 {
            toks.push(t);
            let new = m
                .allocate_slots(1, &toks, toks.len() - 1, 1, &[])
                .unwrap()
                .unwrap();
            new_per_token.push((new, m.pool().num_cached_blocks()));
            m.check_invariants().unwrap();
        }
        assert_eq!(new_per_token, vec![(vec![], 2), (vec![], 3), (vec![4], 3)]);
        assert_eq!(m.block_table(1), &[1, 2, 3, 4]);
        let chain = hash_request_blocks(&toks, 4, None);
        assert_eq!(m.pool().cached_hash(3), Some(chain[2]));
        let unknown = (m.block_table(99), m.num_blocks_of(99));
        assert_eq!((m.num_used_blocks(), unknown), (4, (&[][..], 0)));
        // Zero new tokens is a no-op allocation.
        assert_eq!(
            m.allocate_slots(1, &toks, 13, 0, &[]).unwrap(),
            Some(vec![])
        );
        assert!(m.free(1));
        assert!(!m.free(1), "freeing an unknown request is a no-op");
        // The uncached tail block is reused first, the cached ones last, tail first.
        let order = m.pool().free_queue_order();
        assert_eq!((order[0], &order[12..]), (4, &[3, 2, 1][..]));
        m.check_invariants().unwrap();
    }

    #[test]
    fn hits_on_free_blocks_revive_them_and_count_against_free_space() {
        let mut m = KvCacheManager::new(6, 4, true).unwrap(); // 5 usable
        let prompt = tokens(0..13); // 3 full blocks + 1 token
        assert_eq!(admit(&mut m, 1, &prompt), Some(vec![1, 2, 3, 4]));
        m.free(1); // queue: 4 5 3 2 1, blocks 1-3 still cached
        m.check_invariants().unwrap();
        // The next request hits the 3 cached free blocks; with 5 free, 2 more can be allocated.
        let long = [tokens(0..12), tokens(50..58)].concat(); // 5 blocks in all
        let (hits, n) = m.get_computed_blocks(&long);
        assert_eq!((hits.clone(), n), (vec![1, 2, 3], 12));
        let too_long = [tokens(0..12), tokens(50..59)].concat(); // needs 6 - 3 = 3 new, 2 left
        let before = snapshot(&m);
        let err = m.allocate_slots(2, &too_long, 12, 9, &hits).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("request 2: 21 tokens need 6 KV blocks"),
            "{err}"
        );
        assert_eq!(snapshot(&m), before);
        let new = m.allocate_slots(2, &long, 12, 8, &hits).unwrap();
        assert_eq!(new, Some(vec![4, 5]));
        assert_eq!(m.block_table(2), &[1, 2, 3, 4, 5]);
        assert_eq!(m.num_free_blocks(), 0);
        m.check_invariants().unwrap();
    }

    #[test]
    fn temporarily_full_changes_nothing() {
        let mut m = KvCacheManager::new(5, 4, true).unwrap(); // 4 usable
        assert_eq!(admit(&mut m, 1, &tokens(0..9)), Some(vec![1, 2, 3]));
        let prompt = tokens(0..9);
        let (hits, n) = m.get_computed_blocks(&prompt);
        assert_eq!(hits, vec![1, 2]);
        // Request 2 needs its own third block: 1 free, fine. Request 3 then finds none.
        assert!(m.allocate_slots(2, &prompt, n, 1, &hits).unwrap().is_some());
        let other = tokens(200..209);
        let before = snapshot(&m);
        assert_eq!(m.allocate_slots(3, &other, 0, 9, &[]).unwrap(), None);
        assert_eq!(snapshot(&m), before);
        assert!(!m.contains(3));
        // A running request that cannot grow is refused the same way.
        let mut grown = prompt.clone();
        grown.extend(9..13);
        assert_eq!(m.allocate_slots(1, &grown, 9, 4, &[]).unwrap(), None);
        assert_eq!(snapshot(&m), before);
        // After a preemption the retry succeeds.
        m.free(2);
        let new = m.allocate_slots(1, &grown, 9, 4, &[]).unwrap();
        assert_eq!(new, Some(vec![4]));
        m.check_invariants().unwrap();
    }

    #[test]
    fn never_fits_names_the_tokens_and_the_pool() {
        let mut m = KvCacheManager::new(9, 16, true).unwrap();
        let toks = vec![7; 200];
        let err = m.allocate_slots(5, &toks, 0, 200, &[]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "request 5: 200 tokens need 13 KV blocks of 16 tokens, \
             but the whole cache has 8 blocks (128 tokens)"
        );
        assert!(m.check_fits(5, 128).is_ok() && m.check_fits(5, 129).is_err());
        assert_eq!(m.num_requests(), 0);
    }

    #[test]
    fn inconsistent_arguments_are_errors_not_panics() {
        let mut m = KvCacheManager::new(32, 4, true).unwrap();
        let toks = tokens(0..10);
        let bad = |r: Result<Option<Vec<BlockId>>, KvCacheError>| match r {
            Err(KvCacheError::BadArguments { message, .. }) => message,
            other => panic!("expected BadArguments, got {other:?}"),
        };
        assert!(bad(m.allocate_slots(1, &toks, 8, 3, &[])).contains("more than the 10 tokens"));
        assert!(bad(m.allocate_slots(1, &toks, usize::MAX, 1, &[])).contains("overflows"));
        assert!(bad(m.allocate_slots(1, &toks, 4, 1, &[])).contains("exactly its prefix hits"));
        assert!(bad(m.allocate_slots(1, &toks, 4, 1, &[0])).contains("not a usable block"));
        assert!(bad(m.allocate_slots(1, &toks, 4, 1, &[77])).contains("not a usable block"));
        assert!(bad(m.allocate_slots(1, &toks, 4, 1, &[3])).contains("not the cached block"));
        assert_eq!(admit(&mut m, 1, &toks), Some(vec![1, 2, 3]));
        let (hits, n) = m.get_computed_blocks(&toks);
        assert_eq!(hits, vec![1, 2]);
        // Hits given twice, hits for other tokens, more computed than held.
        assert!(bad(m.allocate_slots(1, &toks, 8, 0, &hits)).contains("first allocation"));
        let shifted = tokens(1..11);
        assert!(bad(m.allocate_slots(2, &shifted, n, 2, &hits)).contains("not the cached block"));
        let mut longer = toks.clone();
        longer.extend(10..20);
        assert!(bad(m.allocate_slots(1, &longer, 13, 1, &[])).contains("hold 12"));
        // Stale hits: the cache was reset between lookup and allocation.
        m.reset_prefix_cache();
        assert!(bad(m.allocate_slots(2, &toks, n, 2, &hits)).contains("reset"));
        let mut off = KvCacheManager::new(8, 4, false).unwrap();
        assert!(bad(off.allocate_slots(1, &toks, 4, 1, &[1])).contains("prefix caching is off"));
        m.check_invariants().unwrap();
        assert_eq!(m.num_requests(), 1);
    }

    #[test]
    fn a_hash_collision_is_a_miss_and_stops_the_chain() {
        let mut m = KvCacheManager::new(32, 4, true).unwrap();
        let toks = tokens(0..13);
        let chain = hash_request_blocks(&toks, 4, None);
        // Forge a collision: block 1 cached under the real hash of the prompt's block 1 but
        // holding other tokens.
        let forged = m.pool.allocate(1).unwrap()[0];
        let (hash, parent) = (chain[1], Some(chain[0]));
        let outcome = m
            .pool
            .cache_block(forged, hash, parent, &[9, 9, 9, 9], None);
        assert_eq!(outcome, CacheInsert::Inserted);
        m.pool.free(&[forged]);
        assert_eq!(admit(&mut m, 1, &toks), Some(vec![2, 3, 4, 5]));
        assert_eq!(m.pool().cached_hash(2), Some(chain[0]));
        let later = (m.pool().cached_hash(3), m.pool().cached_hash(4));
        assert_eq!((later, m.requests[&1].cacheable), ((None, None), false));
        let (hits, n) = m.get_computed_blocks(&[toks.clone(), vec![0]].concat());
        assert_eq!((hits, n), (vec![2], 4), "never the forged block");
        m.check_invariants().unwrap();
    }

    #[test]
    fn check_invariants_catches_a_wrong_ref_count() {
        let mut m = KvCacheManager::new(8, 4, true).unwrap();
        admit(&mut m, 1, &tokens(0..6)).unwrap();
        m.pool.touch(&[1]); // a holder no block table knows about
        let err = m.check_invariants().unwrap_err();
        assert!(err.contains("block 1: ref_cnt 2"), "{err}");
    }
}
