//! Helpers the KV cache's unit tests share (manager and scenario tests).

use super::{BlockId, KvCacheManager, RequestId};

/// The token ids `range`, in order.
pub fn tokens(range: std::ops::Range<u32>) -> Vec<u32> {
    range.collect()
}

/// get_computed_blocks + allocate_slots for the whole list, as a request new to the cache; checks
/// the invariants after.
pub fn admit(m: &mut KvCacheManager, req: RequestId, toks: &[u32]) -> Option<Vec<BlockId>> {
    let (hits, n) = m.get_computed_blocks(toks);
    let out = m
        .allocate_slots(req, toks, n, toks.len() - n, &hits)
        .unwrap();
    m.check_invariants().unwrap();
    out
}

/// Decodes `n` tokens `first, first + 1, ...` for a running request, one allocation per token.
pub fn decode(m: &mut KvCacheManager, req: RequestId, toks: &mut Vec<u32>, n: usize, first: u32) {
    for t in first..first + n as u32 {
        toks.push(t);
        m.allocate_slots(req, toks, toks.len() - 1, 1, &[])
            .unwrap()
            .unwrap();
        m.check_invariants().unwrap();
    }
}
