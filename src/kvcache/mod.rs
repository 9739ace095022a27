//! The paged KV cache's bookkeeping (DESIGN.md decision 7, vLLM v1's design): which blocks of the
//! per-layer K and V pools `[blocks, block_size, kv_heads, head_dim]` each request owns, which
//! full blocks are shared through the prefix cache, and which free blocks get reused next. Pure
//! CPU logic: no tensors here; the engine turns block tables into the kernels' inputs.
//!
//! One request, `block_size` 4, in the step where the scheduler gives it 7 new tokens:
//!
//! ```text
//!   token  0 1 2 3 | 4 5 6 7 | 8 9 10 11 | 12 13 14 15 | 16 17 18 19 | 20 21 ...
//!          [ hit  ] [  hit  ] [ computed ] [ computed:  ] [  new     ] [ not yet
//!          [prefix] [prefix ] [ earlier  ] [ 12 13 | new] [  16..19  ] [ allocated
//!          |<------------- num_computed_tokens = 14 ---->|<- num_new_tokens = 7 -> (21 .. 23)
//!
//!   block table    [ 7 ][ 3 ][ 12 ][ 5 ][ 9 ][ 2 ]   ([`KvCacheManager::block_table`])
//!                    |    |    |     |    |    '-- allocated this step, partly filled: no hash
//!                    |    |    |     |    '------- allocated this step, full once the step runs:
//!                    |    |    |     |             hashed and cached at allocation
//!                    |    |    |     '------------ allocated earlier, full once the step runs:
//!                    |    |    |                   cached now
//!                    '----'----'------------------ full and cached; 7 and 3 came from another
//!                                                  request's prompt (ref_cnt 2), 12 is ours
//! ```
//!
//! Token `t` lives in block `block_table[t / block_size]`, slot `t % block_size`. A step:
//!
//! 1. A request new to the cache asks [`KvCacheManager::get_computed_blocks`] for the longest
//!    cached prefix of full blocks (never the whole prompt: one token is always left to compute,
//!    whose logits give the first sample), and starts with `num_computed_tokens` = the hit tokens.
//! 2. [`KvCacheManager::allocate_slots`] makes the request own blocks for `num_computed_tokens +
//!    num_new_tokens` tokens (taking the hits on first call), registers every block that is full
//!    once the step runs in the prefix cache, or answers `Ok(None)`, changing nothing, when the pool
//!    is short: the scheduler preempts a request ([`KvCacheManager::free`]) and retries.
//! 3. The step writes the new tokens' K and V into their slots, layer by layer, before any attention
//!    of that layer reads them, so a request scheduled in the same step may already hit blocks
//!    registered in step 2.
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

pub use block_pool::{BlockId, BlockPool, DEFAULT_BLOCK_SIZE, NULL_BLOCK};
pub use manager::{KvCacheManager, PrefixCacheStats, RequestId};
pub use prefix::{hash_block, hash_request_blocks, BlockHash, BlockHasher, PrefixCache};

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
