//! Exact on-policy attention (issue 25): every way the engine computes a row's attention gives
//! the bits the trainer's flash attention gives it, because every path follows the canonical
//! reduction order of kernels/attn_tile.cuh (64-key tiles and 512-key segments aligned to
//! absolute positions, one tile routine, segments folded left to right):
//!
//! - decode rows (one warp per segment, folded by the merge kernel), alone or batched with other
//!   rows in any order, and beside a prefill chunk in the same step;
//! - chunked prefill over a cached prefix, folded in the kernel (a chunk big enough to fill the
//!   GPU) or split per segment (a short chunk over a long history);
//! - a CUDA graph's fixed decode plan (segments up to the table's capacity, padding rows);
//!
//! at head dims 32 and 128, GQA 2 and 4, contexts across segment boundaries. Compared as f32 bits
//! of the bf16 outputs, no tolerance. The mutation check: the same decode rows with a forced
//! 128-key segment (one path's order changed) must differ somewhere, so the comparison can fail.
//!
//! The GPU tests need a CUDA GPU: run them through scripts/gpu-pack.sh; without one they fail,
//! never pass (or a SWERVE_EMU=1 build runs them on the emulated device).

mod common;

use common::gpu::{gpu, poisoned, random};
use swerve::backend::cuda::graphs::decode_graph_attention_inputs;
use swerve::backend::cuda::paged_attn::{DevicePagedLayout, WorkPlan, SEGMENT_KEYS};
use swerve::backend::cuda::{CudaBackend, CudaTensor, DeviceDType};
use swerve::backend::{Backend, PagedLayout};

const BLOCK: usize = 16;

/// Packed training sequences with their K/V also written into a paged cache (blocks in a
/// scrambled order), and the trainer's attention output over them.
struct Fixture {
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    lens: Vec<usize>,
    q: CudaTensor,
    k_cache: CudaTensor,
    v_cache: CudaTensor,
    /// Per sequence, its cache blocks in order.
    tables: Vec<Vec<u32>>,
    num_blocks: usize,
    /// The trainer's output `[T, heads, head_dim]` as f32 bits.
    trained: Vec<u32>,
    scale: f32,
}

fn bits(gpu: &CudaBackend, t: &CudaTensor) -> Vec<u32> {
    gpu.to_host(t)
        .unwrap()
        .iter()
        .map(|x| x.to_bits())
        .collect()
}

impl Fixture {
    fn new(
        gpu: &CudaBackend,
        (heads, kv_heads, head_dim): (usize, usize, usize),
        lens: &[usize],
        seed: u64,
    ) -> Self {
        let total: usize = lens.iter().sum();
        let (q, _) = random(gpu, &[total, heads, head_dim], seed, 2.0);
        let (k, _) = random(gpu, &[total, kv_heads, head_dim], seed + 1, 2.0);
        let (v, _) = random(gpu, &[total, kv_heads, head_dim], seed + 2, 1.0);
        let mut cu = vec![0u32];
        for &l in lens {
            cu.push(cu.last().unwrap() + l as u32);
        }
        let scale = 1.0 / (head_dim as f32).sqrt();
        let mut out = poisoned(gpu, &[total, heads, head_dim], DeviceDType::Bf16);
        gpu.attention(&q, &k, &v, &cu, scale, &mut out).unwrap();
        let trained = bits(gpu, &out);
        // Blocks 1.. in a scrambled order (block 0 is the null block).
        let counts: Vec<usize> = lens.iter().map(|l| l.div_ceil(BLOCK)).collect();
        let num_blocks = counts.iter().sum::<usize>() + 1;
        let mut ids: Vec<u32> = (1..num_blocks as u32).collect();
        let n = ids.len();
        for i in 0..n {
            ids.swap(i, (i * 7919 + seed as usize) % n);
        }
        let mut tables = Vec::new();
        let mut next = 0;
        for &c in &counts {
            tables.push(ids[next..next + c].to_vec());
            next += c;
        }
        let mut slots = Vec::with_capacity(total);
        for (s, &l) in lens.iter().enumerate() {
            for p in 0..l {
                slots.push(tables[s][p / BLOCK] * BLOCK as u32 + (p % BLOCK) as u32);
            }
        }
        let cache_shape = [num_blocks, BLOCK, kv_heads, head_dim];
        let mut k_cache = gpu.alloc(&cache_shape, DeviceDType::Bf16).unwrap();
        let mut v_cache = gpu.alloc(&cache_shape, DeviceDType::Bf16).unwrap();
        gpu.fill_bytes(&mut k_cache, 0).unwrap();
        gpu.fill_bytes(&mut v_cache, 0).unwrap();
        gpu.write_kv(&k, &v, &slots, &mut k_cache, &mut v_cache)
            .unwrap();
        Self {
            heads,
            kv_heads,
            head_dim,
            lens: lens.to_vec(),
            q,
            k_cache,
            v_cache,
            tables,
            num_blocks,
            trained,
            scale,
        }
    }

    /// Packed row of (sequence, position).
    fn row(&self, seq: usize, pos: usize) -> usize {
        self.lens[..seq].iter().sum::<usize>() + pos
    }

    /// A step of query chunks `(sequence, first position, rows)`: each chunk's context ends at
    /// its last row (the cache already holds every key).
    fn layout(&self, chunks: &[(usize, usize, usize)]) -> PagedLayout {
        let max_blocks = self.tables.iter().map(|t| t.len()).max().unwrap();
        let mut layout = PagedLayout {
            block_size: BLOCK,
            cu_query: vec![0],
            context_lens: Vec::new(),
            block_tables: Vec::new(),
            max_blocks_per_seq: max_blocks,
            slot_mapping: Vec::new(),
        };
        for &(s, first, rows) in chunks {
            layout
                .cu_query
                .push(layout.cu_query.last().unwrap() + rows as u32);
            layout.context_lens.push((first + rows) as u32);
            let mut table = self.tables[s].clone();
            table.resize(max_blocks, 0);
            layout.block_tables.extend(table);
            for p in first..first + rows {
                layout
                    .slot_mapping
                    .push(self.tables[s][p / BLOCK] * BLOCK as u32 + (p % BLOCK) as u32);
            }
        }
        layout
    }

    /// The query rows of a step, gathered from the training batch.
    fn step_rows(&self, chunks: &[(usize, usize, usize)]) -> Vec<u32> {
        let mut rows = Vec::new();
        for &(s, first, n) in chunks {
            rows.extend((first..first + n).map(|p| self.row(s, p) as u32));
        }
        rows
    }

    /// The trainer's bits of those rows.
    fn expected(&self, rows: &[u32]) -> Vec<u32> {
        let width = self.heads * self.head_dim;
        rows.iter()
            .flat_map(|&r| self.trained[r as usize * width..][..width].iter().copied())
            .collect()
    }

    /// Runs one engine step through the backend (or at the device level with a forced segment).
    fn engine_step(
        &self,
        gpu: &CudaBackend,
        chunks: &[(usize, usize, usize)],
        segment: Option<usize>,
    ) -> Vec<u32> {
        let layout = self.layout(chunks);
        let rows = self.step_rows(chunks);
        let q = gpu.gather_rows(&self.q, &rows).unwrap();
        let mut out = poisoned(gpu, q.shape(), DeviceDType::Bf16);
        match segment {
            None => gpu
                .paged_attention(
                    &q,
                    &self.k_cache,
                    &self.v_cache,
                    &layout,
                    self.scale,
                    &mut out,
                )
                .unwrap(),
            Some(keys) => {
                let mut device_layout = DevicePagedLayout::upload(gpu, &layout).unwrap();
                device_layout.segment_keys = Some(keys);
                gpu.device
                    .paged_attention(
                        &q,
                        &self.k_cache,
                        &self.v_cache,
                        &device_layout,
                        self.scale,
                        &mut out,
                        &gpu.pool,
                    )
                    .unwrap();
            }
        }
        bits(gpu, &out)
    }

    /// Asserts a step's rows equal the trainer's bit for bit.
    fn check(&self, gpu: &CudaBackend, what: &str, chunks: &[(usize, usize, usize)]) {
        let got = self.engine_step(gpu, chunks, None);
        let expect = self.expected(&self.step_rows(chunks));
        assert_eq!(got.len(), expect.len());
        let width = self.heads * self.head_dim;
        for (i, (g, e)) in got.chunks(width).zip(expect.chunks(width)).enumerate() {
            let differ = g.iter().zip(e).filter(|(a, b)| a != b).count();
            assert_eq!(
                differ, 0,
                "{what} (heads {}/{} hd {}): step row {i} differs from the trainer's in {differ} of {width} values",
                self.heads, self.kv_heads, self.head_dim
            );
        }
    }
}

/// Decode positions across tile and segment boundaries (segment 512) within `len`.
fn decode_positions(len: usize) -> Vec<usize> {
    [0, 1, 63, 64, 65, 511, 512, 513, 1023, 1024, 1025]
        .into_iter()
        .filter(|&p| p < len)
        .chain([len - 1])
        .collect()
}

#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn decode_rows_equal_the_trainers_bit_for_bit_in_any_batch() {
    let gpu = gpu();
    for (i, &shape) in [(4, 2, 32), (8, 2, 128)].iter().enumerate() {
        let f = Fixture::new(&gpu, shape, &[1100, 70, 530], 100 + 10 * i as u64);
        let mut decodes: Vec<(usize, usize, usize)> = Vec::new();
        for s in 0..f.lens.len() {
            decodes.extend(decode_positions(f.lens[s]).into_iter().map(|p| (s, p, 1)));
        }
        // Every decode row alone, all of them in one step, and in reverse order.
        for &d in &decodes {
            f.check(&gpu, "decode alone", &[d]);
        }
        f.check(&gpu, "decode batch", &decodes);
        let reversed: Vec<_> = decodes.iter().rev().copied().collect();
        f.check(&gpu, "decode batch reversed", &reversed);
        // Beside a prefill chunk in the same step, and a 2-row speculative chunk (decode kernel).
        let mut mixed = vec![(0, 400, 150)];
        mixed.extend(decodes.iter().step_by(2));
        mixed.push((2, 520, 2));
        f.check(&gpu, "decode beside a chunk", &mixed);
        // The mutation: the same rows with another segment size differ somewhere.
        let long: Vec<_> = decodes.iter().filter(|d| d.1 >= 600).copied().collect();
        let forced = f.engine_step(&gpu, &long, Some(128));
        assert_ne!(
            forced,
            f.expected(&f.step_rows(&long)),
            "a 128-key segment must change some bits: the comparison cannot fail otherwise"
        );
    }
}

#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn prefill_chunks_equal_the_trainers_bit_for_bit_folded_or_split() {
    let gpu = gpu();
    let num_sms = gpu.device.num_sms as usize;
    for (i, &shape) in [(4, 2, 32), (8, 2, 128)].iter().enumerate() {
        let (heads, kv_heads, _) = shape;
        let group = heads / kv_heads;
        // A chunk big enough to fill the GPU folds its segments in the kernel.
        let big_rows = (num_sms * 64).div_ceil(group * kv_heads) + 64;
        // (at least 1040 rows: the last step's chunk reads rows 1000 .. 1016 of sequence 0, on a
        // GPU of any SM count)
        let len0 = (big_rows + 40).max(1040);
        let f = Fixture::new(&gpu, shape, &[len0, 900], 200 + 10 * i as u64);
        let split = |chunks: &[(usize, usize, usize)]| {
            let layout = f.layout(chunks);
            let plan = WorkPlan::build(
                &layout.cu_query,
                &layout.context_lens,
                group,
                kv_heads,
                num_sms,
                None,
            );
            plan.unwrap().prefill.iter().any(|item| item[2] >= 0)
        };
        let whole = [(0, 40, big_rows)];
        assert!(!split(&whole), "the big chunk is folded in the kernel");
        f.check(&gpu, "prefill folded in the kernel", &whole);
        // The whole prompt at once, then chunked prefill over the cached prefix in short chunks
        // (split per segment) across segment boundaries.
        f.check(&gpu, "prefill of a whole prompt", &[(1, 0, 900)]);
        for chunk in [(1, 0, 300), (1, 300, 250), (1, 550, 350), (0, 500, 30)] {
            assert!(split(&[chunk]), "{chunk:?} is split per segment");
            f.check(&gpu, "chunked prefill, split per segment", &[chunk]);
        }
        f.check(
            &gpu,
            "two chunks in one step",
            &[(1, 510, 5), (0, 1000, 17)],
        );
    }
}

#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn a_decode_graphs_fixed_plan_gives_the_trainers_bits() {
    let gpu = gpu();
    let (heads, kv_heads, hd) = (8, 2, 128);
    let f = Fixture::new(&gpu, (heads, kv_heads, hd), &[1300, 64, 600], 300);
    let decodes = [
        (0, 1299, 1),
        (1, 63, 1),
        (2, 511, 1),
        (2, 512, 1),
        (0, 700, 1),
    ];
    let layout = f.layout(&decodes);
    let (batch, table_blocks) = (8, f.tables.iter().map(|t| t.len()).max().unwrap() + 3);
    let (device_layout, padded) = decode_graph_attention_inputs(
        &gpu,
        &layout,
        batch,
        table_blocks,
        heads / kv_heads,
        kv_heads,
        f.num_blocks,
    )
    .unwrap();
    assert_eq!(device_layout.segment_keys, Some(SEGMENT_KEYS));
    let mut rows = f.step_rows(&decodes);
    rows.resize(batch, 0); // padding rows: any query, context 1 over the null block
    let q = gpu.gather_rows(&f.q, &rows).unwrap();
    let mut out = poisoned(&gpu, &[batch, heads, hd], DeviceDType::Bf16);
    gpu.device
        .paged_attention(
            &q,
            &f.k_cache,
            &f.v_cache,
            &device_layout,
            f.scale,
            &mut out,
            &gpu.pool,
        )
        .unwrap();
    assert_eq!(padded.num_seqs(), batch);
    let got = bits(&gpu, &out);
    let width = heads * hd;
    let expect = f.expected(&rows[..decodes.len()]);
    for (i, (g, e)) in got.chunks(width).zip(expect.chunks(width)).enumerate() {
        let differ = g.iter().zip(e).filter(|(a, b)| a != b).count();
        assert_eq!(
            differ, 0,
            "graph plan row {i} ({:?}) differs from the trainer's in {differ} of {width} values",
            decodes[i]
        );
    }
}
