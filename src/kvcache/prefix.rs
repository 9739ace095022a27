//! Prefix caching: chained block hashes, and the map from a hash to the block that holds its KV.
//!
//! A full block's hash covers its parent block's hash (or a fixed root value for the first block),
//! its `block_size` token ids, and an optional extra key (reserved for inputs that change the KV
//! without changing the token ids: LoRA adapter, multimodal content). Chaining makes a block's
//! hash stand for the whole prefix up to its end, so a lookup walks a prompt block by block and
//! stops at the first miss:
//!
//! ```text
//!   tokens  [ t0 .. t15 ][ t16 .. t31 ][ t32 .. t47 ][ t48 t49 ]   (block_size 16)
//!   hashes    h0 = H(root, t0..t15, x)                               the last block is not full:
//!             h1 = H(h0, t16..t31, x)                                it has no hash and is never
//!             h2 = H(h1, t32..t47, x)                                cached
//! ```
//!
//! A 64-bit hash can collide, so [`PrefixCache`] stores with every block the parent hash, the extra
//! key and the token ids it was registered with, and a lookup only hits when all of them are equal.
//! A collision therefore costs a cache miss, never wrong KV. (What remains is two different
//! prefixes whose *parent* hashes collide and whose next blocks are equal: about `n^2 / 2^64` for
//! `n` distinct blocks seen; and once a registration meets a collision the manager stops caching
//! that request's later blocks, so a collision it saw cannot chain on.)
//!
//! The hash is ours, fixed-seed and word-at-a-time ([`hash_block`]), so it is the same across runs,
//! builds and machines (std's `DefaultHasher` promises none of that). It is not a cryptographic
//! hash: a server shared with adversarial clients would want SHA-256 here.

use super::BlockId;
use std::collections::HashMap;

/// The chained hash of one full block (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub u64);

/// Stands in for the parent hash of a sequence's first block.
const ROOT_HASH: u64 = 0x5357_4552_5645_4b56; // "SWERVEKV"

// The block hash's mixer: splitmix64's finaliser, a bijection on u64 with full avalanche.
use crate::rng::mix64;

/// The hash of one block: `parent` is `None` for a sequence's first block.
///
/// Absorbs 64-bit words (the parent hash and the extra key, each with a presence tag, the token
/// count, then the token ids two per word) through `state = mix64(state ^ word) * odd constant`,
/// each step a bijection of the state, so inputs of equal length that differ in one word never
/// collide.
pub fn hash_block(parent: Option<BlockHash>, tokens: &[u32], extra: Option<u64>) -> BlockHash {
    const K: u64 = crate::rng::GOLDEN_GAMMA;
    let mut state = 0x243f_6a88_85a3_08d3u64; // pi's fraction: a nothing-up-my-sleeve seed
    let mut absorb = |word: u64| state = mix64(state ^ word).wrapping_mul(K);
    absorb(parent.is_some() as u64);
    absorb(parent.map_or(ROOT_HASH, |p| p.0));
    absorb(extra.is_some() as u64);
    absorb(extra.unwrap_or(0));
    absorb(tokens.len() as u64);
    let mut pairs = tokens.chunks_exact(2);
    for pair in &mut pairs {
        absorb(u64::from(pair[0]) | (u64::from(pair[1]) << 32));
    }
    if let [last] = pairs.remainder() {
        absorb(u64::from(*last));
    }
    BlockHash(mix64(state))
}

/// The hash chain of every full block of `tokens` (a trailing partial block has none).
pub fn hash_request_blocks(
    tokens: &[u32],
    block_size: usize,
    extra: Option<u64>,
) -> Vec<BlockHash> {
    let mut hasher = BlockHasher::new(block_size, extra);
    hasher.update(tokens);
    hasher.hashes
}

/// A request's hash chain, extended as its token list grows (prompt, then generated tokens, then
/// the next turn), so each full block is hashed once over the request's life.
#[derive(Clone, Debug)]
pub struct BlockHasher {
    block_size: usize,
    extra: Option<u64>,
    hashes: Vec<BlockHash>,
}

impl BlockHasher {
    /// `block_size` must be at least 1 (a zero is treated as 1).
    pub fn new(block_size: usize, extra: Option<u64>) -> Self {
        Self {
            block_size: block_size.max(1),
            extra,
            hashes: Vec::new(),
        }
    }

    /// Hashes the full blocks of `tokens` not hashed yet and returns the whole chain. `tokens` is
    /// the request's whole token list: it must extend the list of the previous calls (the blocks
    /// already hashed are not looked at again); a shorter list hashes nothing.
    pub fn update(&mut self, tokens: &[u32]) -> &[BlockHash] {
        let num_full = tokens.len() / self.block_size;
        for i in self.hashes.len()..num_full {
            let block = &tokens[i * self.block_size..(i + 1) * self.block_size];
            let parent = i.checked_sub(1).map(|p| self.hashes[p]);
            self.hashes.push(hash_block(parent, block, self.extra));
        }
        &self.hashes
    }

    pub fn hashes(&self) -> &[BlockHash] {
        &self.hashes
    }

    /// How many tokens the chain covers (`hashes().len() * block_size`).
    pub fn num_hashed_tokens(&self) -> usize {
        self.hashes.len() * self.block_size
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn extra(&self) -> Option<u64> {
        self.extra
    }
}

/// What a cached block was registered with; a lookup must match all of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedBlock {
    pub block: BlockId,
    pub parent: Option<BlockHash>,
    pub extra: Option<u64>,
    pub tokens: Box<[u32]>,
}

impl CachedBlock {
    pub fn matches(&self, parent: Option<BlockHash>, tokens: &[u32], extra: Option<u64>) -> bool {
        self.parent == parent && self.extra == extra && *self.tokens == *tokens
    }
}

/// What [`PrefixCache::insert`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheInsert {
    /// The block is now the cached copy of this hash.
    Inserted,
    /// A block with the same hash and the same content is cached already (maybe this one): the
    /// existing entry stays.
    Duplicate,
    /// A block with the same hash but different content is cached: a 64-bit collision. The
    /// existing entry stays and the new block is not cached.
    Collision,
}

/// Hash -> the one block holding that full block's KV. The block pool owns it and keeps each
/// block's own `cached_hash` in step with it.
#[derive(Clone, Debug, Default)]
pub struct PrefixCache {
    map: HashMap<BlockHash, CachedBlock>,
}

impl PrefixCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// The block cached for `hash`, if its parent hash, tokens and extra key are these.
    pub fn lookup(
        &self,
        hash: BlockHash,
        parent: Option<BlockHash>,
        tokens: &[u32],
        extra: Option<u64>,
    ) -> Option<BlockId> {
        self.map
            .get(&hash)
            .filter(|c| c.matches(parent, tokens, extra))
            .map(|c| c.block)
    }

    /// The entry for `hash` whatever its content.
    pub fn get(&self, hash: BlockHash) -> Option<&CachedBlock> {
        self.map.get(&hash)
    }

    /// Registers `entry` under `hash` unless the hash is taken (see [`CacheInsert`]).
    pub fn insert(&mut self, hash: BlockHash, entry: CachedBlock) -> CacheInsert {
        use std::collections::hash_map::Entry;
        match self.map.entry(hash) {
            Entry::Vacant(slot) => {
                slot.insert(entry);
                CacheInsert::Inserted
            }
            Entry::Occupied(old) => {
                if old.get().matches(entry.parent, &entry.tokens, entry.extra) {
                    CacheInsert::Duplicate
                } else {
                    CacheInsert::Collision
                }
            }
        }
    }

    /// Drops the entry for `hash` if it is `block`'s; says whether it did.
    pub fn remove(&mut self, hash: BlockHash, block: BlockId) -> bool {
        if self.map.get(&hash).is_some_and(|c| c.block == block) {
            self.map.remove(&hash);
            true
        } else {
            false
        }
    }

    /// Forgets every entry; returns how many there were.
    pub fn clear(&mut self) -> usize {
        let n = self.map.len();
        self.map.clear();
        n
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (BlockHash, &CachedBlock)> {
        self.map.iter().map(|(h, c)| (*h, c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(block: BlockId, parent: Option<BlockHash>, tokens: &[u32]) -> CachedBlock {
        CachedBlock {
            block,
            parent,
            extra: None,
            tokens: tokens.into(),
        }
    }

    #[test]
    fn hash_is_deterministic_across_runs() {
        // Pinned values: a change here invalidates nothing on disk, but it means the function
        // changed, which should be on purpose.
        let h0 = hash_block(None, &[1, 2, 3, 4], None);
        let h1 = hash_block(Some(h0), &[5, 6, 7, 8], Some(9));
        assert_eq!(h0, hash_block(None, &[1, 2, 3, 4], None));
        let pinned = (0x55eb_271a_3226_355a, 0x097e_c521_5e53_8462);
        assert_eq!((h0.0, h1.0), pinned, "got {:#x} {:#x}", h0.0, h1.0);
    }

    #[test]
    fn hash_depends_on_every_input() {
        let base = hash_block(None, &[1, 2, 3, 4], None);
        let parent = hash_block(None, &[9, 9, 9, 9], None);
        let variants = [
            hash_block(Some(parent), &[1, 2, 3, 4], None),
            hash_block(None, &[1, 2, 3, 5], None),
            hash_block(None, &[2, 1, 3, 4], None),
            hash_block(None, &[1, 2, 3], None),
            hash_block(None, &[1, 2, 3, 4, 0], None),
            hash_block(None, &[1, 2, 3, 4], Some(0)),
            hash_block(None, &[1, 2, 3, 4], Some(1)),
            hash_block(Some(BlockHash(ROOT_HASH)), &[1, 2, 3, 4], None),
        ];
        for (i, v) in variants.iter().enumerate() {
            assert_ne!(*v, base, "variant {i}");
            for (j, w) in variants.iter().enumerate().skip(i + 1) {
                assert_ne!(v, w, "variants {i} and {j}");
            }
        }
    }

    #[test]
    fn hashes_spread_over_many_blocks() {
        // 200k single-token changes: no collisions, and the top byte is roughly uniform.
        let mut seen = std::collections::HashSet::new();
        let mut top = [0u32; 256];
        for t in 0..200_000u32 {
            let h = hash_block(None, &[t, 7, 7, 7], None);
            assert!(seen.insert(h), "collision at {t}");
            top[(h.0 >> 56) as usize] += 1;
        }
        let (lo, hi) = (top.iter().min().unwrap(), top.iter().max().unwrap());
        assert!(
            *lo > 600 && *hi < 1000,
            "top byte counts {lo}..{hi}, expected about 781"
        );
    }

    #[test]
    fn chain_covers_full_blocks_only_and_extends_incrementally() {
        let tokens: Vec<u32> = (0..50).collect();
        let chain = hash_request_blocks(&tokens, 16, None);
        assert_eq!(chain.len(), 3);
        assert_eq!(chain[0], hash_block(None, &tokens[0..16], None));
        assert_eq!(chain[1], hash_block(Some(chain[0]), &tokens[16..32], None));
        assert_eq!(chain[2], hash_block(Some(chain[1]), &tokens[32..48], None));

        let mut hasher = BlockHasher::new(16, None);
        assert!(hasher.update(&tokens[..15]).is_empty());
        assert_eq!(hasher.update(&tokens[..20]), &chain[..1]);
        assert_eq!(
            hasher.update(&tokens[..10]),
            &chain[..1],
            "a shorter list hashes nothing"
        );
        assert_eq!(hasher.update(&tokens), &chain[..]);
        assert_eq!(hasher.num_hashed_tokens(), 48);

        // The extra key reaches every block of the chain.
        let with_extra = hash_request_blocks(&tokens, 16, Some(3));
        assert!(with_extra.iter().zip(&chain).all(|(a, b)| a != b));
        assert!(
            hash_request_blocks(&tokens, 0, None).len() == 50,
            "block size 0 acts as 1"
        );
    }

    #[test]
    fn lookup_needs_parent_tokens_and_extra_to_match() {
        let mut cache = PrefixCache::new();
        let h = hash_block(None, &[1, 2], None);
        assert_eq!(
            cache.insert(h, entry(5, None, &[1, 2])),
            CacheInsert::Inserted
        );
        assert_eq!(cache.lookup(h, None, &[1, 2], None), Some(5));
        // Same hash, other content: what a collision looks like. Never a hit.
        assert_eq!(cache.lookup(h, None, &[1, 3], None), None);
        assert_eq!(cache.lookup(h, Some(h), &[1, 2], None), None);
        assert_eq!(cache.lookup(h, None, &[1, 2], Some(0)), None);
        assert_eq!(cache.lookup(BlockHash(h.0 ^ 1), None, &[1, 2], None), None);
    }

    #[test]
    fn insert_keeps_the_first_entry() {
        let mut cache = PrefixCache::new();
        let h = BlockHash(42);
        assert_eq!(
            cache.insert(h, entry(5, None, &[1, 2])),
            CacheInsert::Inserted
        );
        assert_eq!(
            cache.insert(h, entry(6, None, &[1, 2])),
            CacheInsert::Duplicate
        );
        assert_eq!(
            cache.insert(h, entry(7, None, &[8, 9])),
            CacheInsert::Collision
        );
        assert_eq!(cache.get(h).map(|c| c.block), Some(5));
        assert_eq!(cache.len(), 1);
        assert!(!cache.remove(h, 6), "only the owner's entry is removed");
        assert!(cache.remove(h, 5));
        assert!(cache.is_empty());
        cache.insert(h, entry(5, None, &[1, 2]));
        cache.insert(BlockHash(43), entry(6, Some(h), &[3, 4]));
        assert_eq!(cache.iter().count(), 2);
        assert_eq!(cache.clear(), 2);
        assert!(cache.is_empty());
    }
}
