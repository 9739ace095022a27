//! The block pool: reference counts, the free queue (lazy LRU eviction) and the prefix cache.
//!
//! ```text
//!   block id    0     1     2     3     4     5     6     7     8
//!   ref_cnt     -     2     1     0     0     1     0     0     0   block 0: the null block, never
//!   hash        -     h0    h1    h7    -     -     h3    -     -   handed out (block-table padding)
//!                                                               8: never used yet
//!
//!   free queue (doubly linked through prev/next arrays of block ids, no allocation per op):
//!
//!      head -> [4] <-> [7] <-> [8] <-> [3] <-> [6] <- tail
//!              ^ freed without a hash:         ^ freed with a hash: pushed at the back, so
//!                pushed at the front, reused     cached KV is evicted least recently freed
//!                first (their KV is worthless)   first (LRU), and only once nothing else is free
//!      pop here: allocate
//! ```
//!
//! - Every non-null block with `ref_cnt == 0` is in the free queue, and no other block is.
//! - A free block may still carry a hash: its KV is valid and a prefix-cache hit revives it
//!   ([`BlockPool::touch`] unlinks it from the middle of the queue in O(1)). Its cache entry is
//!   only dropped when [`BlockPool::allocate`] pops it for new content (lazy eviction).
//! - Blocks freed without a hash go to the front: a block just written is reused before a block
//!   never touched, so the memory the pool actually touches (the resident set of a CPU cache,
//!   whose pages the system maps on first write) stays near the blocks in use plus those the
//!   prefix cache keeps, however large the pool. Cached blocks are evicted only when no uncached
//!   block is free.
//! - [`BlockPool::free`] takes a request's block table and releases it tail first, so within a
//!   sequence the last cached blocks (least likely to be shared) are evicted before the first ones.

use super::prefix::{BlockHash, CacheInsert, CachedBlock, PrefixCache};
use super::{BlockId, KvCacheError};

/// Block 0: never handed out; pads block tables.
pub const NULL_BLOCK: BlockId = 0;

/// Tokens per block unless configured otherwise.
pub const DEFAULT_BLOCK_SIZE: usize = 16;

/// "No block" in the free queue's links.
const NIL: BlockId = BlockId::MAX;

/// An index-linked doubly-linked list of block ids: O(1) push at either end, pop-front and
/// removal of any member, with all storage allocated up front.
#[derive(Clone, Debug)]
struct FreeQueue {
    prev: Vec<BlockId>,
    next: Vec<BlockId>,
    in_queue: Vec<bool>,
    head: BlockId,
    tail: BlockId,
    len: usize,
}

impl FreeQueue {
    fn new(num_blocks: usize) -> Self {
        Self {
            prev: vec![NIL; num_blocks],
            next: vec![NIL; num_blocks],
            in_queue: vec![false; num_blocks],
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }

    fn contains(&self, id: BlockId) -> bool {
        self.in_queue[id as usize]
    }

    fn push_back(&mut self, id: BlockId) {
        debug_assert!(!self.contains(id), "block {id} is already free");
        let i = id as usize;
        self.prev[i] = self.tail;
        self.next[i] = NIL;
        if self.tail == NIL {
            self.head = id;
        } else {
            self.next[self.tail as usize] = id;
        }
        self.tail = id;
        self.in_queue[i] = true;
        self.len += 1;
    }

    fn push_front(&mut self, id: BlockId) {
        debug_assert!(!self.contains(id), "block {id} is already free");
        let i = id as usize;
        self.prev[i] = NIL;
        self.next[i] = self.head;
        if self.head == NIL {
            self.tail = id;
        } else {
            self.prev[self.head as usize] = id;
        }
        self.head = id;
        self.in_queue[i] = true;
        self.len += 1;
    }

    /// Links `id` in just before `anchor` (a member).
    fn insert_before(&mut self, anchor: BlockId, id: BlockId) {
        debug_assert!(!self.contains(id) && self.contains(anchor));
        let (i, a) = (id as usize, anchor as usize);
        let p = self.prev[a];
        self.prev[i] = p;
        self.next[i] = anchor;
        self.prev[a] = id;
        if p == NIL {
            self.head = id;
        } else {
            self.next[p as usize] = id;
        }
        self.in_queue[i] = true;
        self.len += 1;
    }

    fn pop_front(&mut self) -> Option<BlockId> {
        let id = self.head;
        if id == NIL {
            return None;
        }
        self.remove(id);
        Some(id)
    }

    fn remove(&mut self, id: BlockId) {
        debug_assert!(self.contains(id), "block {id} is not free");
        let i = id as usize;
        let (p, n) = (self.prev[i], self.next[i]);
        if p == NIL {
            self.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.prev[i] = NIL;
        self.next[i] = NIL;
        self.in_queue[i] = false;
        self.len -= 1;
    }

    /// Walks head to tail; stops after `limit` steps so a corrupted (cyclic) list still ends.
    fn walk(&self, limit: usize) -> Vec<BlockId> {
        let mut out = Vec::new();
        let mut id = self.head;
        while id != NIL && out.len() <= limit {
            out.push(id);
            id = self.next[id as usize];
        }
        out
    }
}

/// Fixed-size pool of KV blocks with reference counts, a free queue and the prefix cache.
///
/// Block ids given to [`touch`](Self::touch), [`free`](Self::free) and
/// [`cache_block`](Self::cache_block) must come from this pool (the manager checks what callers
/// pass it); an id out of range panics.
#[derive(Clone, Debug)]
pub struct BlockPool {
    block_size: usize,
    ref_cnt: Vec<u32>,
    cached_hash: Vec<Option<BlockHash>>,
    free_queue: FreeQueue,
    cache: PrefixCache,
    /// The first block never handed out yet (NIL when every block has been used): the queue's
    /// tail from here on is the blocks never touched, in id order.
    first_untouched: BlockId,
    /// Freed cached blocks go before the never-touched ones instead of after them.
    evict_before_touching: bool,
}

impl BlockPool {
    /// `num_blocks` counts the null block, so at least 2; `block_size` at least 1.
    pub fn new(num_blocks: usize, block_size: usize) -> Result<Self, KvCacheError> {
        if num_blocks < 2 || num_blocks >= NIL as usize {
            return Err(KvCacheError::BadConfig(format!(
                "num_blocks = {num_blocks}: need at least 2 (block 0 is the reserved null block) \
                 and fewer than {NIL}"
            )));
        }
        if block_size == 0 {
            return Err(KvCacheError::BadConfig(
                "block_size = 0: need at least 1 token".into(),
            ));
        }
        let mut free_queue = FreeQueue::new(num_blocks);
        for id in 1..num_blocks as BlockId {
            free_queue.push_back(id);
        }
        Ok(Self {
            block_size,
            ref_cnt: vec![0; num_blocks],
            cached_hash: vec![None; num_blocks],
            free_queue,
            cache: PrefixCache::new(),
            first_untouched: 1,
            evict_before_touching: false,
        })
    }

    /// Where never-touched memory costs something (a CPU cache, whose pages the system maps on
    /// first write), evict the least recently freed cached block before touching a new one: the
    /// free queue becomes `[freed uncached] [cached, LRU] [never touched]`, and the resident set
    /// stays at the most blocks ever in use at once. Where the pool is resident anyway (a GPU),
    /// the default keeps cached prefixes as long as any never-touched block is left.
    pub fn set_evict_before_touching(&mut self, evict_before_touching: bool) {
        self.evict_before_touching = evict_before_touching;
    }

    /// Block `id` leaves the free queue to be used: the never-touched run (the blocks from
    /// `first_untouched` on, in id order in the queue) then starts after it. Only `allocate`
    /// takes blocks from that run in practice (it pops them in order); a `touch` of a block there
    /// (uncached, so never a prefix hit) gives up the blocks before it as well.
    fn mark_touched(&mut self, id: BlockId) {
        if self.first_untouched != NIL && id >= self.first_untouched {
            self.first_untouched = if (id as usize) + 1 < self.num_blocks() {
                id + 1
            } else {
                NIL
            };
        }
    }

    /// All blocks, the null block included.
    pub fn num_blocks(&self) -> usize {
        self.ref_cnt.len()
    }

    /// Blocks that can ever be handed out: all but the null block.
    pub fn num_usable_blocks(&self) -> usize {
        self.num_blocks() - 1
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks in the free queue (cached or not): what [`allocate`](Self::allocate) can hand out.
    pub fn num_free_blocks(&self) -> usize {
        self.free_queue.len
    }

    /// Blocks held by at least one request (the null block is never counted).
    pub fn num_used_blocks(&self) -> usize {
        self.num_usable_blocks() - self.num_free_blocks()
    }

    /// `num_used_blocks / num_usable_blocks`, in [0, 1].
    pub fn usage(&self) -> f64 {
        self.num_used_blocks() as f64 / self.num_usable_blocks() as f64
    }

    pub fn ref_count(&self, id: BlockId) -> u32 {
        self.ref_cnt[id as usize]
    }

    pub fn cached_hash(&self, id: BlockId) -> Option<BlockHash> {
        self.cached_hash[id as usize]
    }

    /// Whether `id` names a block that may be handed out (in range and not the null block).
    pub fn is_valid_block(&self, id: BlockId) -> bool {
        id != NULL_BLOCK && (id as usize) < self.num_blocks()
    }

    /// The free queue from head (next to be reused) to tail.
    pub fn free_queue_order(&self) -> Vec<BlockId> {
        self.free_queue.walk(self.num_blocks())
    }

    /// Entries in the prefix cache.
    pub fn num_cached_blocks(&self) -> usize {
        self.cache.len()
    }

    /// `n` blocks with reference count 1, or `None` (and nothing changed) if fewer are free.
    /// A block popped with a cached hash has its cache entry evicted now.
    pub fn allocate(&mut self, n: usize) -> Option<Vec<BlockId>> {
        if n > self.num_free_blocks() {
            return None;
        }
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let id = self.free_queue.pop_front().expect("counted above");
            self.mark_touched(id);
            if let Some(hash) = self.cached_hash[id as usize].take() {
                self.cache.remove(hash, id);
            }
            self.ref_cnt[id as usize] = 1;
            out.push(id);
        }
        Some(out)
    }

    /// One more holder for each block (a prefix-cache hit); a free block leaves the free queue.
    pub fn touch(&mut self, blocks: &[BlockId]) {
        for &id in blocks {
            assert!(
                self.is_valid_block(id),
                "touch: block {id} is not a usable block"
            );
            if self.ref_cnt[id as usize] == 0 {
                self.free_queue.remove(id);
                self.mark_touched(id);
            }
            self.ref_cnt[id as usize] += 1;
        }
    }

    /// Releases one holder of each block of a request's block table (given in table order),
    /// tail first. A block left with no holder joins the free queue: at the back when it carries
    /// a cached hash (kept until the block is reallocated), at the front otherwise.
    pub fn free(&mut self, block_table: &[BlockId]) {
        for &id in block_table.iter().rev() {
            assert!(
                self.is_valid_block(id),
                "free: block {id} is not a usable block"
            );
            let rc = &mut self.ref_cnt[id as usize];
            assert!(*rc > 0, "free: block {id} is not in use");
            *rc -= 1;
            if *rc == 0 {
                if self.cached_hash[id as usize].is_some() {
                    if self.evict_before_touching && self.first_untouched != NIL {
                        self.free_queue.insert_before(self.first_untouched, id);
                    } else {
                        self.free_queue.push_back(id);
                    }
                } else {
                    self.free_queue.push_front(id);
                }
            }
        }
    }

    /// The block cached for `hash` with this parent, tokens and extra key, in use or free.
    pub fn lookup(
        &self,
        hash: BlockHash,
        parent: Option<BlockHash>,
        tokens: &[u32],
        extra: Option<u64>,
    ) -> Option<BlockId> {
        self.cache.lookup(hash, parent, tokens, extra)
    }

    /// Registers a full, in-use block as the cached copy of `hash` unless that hash is taken (see
    /// [`CacheInsert`]). A block that already carries a hash keeps it and reports `Duplicate` for
    /// the same hash, `Collision` for another.
    pub fn cache_block(
        &mut self,
        id: BlockId,
        hash: BlockHash,
        parent: Option<BlockHash>,
        tokens: &[u32],
        extra: Option<u64>,
    ) -> CacheInsert {
        assert!(
            self.is_valid_block(id),
            "cache_block: block {id} is not a usable block"
        );
        debug_assert_eq!(tokens.len(), self.block_size, "only full blocks are cached");
        if let Some(own) = self.cached_hash[id as usize] {
            return if own == hash {
                CacheInsert::Duplicate
            } else {
                CacheInsert::Collision
            };
        }
        let entry = CachedBlock {
            block: id,
            parent,
            extra,
            tokens: tokens.into(),
        };
        let outcome = self.cache.insert(hash, entry);
        if outcome == CacheInsert::Inserted {
            self.cached_hash[id as usize] = Some(hash);
        }
        outcome
    }

    /// Forgets every cached hash, of free and in-use blocks alike (their KV came from weights
    /// that are gone). Returns how many entries were dropped. Free blocks that were cached move
    /// to the front of the free queue in their order (they are uncached now, and reusing them
    /// touches no new memory); the rest of the queue keeps its order.
    pub fn reset_prefix_cache(&mut self) -> usize {
        let was_cached_free: Vec<BlockId> = self
            .free_queue_order()
            .into_iter()
            .filter(|&id| self.cached_hash[id as usize].is_some())
            .collect();
        for &id in was_cached_free.iter().rev() {
            self.free_queue.remove(id);
            self.free_queue.push_front(id);
        }
        self.cached_hash.iter_mut().for_each(|h| *h = None);
        self.cache.clear()
    }

    /// The pool's own invariants (see the module doc); the first violation found, in words.
    pub fn check_invariants(&self) -> Result<(), String> {
        let n = self.num_blocks();
        let q = &self.free_queue;
        if self.ref_cnt[0] != 0 || self.cached_hash[0].is_some() || q.contains(NULL_BLOCK) {
            return Err("the null block is in use, cached or free".into());
        }
        let order = q.walk(n);
        if order.len() != q.len {
            return Err(format!(
                "free queue walks {} blocks but counts {}",
                order.len(),
                q.len
            ));
        }
        let mut seen = vec![false; n];
        let mut prev = NIL;
        for &id in &order {
            if seen[id as usize] {
                return Err(format!("block {id} is twice in the free queue"));
            }
            seen[id as usize] = true;
            if q.prev[id as usize] != prev {
                return Err(format!("free queue: block {id}'s prev link is broken"));
            }
            prev = id;
        }
        if q.tail != prev {
            return Err("free queue: tail is not the last block".into());
        }
        if self.first_untouched != NIL {
            let untouched = self.first_untouched..n as BlockId;
            let start = order.iter().position(|&id| id == self.first_untouched);
            let run = start.map(|s| &order[s..(s + untouched.len()).min(order.len())]);
            if !run.is_some_and(|run| run.iter().copied().eq(untouched.clone())) {
                return Err(format!(
                    "the never-touched blocks {untouched:?} are not together in the free queue"
                ));
            }
        }
        for (id, (&rc, &in_walk)) in self.ref_cnt.iter().zip(&seen).enumerate().skip(1) {
            if (rc == 0) != in_walk || in_walk != q.in_queue[id] {
                let where_ = if in_walk { "in" } else { "not in" };
                return Err(format!(
                    "block {id}: ref_cnt {rc} but {where_} the free queue"
                ));
            }
            if let Some(h) = self.cached_hash[id] {
                if self.cache.get(h).map(|c| c.block) != Some(id as BlockId) {
                    return Err(format!(
                        "block {id} carries hash {h:?}; the cache disagrees"
                    ));
                }
            }
        }
        for (h, c) in self.cache.iter() {
            if !self.is_valid_block(c.block) || self.cached_hash[c.block as usize] != Some(h) {
                return Err(format!(
                    "cache entry {h:?} names block {} which lacks it",
                    c.block
                ));
            }
            if c.tokens.len() != self.block_size {
                return Err(format!("cache entry {h:?} holds {} tokens", c.tokens.len()));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kvcache::prefix::hash_block;

    fn pool(num_blocks: usize) -> BlockPool {
        BlockPool::new(num_blocks, 4).unwrap()
    }

    /// Caches `id` under a hash made from `seed` (content `[seed; 4]`, root parent).
    fn cache(p: &mut BlockPool, id: BlockId, seed: u32) -> BlockHash {
        let h = hash_block(None, &[seed; 4], None);
        assert_eq!(
            p.cache_block(id, h, None, &[seed; 4], None),
            CacheInsert::Inserted
        );
        h
    }

    #[test]
    fn rejects_unusable_shapes() {
        assert!(matches!(
            BlockPool::new(1, 16),
            Err(KvCacheError::BadConfig(_))
        ));
        assert!(matches!(
            BlockPool::new(8, 0),
            Err(KvCacheError::BadConfig(_))
        ));
        let p = BlockPool::new(2, 16).unwrap();
        assert_eq!(
            (
                p.num_usable_blocks(),
                p.num_free_blocks(),
                p.num_used_blocks()
            ),
            (1, 1, 0)
        );
    }

    #[test]
    fn allocates_in_order_and_never_hands_out_the_null_block() {
        let mut p = pool(5);
        assert_eq!(p.free_queue_order(), vec![1, 2, 3, 4]);
        assert_eq!(p.allocate(3), Some(vec![1, 2, 3]));
        assert_eq!((p.num_free_blocks(), p.num_used_blocks()), (1, 3));
        assert_eq!(p.usage(), 0.75);
        assert_eq!(p.allocate(2), None, "all or nothing");
        assert_eq!(p.num_free_blocks(), 1);
        assert_eq!(p.allocate(1), Some(vec![4]));
        assert_eq!(p.allocate(1), None);
        assert_eq!(p.allocate(0), Some(vec![]));
        assert!((1..5).all(|id| p.ref_count(id) == 1) && p.ref_count(NULL_BLOCK) == 0);
        p.check_invariants().unwrap();
    }

    #[test]
    fn uncached_blocks_are_freed_to_the_front_cached_ones_to_the_back() {
        let mut p = pool(8);
        let a = p.allocate(3).unwrap(); // 1 2 3
        let b = p.allocate(2).unwrap(); // 4 5
        assert_eq!(p.free_queue_order(), vec![6, 7]);
        p.free(&a);
        assert_eq!(p.free_queue_order(), vec![1, 2, 3, 6, 7]);
        p.free(&b);
        assert_eq!(p.free_queue_order(), vec![4, 5, 1, 2, 3, 6, 7]);
        assert_eq!(p.num_used_blocks(), 0);
        p.check_invariants().unwrap();
        assert_eq!(p.allocate(3), Some(vec![4, 5, 1]));
        // Cached blocks go to the back, the table's tail first (evicted first).
        let c = p.allocate(4).unwrap(); // 2 3 6 7
        for (seed, &id) in c.iter().enumerate() {
            cache(&mut p, id, seed as u32);
        }
        p.free(&c);
        assert_eq!(p.free_queue_order(), vec![7, 6, 3, 2]);
        p.check_invariants().unwrap();
    }

    #[test]
    fn a_freed_uncached_block_is_reused_before_untouched_and_cached_ones() {
        let mut p = pool(8);
        let a = p.allocate(3).unwrap(); // 1 2 3: written
        let h1 = cache(&mut p, 1, 7); // block 1 holds a cached prefix
        p.free(&a);
        // 2 and 3 were written and carry no hash; 4..7 were never touched; 1 is cached.
        assert_eq!(p.free_queue_order(), vec![2, 3, 4, 5, 6, 7, 1]);
        assert_eq!(
            p.allocate(1),
            Some(vec![2]),
            "a freed block before a new one"
        );
        p.free(&[2]);
        assert_eq!(p.allocate(2), Some(vec![2, 3]));
        // The never-touched blocks go before the cached prefix is evicted.
        assert_eq!(p.allocate(4), Some(vec![4, 5, 6, 7]));
        assert_eq!(p.lookup(h1, None, &[7; 4], None), Some(1), "still cached");
        assert_eq!(p.allocate(1), Some(vec![1]), "evicted last");
        assert_eq!(p.num_cached_blocks(), 0);
        p.check_invariants().unwrap();
    }

    #[test]
    fn shared_blocks_are_freed_by_their_last_holder() {
        let mut p = pool(6);
        let a = p.allocate(2).unwrap(); // 1 2
        p.touch(&a); // a second request shares both
        assert_eq!((p.ref_count(1), p.ref_count(2)), (2, 2));
        p.free(&a);
        assert_eq!(p.num_free_blocks(), 3, "still held by the second request");
        p.free(&a);
        assert_eq!(p.free_queue_order(), vec![1, 2, 3, 4, 5]);
        p.check_invariants().unwrap();
    }

    #[test]
    fn touch_revives_a_cached_free_block_from_the_middle() {
        let mut p = pool(6);
        let a = p.allocate(3).unwrap(); // 1 2 3
        let h2 = cache(&mut p, 2, 20);
        p.free(&a); // uncached 3, then 1, to the front; cached 2 to the back
        assert_eq!(p.free_queue_order(), vec![1, 3, 4, 5, 2]);
        assert_eq!(
            p.lookup(h2, None, &[20; 4], None),
            Some(2),
            "a free block stays cached"
        );
        p.touch(&[2]);
        assert_eq!(p.free_queue_order(), vec![1, 3, 4, 5]);
        assert_eq!((p.ref_count(2), p.num_used_blocks()), (1, 1));
        p.check_invariants().unwrap();
        // Head and middle removal too.
        p.touch(&[4]);
        p.touch(&[1]);
        assert_eq!(p.free_queue_order(), vec![3, 5]);
        p.touch(&[5, 3]);
        assert_eq!(p.free_queue_order(), Vec::<BlockId>::new());
        p.check_invariants().unwrap();
        p.free(&[1, 2, 3, 4, 5]);
        assert_eq!(p.free_queue_order(), vec![1, 3, 4, 5, 2]);
        p.check_invariants().unwrap();
    }

    #[test]
    fn cached_entry_is_evicted_lazily_on_reallocation() {
        let mut p = pool(4);
        let a = p.allocate(3).unwrap(); // 1 2 3
        let hashes: Vec<BlockHash> = a.iter().map(|&id| cache(&mut p, id, 10 + id)).collect();
        p.free(&a); // queue: 3 2 1
        assert_eq!(p.num_cached_blocks(), 3);
        assert_eq!(p.allocate(1), Some(vec![3]), "the tail block goes first");
        assert_eq!(p.num_cached_blocks(), 2);
        assert_eq!(p.cached_hash(3), None);
        assert_eq!(p.lookup(hashes[2], None, &[13; 4], None), None);
        assert_eq!(p.lookup(hashes[0], None, &[11; 4], None), Some(1));
        p.check_invariants().unwrap();
    }

    #[test]
    fn cache_block_keeps_the_first_copy() {
        let mut p = pool(4);
        p.allocate(3).unwrap();
        let h = cache(&mut p, 1, 5);
        assert_eq!(
            p.cache_block(2, h, None, &[5; 4], None),
            CacheInsert::Duplicate
        );
        assert_eq!(
            p.cache_block(1, h, None, &[5; 4], None),
            CacheInsert::Duplicate
        );
        assert_eq!(
            p.cache_block(3, h, None, &[6; 4], None),
            CacheInsert::Collision
        );
        assert_eq!((p.cached_hash(2), p.cached_hash(3)), (None, None));
        assert_eq!(
            p.cache_block(1, BlockHash(1), None, &[5; 4], None),
            CacheInsert::Collision
        );
        assert_eq!(p.num_cached_blocks(), 1);
        p.check_invariants().unwrap();
    }

    #[test]
    fn reset_forgets_in_use_and_free_blocks_alike() {
        let mut p = pool(4);
        let a = p.allocate(2).unwrap();
        cache(&mut p, a[0], 1);
        cache(&mut p, a[1], 2);
        p.free(&a[1..]);
        assert_eq!(p.free_queue_order(), vec![3, a[1]]);
        assert_eq!(p.reset_prefix_cache(), 2);
        assert_eq!(
            (
                p.num_cached_blocks(),
                p.cached_hash(a[0]),
                p.cached_hash(a[1])
            ),
            (0, None, None)
        );
        // The block that was cached is uncached now: reused first.
        assert_eq!(p.free_queue_order(), vec![a[1], 3]);
        assert_eq!(p.reset_prefix_cache(), 0);
        p.check_invariants().unwrap();
    }

    #[test]
    fn with_evict_before_touching_cached_blocks_go_before_untouched_ones() {
        let mut p = pool(8); // blocks 1..=7
        p.set_evict_before_touching(true);
        let a = p.allocate(3).unwrap(); // 1, 2, 3
        let h = cache(&mut p, a[0], 1);
        assert_eq!(p.lookup(h, None, &[1; 4], None), Some(1));
        p.free(&a);
        // 2 and 3 (uncached) at the front, then 1 (cached), then the never-touched 4..7.
        assert_eq!(p.free_queue_order(), vec![2, 3, 1, 4, 5, 6, 7]);
        p.check_invariants().unwrap();
        // Three new blocks: the two written ones, then the cached prefix is evicted before any
        // new memory is touched.
        assert_eq!(p.allocate(3).unwrap(), vec![2, 3, 1]);
        assert_eq!(p.lookup(h, None, &[1; 4], None), None);
        assert_eq!(p.allocate(1).unwrap(), vec![4]);
        p.check_invariants().unwrap();

        // The default keeps the cached block until no never-touched block is left.
        let mut p = pool(8);
        let a = p.allocate(3).unwrap();
        cache(&mut p, a[0], 1);
        p.free(&a);
        assert_eq!(p.free_queue_order(), vec![2, 3, 4, 5, 6, 7, 1]);
        assert_eq!(p.allocate(6).unwrap(), vec![2, 3, 4, 5, 6, 7]);
        p.check_invariants().unwrap();
    }

    #[test]
    fn check_invariants_catches_corruption() {
        let mut p = pool(4);
        p.ref_cnt[2] = 1; // in use according to its count, yet still free
        assert!(p.check_invariants().unwrap_err().contains("block 2"));
        let mut p = pool(4);
        p.cached_hash[1] = Some(BlockHash(9)); // a hash with no cache entry
        assert!(p.check_invariants().is_err());
        let mut p = pool(4);
        p.free_queue.next[2] = 1; // a cycle: the walk must still end
        assert!(p.check_invariants().is_err());
    }
}
