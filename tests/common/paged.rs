//! Paged-attention test helpers (tests/gpu_paged.rs, tests/gpu_paged_plan.rs): shuffled,
//! non-contiguous block tables, attention over a paged cache in f64 and as transformers' eager
//! bf16 computation, and the shared-memory limits of the GPUs the kernel variants are chosen for.

use super::gpu::{attention_row_f64, round_bf16};
use swerve::backend::PagedLayout;
use swerve::rng::{Rng, XorShift64};

/// A xorshift permutation of `v`.
pub fn shuffle<T>(v: &mut [T], seed: u64) {
    XorShift64::new(seed).shuffle(v);
}

/// (query heads, kv heads, head dim).
pub type Heads = (usize, usize, usize);

/// Sequence s has `contexts[s]` positions, the last `rows[s]` of them this step's query rows.
/// Blocks come from a shuffled pool with spares (block 0 stays the null block that pads the
/// tables), so every table is non-contiguous and out of order. Returns the layout and the number
/// of blocks in the cache.
pub fn shuffled_layout(
    block_size: usize,
    rows: &[usize],
    contexts: &[usize],
    seed: u64,
) -> (PagedLayout, usize) {
    let needed: Vec<usize> = contexts.iter().map(|c| c.div_ceil(block_size)).collect();
    let total: usize = needed.iter().sum();
    let num_blocks = total + total / 3 + 2;
    let mut ids: Vec<u32> = (1..num_blocks as u32).collect();
    shuffle(&mut ids, seed);
    let max_blocks_per_seq = needed.iter().copied().max().unwrap_or(0) + 1;
    let mut layout = PagedLayout {
        block_size,
        cu_query: vec![0],
        context_lens: contexts.iter().map(|&c| c as u32).collect(),
        block_tables: vec![0; contexts.len() * max_blocks_per_seq],
        max_blocks_per_seq,
        slot_mapping: Vec::new(),
    };
    let mut next = ids.iter();
    for (s, (&n, &context)) in rows.iter().zip(contexts).enumerate() {
        for b in 0..needed[s] {
            layout.block_tables[s * max_blocks_per_seq + b] = *next.next().unwrap();
        }
        layout
            .cu_query
            .push(layout.cu_query.last().unwrap() + n as u32);
        for p in context - n..context {
            let block = layout.block_tables[s * max_blocks_per_seq + p / block_size];
            layout
                .slot_mapping
                .push(block * block_size as u32 + (p % block_size) as u32);
        }
    }
    layout.check(num_blocks).unwrap();
    (layout, num_blocks)
}

/// Transformers' eager bf16 attention of the layout's query rows over a paged cache.
pub fn naive_paged_attention(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    layout: &PagedLayout,
    heads: usize,
    kv_heads: usize,
    hd: usize,
) -> Vec<f32> {
    let scale = 1.0 / (hd as f32).sqrt();
    let bs = layout.block_size;
    let mut out = vec![0.0f32; q.len()];
    for r in 0..layout.num_query_rows() {
        let s = layout.sequence_of_row(r);
        let position = layout.position_of_row(s, r);
        let table = layout.block_table(s);
        let slot = |j: usize| table[j / bs] as usize * bs + j % bs;
        for h in 0..heads {
            let g = h / (heads / kv_heads);
            let qr = &q[(r * heads + h) * hd..][..hd];
            let scores: Vec<f32> = (0..=position)
                .map(|j| {
                    let kr = &k_cache[(slot(j) * kv_heads + g) * hd..][..hd];
                    round_bf16(qr.iter().zip(kr).map(|(a, b)| a * b).sum::<f32>() * scale)
                })
                .collect();
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let sum: f32 = scores.iter().map(|s| (s - max).exp()).sum();
            let o = &mut out[(r * heads + h) * hd..][..hd];
            for (j, s) in scores.iter().enumerate() {
                let p = round_bf16((s - max).exp() / sum);
                let vr = &v_cache[(slot(j) * kv_heads + g) * hd..][..hd];
                for (x, y) in o.iter_mut().zip(vr) {
                    *x += p * y;
                }
            }
            o.iter_mut().for_each(|x| *x = round_bf16(*x));
        }
    }
    out
}

/// The same attention in f64: the reference every row is measured against.
pub fn paged_attention_f64(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    layout: &PagedLayout,
    heads: usize,
    kv_heads: usize,
    hd: usize,
) -> Vec<f32> {
    let bs = layout.block_size;
    let mut out = vec![0.0f32; q.len()];
    for r in 0..layout.num_query_rows() {
        let s = layout.sequence_of_row(r);
        let position = layout.position_of_row(s, r);
        let table = layout.block_table(s);
        for h in 0..heads {
            let g = h / (heads / kv_heads);
            let offsets = (0..=position)
                .map(|j| ((table[j / bs] as usize * bs + j % bs) * kv_heads + g) * hd);
            let o = attention_row_f64(&q[(r * heads + h) * hd..][..hd], k_cache, v_cache, offsets);
            out[(r * heads + h) * hd..][..hd].copy_from_slice(&o);
        }
    }
    out
}

/// Opt-in shared memory per block of sm_90, sm_80 and sm_86 / sm_89.
pub const SM90_SMEM: usize = 227 * 1024;
pub const SM80_SMEM: usize = 163 * 1024;
pub const SM89_SMEM: usize = 99 * 1024;
