//! The paged-attention kernels (kernels/paged_attn.cu) against the CPU reference backend: cache
//! writes bit for bit, attention over shuffled, non-contiguous block tables with decode rows of
//! very different context lengths, multi-row chunks over cached prefixes, GQA 1/2/4/7, head dims
//! 16/32/64/128, partition boundaries, and equality with the prefill flash kernel over a cache
//! filled by `write_kv`. Outputs are poisoned (NaN bytes) before each launch.
//!
//! Tolerance (DESIGN.md), row by row (`common::gpu::within_naive`): each query row and head
//! within twice that row's own error of transformers' eager bf16 attention (scores rounded to
//! bf16, softmax in f32, probabilities rounded to bf16, P V in f32, output rounded), plus half an
//! output ulp, both measured against attention in f64; the CPU reference backend must pass the
//! same bound. A tensor-wide bound let short rows set the bound of long ones: the swapped-table
//! tests show a long row's error that one passes and the row check fails.
//!
//! The GPU tests need a CUDA GPU: run them through scripts/gpu-pack.sh; without one they fail,
//! never pass. The work-plan tests at the end are host-only and run everywhere.

mod common;

use common::gpu::{
    attention_f64, attention_row_f64, check_within_naive, gpu, naive_attention, poisoned, random,
    round_bf16, within_naive, Rows,
};
use half::bf16;
use swerve::backend::cpu::{CpuBackend, CpuTensor};
use swerve::backend::cuda::backend::pod_vec;
use swerve::backend::cuda::graphs::decode_graph_attention_inputs;
use swerve::backend::cuda::paged_attn::{
    attention_variant, AttentionVariant, DevicePagedLayout, WorkPlan, DECODE_BLOCK_M,
    MIN_PARTITION_KEYS, PREFILL_BLOCK_M,
};
use swerve::backend::cuda::{CudaBackend, DeviceDType};
use swerve::backend::{Backend, PagedLayout};
use swerve::bench::kernels::{max_abs_diff, random_bf16};
use swerve::rng::{Rng, XorShift64};

/// Two kernels computing the same attention differ by at most twice the naive error.
fn check_kernels_agree(what: &str, a: &[f32], b: &[f32], naive_err: f32) {
    assert_eq!(a.len(), b.len(), "{what}: output size");
    let diff = max_abs_diff(a, b);
    println!("{what}: difference {diff:.3e}, naive error {naive_err:.3e}");
    assert!(
        naive_err > 0.0 && diff <= 2.0 * naive_err,
        "{what}: kernels differ by {diff} > 2 x naive {naive_err}"
    );
}

/// A xorshift permutation of `v`.
fn shuffle<T>(v: &mut [T], seed: u64) {
    XorShift64::new(seed).shuffle(v);
}

/// Sequence s has `contexts[s]` positions, the last `rows[s]` of them this step's query rows.
/// Blocks come from a shuffled pool with spares (block 0 stays the null block that pads the
/// tables), so every table is non-contiguous and out of order. Returns the layout and the number
/// of blocks in the cache.
fn shuffled_layout(
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
fn naive_paged_attention(
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
fn paged_attention_f64(
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

/// (query heads, kv heads, head dim).
type Heads = (usize, usize, usize);

/// What a case forces at the device level: the key partition (small ones exercise the merge) and
/// the shared-memory limit the kernel variant is chosen for (a small one picks the fallback with
/// fewer pipeline stages, as a GPU with less shared memory would).
#[derive(Clone, Copy, Debug, Default)]
struct Forced {
    partition_keys: Option<usize>,
    smem_limit: Option<usize>,
}

impl Forced {
    fn partition(p: usize) -> Self {
        Self {
            partition_keys: Some(p),
            ..Self::default()
        }
    }
}

/// One paged case's outputs: the kernel's, the f64 reference, the naive bf16 computation and the
/// CPU reference backend's, and a description.
struct PagedRun {
    kernel: Vec<f32>,
    exact: Vec<f32>,
    naive: Vec<f32>,
    cpu: Vec<f32>,
    what: String,
}

/// Runs one paged-attention case on random q and caches: the GPU (through the backend, or at the
/// device level when something is forced) over `kernel_layout` (default: `layout`), the references
/// over `layout`.
#[allow(clippy::too_many_arguments)]
fn run_paged(
    gpu: &CudaBackend,
    cpu: &CpuBackend,
    what: &str,
    layout: &PagedLayout,
    kernel_layout: Option<&PagedLayout>,
    num_blocks: usize,
    (heads, kv_heads, hd): Heads,
    forced: Forced,
    seed: u64,
) -> PagedRun {
    let rows = layout.num_query_rows();
    let bs = layout.block_size;
    let (q, q_cpu) = random(gpu, &[rows, heads, hd], seed, 2.0);
    let cache_shape = [num_blocks, bs, kv_heads, hd];
    let (k_cache, k_cpu) = random(gpu, &cache_shape, seed + 1, 2.0);
    let (v_cache, v_cpu) = random(gpu, &cache_shape, seed + 2, 1.0);
    let scale = 1.0 / (hd as f32).sqrt();
    let mut out = poisoned(gpu, &[rows, heads, hd], DeviceDType::Bf16);
    let kernel_layout = kernel_layout.unwrap_or(layout);
    if forced.partition_keys.is_none() && forced.smem_limit.is_none() {
        gpu.paged_attention(&q, &k_cache, &v_cache, kernel_layout, scale, &mut out)
            .unwrap();
    } else {
        let mut device_layout = DevicePagedLayout::upload(gpu, kernel_layout).unwrap();
        device_layout.partition_keys = forced.partition_keys;
        device_layout.smem_limit = forced.smem_limit;
        gpu.device
            .paged_attention(
                &q,
                &k_cache,
                &v_cache,
                &device_layout,
                scale,
                &mut out,
                &gpu.pool,
            )
            .unwrap();
    }
    let mut reference = cpu.zeros(&[rows, heads, hd]).unwrap();
    cpu.paged_attention(&q_cpu, &k_cpu, &v_cpu, layout, scale, &mut reference)
        .unwrap();
    let (qd, kd, vd) = (&q_cpu.data, &k_cpu.data, &v_cpu.data);
    PagedRun {
        kernel: gpu.to_host(&out).unwrap(),
        exact: paged_attention_f64(qd, kd, vd, layout, heads, kv_heads, hd),
        naive: naive_paged_attention(qd, kd, vd, layout, heads, kv_heads, hd),
        cpu: reference.data,
        what: format!(
            "{what}: heads {heads}/{kv_heads} hd {hd} bs {bs} contexts {:?} {forced:?}",
            layout.context_lens
        ),
    }
}

/// One paged-attention case: the kernel and the CPU reference backend against f64 attention,
/// row by row (every query row and head within twice its own naive error).
#[allow(clippy::too_many_arguments)]
fn check_paged(
    gpu: &CudaBackend,
    cpu: &CpuBackend,
    what: &str,
    layout: &PagedLayout,
    num_blocks: usize,
    heads: Heads,
    forced: Forced,
    seed: u64,
) {
    let run = run_paged(
        gpu, cpu, what, layout, None, num_blocks, heads, forced, seed,
    );
    let rows = Rows::heads(heads.0, heads.2);
    let what = &run.what;
    check_within_naive(
        &format!("cpu {what}"),
        &run.cpu,
        &run.exact,
        &run.naive,
        rows,
    );
    check_within_naive(what, &run.kernel, &run.exact, &run.naive, rows);
}

#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn write_kv_copies_rows_bitwise_into_shuffled_slots() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    for (i, &(tokens, kv_heads, hd, bs)) in [
        (1usize, 1usize, 64usize, 16usize),
        (7, 2, 128, 16),
        (4099, 2, 128, 16),
        (129, 3, 16, 7),
        (33, 4, 32, 1),
    ]
    .iter()
    .enumerate()
    {
        let num_blocks = tokens.div_ceil(bs) * 2 + 1;
        let mut slots: Vec<u32> = (0..(num_blocks * bs) as u32).collect();
        shuffle(&mut slots, 40 + i as u64);
        slots.truncate(tokens);
        let seed = 2000 + 10 * i as u64;
        let (k, k_cpu) = random(&gpu, &[tokens, kv_heads, hd], seed, 2.0);
        let (v, v_cpu) = random(&gpu, &[tokens, kv_heads, hd], seed + 1, 1.0);
        let cache_shape = [num_blocks, bs, kv_heads, hd];
        let (mut k_cache, mut k_cache_cpu) = random(&gpu, &cache_shape, seed + 2, 3.0);
        let (mut v_cache, mut v_cache_cpu) = random(&gpu, &cache_shape, seed + 3, 3.0);
        gpu.write_kv(&k, &v, &slots, &mut k_cache, &mut v_cache)
            .unwrap();
        cpu.write_kv(&k_cpu, &v_cpu, &slots, &mut k_cache_cpu, &mut v_cache_cpu)
            .unwrap();
        // Every written slot holds its row, every other slot is untouched: bit for bit.
        for (name, dev, want) in [
            ("k_cache", &k_cache, &k_cache_cpu),
            ("v_cache", &v_cache, &v_cache_cpu),
        ] {
            let got: Vec<bf16> = pod_vec(&gpu.read_bytes(dev).unwrap());
            let want: Vec<bf16> = want.data.iter().map(|&x| bf16::from_f32(x)).collect();
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{name} [{tokens}, {kv_heads}, {hd}] block size {bs}"
            );
        }
    }
}

#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn decode_rows_of_very_different_contexts_match_cpu_reference() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    // (contexts, one query row each; heads, kv_heads, head_dim; block size): GQA 4, 7, 1, 2, 7;
    // a 40,000-token context beside contexts of 1 and 17.
    let cases: [(&[usize], Heads, usize); 5] = [
        (&[1, 17, 4099, 40_000], (16, 4, 128), 16),
        (&[40_000, 1, 17, 4099], (14, 2, 64), 16),
        (&[1, 17, 4099, 5000], (4, 4, 64), 7),
        (&[3, 17, 4099], (4, 2, 16), 16),
        (&[2, 600, 1], (7, 1, 32), 8),
    ];
    for (i, &(contexts, heads, bs)) in cases.iter().enumerate() {
        let rows = vec![1; contexts.len()];
        let (layout, num_blocks) = shuffled_layout(bs, &rows, contexts, 100 + i as u64);
        check_paged(
            &gpu,
            &cpu,
            "decode",
            &layout,
            num_blocks,
            heads,
            Forced::default(),
            3000 + 10 * i as u64,
        );
    }
}

// ---- sensitivity of the row-by-row tolerance ---------------------------------------------------

/// Decode rows of 2, 17 and 4003 keys (250 full blocks and 3): the short rows' naive error
/// (bf16 scores over a couple of keys) is far above the long row's.
const SWAP_CONTEXTS: [usize; 3] = [2, 17, 16 * 250 + 3];
const SWAP_HEADS: Heads = (4, 2, 32);

/// `layout` with the first and the last (partial) entry of sequence `s`'s block table swapped:
/// 13 of the long row's keys are lost and 13 slots past its context are read instead. (Swapping
/// two full blocks of a decode row would change nothing: every key is visible to it.)
fn swap_first_and_last_block(layout: &PagedLayout, s: usize) -> PagedLayout {
    let mut swapped = layout.clone();
    let last = (layout.context_lens[s] as usize).div_ceil(layout.block_size) - 1;
    swapped.block_tables.swap(
        s * layout.max_blocks_per_seq,
        s * layout.max_blocks_per_seq + last,
    );
    swapped
}

/// What a tensor-wide bound (the checker before it went row by row) would say: the largest error
/// within twice the largest naive error.
fn tensor_wide_bound_holds(got: &[f32], exact: &[f32], naive: &[f32]) -> bool {
    max_abs_diff(got, exact) <= 2.0 * max_abs_diff(naive, exact)
}

#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn a_swapped_block_table_entry_of_the_long_row_fails_the_row_check() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let rows = [1; SWAP_CONTEXTS.len()];
    let (layout, num_blocks) = shuffled_layout(16, &rows, &SWAP_CONTEXTS, 700);
    let swapped = swap_first_and_last_block(&layout, 2);
    let check = Rows::heads(SWAP_HEADS.0, SWAP_HEADS.2);
    for forced in [Forced::default(), Forced::partition(128)] {
        let run = |kernel_layout| {
            run_paged(
                &gpu,
                &cpu,
                "swap",
                &layout,
                kernel_layout,
                num_blocks,
                SWAP_HEADS,
                forced,
                7000,
            )
        };
        let good = run(None);
        check_within_naive(&good.what, &good.kernel, &good.exact, &good.naive, check);
        let bad = run(Some(&swapped));
        let verdict = within_naive(&bad.what, &bad.kernel, &bad.exact, &bad.naive, check);
        println!(
            "swapped table: row check {}; a tensor-wide bound would {}",
            if verdict.is_err() { "fails" } else { "PASSES" },
            if tensor_wide_bound_holds(&bad.kernel, &bad.exact, &bad.naive) {
                "pass"
            } else {
                "fail"
            }
        );
        let report = verdict.expect_err("a kernel reading a swapped block table must fail");
        assert!(report.contains("row 2 head"), "{report}");
    }
}

/// The same swap with the CPU reference backend (rounded to bf16) standing in for the kernel:
/// the row check must fail it, where a tensor-wide bound passes it. Runs everywhere.
#[test]
fn the_row_check_catches_a_swapped_block_table_without_a_gpu() {
    let cpu = CpuBackend::new();
    let (heads, kv_heads, hd) = SWAP_HEADS;
    let rows = [1; SWAP_CONTEXTS.len()];
    let (layout, num_blocks) = shuffled_layout(16, &rows, &SWAP_CONTEXTS, 700);
    let swapped = swap_first_and_last_block(&layout, 2);
    let host = |shape: &[usize], seed: u64, scale: f32| {
        let values = random_bf16(shape.iter().product(), seed, scale);
        CpuTensor::new(shape.to_vec(), values.iter().map(|v| v.to_f32()).collect())
    };
    let q = host(&[rows.len(), heads, hd], 7000, 2.0);
    let cache_shape = [num_blocks, 16, kv_heads, hd];
    let (k, v) = (host(&cache_shape, 7001, 2.0), host(&cache_shape, 7002, 1.0));
    let scale = 1.0 / (hd as f32).sqrt();
    let as_kernel = |l: &PagedLayout| -> Vec<f32> {
        let mut out = cpu.zeros(&[rows.len(), heads, hd]).unwrap();
        cpu.paged_attention(&q, &k, &v, l, scale, &mut out).unwrap();
        out.data.iter().map(|&x| round_bf16(x)).collect()
    };
    let exact = paged_attention_f64(&q.data, &k.data, &v.data, &layout, heads, kv_heads, hd);
    let naive = naive_paged_attention(&q.data, &k.data, &v.data, &layout, heads, kv_heads, hd);
    let check = Rows::heads(heads, hd);
    check_within_naive("unswapped", &as_kernel(&layout), &exact, &naive, check);
    let bad = as_kernel(&swapped);
    let report = within_naive("swapped", &bad, &exact, &naive, check)
        .expect_err("the swapped table must fail the row check");
    println!("{report}");
    assert!(report.contains("row 2 head"), "{report}");
    assert!(
        !report.contains("row 0 ") && !report.contains("row 1 "),
        "{report}"
    );
    assert!(
        tensor_wide_bound_holds(&bad, &exact, &naive),
        "a tensor-wide bound would have caught this swap too: the case no longer shows why rows"
    );
}

#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn chunks_over_cached_prefixes_mixed_with_decode_rows_match_cpu_reference() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    // 300 new rows over a 2,000-token cached prefix, beside decode rows, a 4-row chunk (16 flat
    // rows at group 4: the decode kernel's largest), and a fresh 2-token prompt.
    let rows = [300, 1, 1, 4, 2];
    let contexts = [2300, 5, 1000, 700, 2];
    for (i, &heads) in [(8, 2, 128), (14, 2, 64), (4, 1, 16), (4, 4, 32)]
        .iter()
        .enumerate()
    {
        let (layout, num_blocks) = shuffled_layout(16, &rows, &contexts, 200 + i as u64);
        check_paged(
            &gpu,
            &cpu,
            "chunk + decode",
            &layout,
            num_blocks,
            heads,
            Forced::default(),
            4000 + 10 * i as u64,
        );
    }
    // A long chunk alone over a long prefix: 63 prefill tiles, each split into partitions.
    let (layout, num_blocks) = shuffled_layout(16, &[500], &[3000], 210);
    check_paged(
        &gpu,
        &cpu,
        "long chunk",
        &layout,
        num_blocks,
        (8, 1, 128),
        Forced::default(),
        4100,
    );
}

#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn partition_boundaries_and_many_partitions_match_cpu_reference() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let heads = (8, 2, 128);
    // The partition the backend picks for a small batch, and contexts at its multiples +- 1, plus
    // a 70-row chunk whose rows straddle the boundary at 2P.
    let p = WorkPlan::build(&[0, 1], &[4096], 4, 2, gpu.device.num_sms as usize, None)
        .unwrap()
        .partition_keys;
    let contexts = [
        p - 1,
        p,
        p + 1,
        2 * p - 1,
        2 * p,
        2 * p + 1,
        3 * p,
        2 * p + 5,
    ];
    let mut rows = vec![1; contexts.len()];
    rows[7] = 70;
    let plan = WorkPlan::build(
        &{
            let mut cu = vec![0u32];
            for &r in &rows {
                cu.push(cu.last().unwrap() + r as u32);
            }
            cu
        },
        &contexts.map(|c| c as u32),
        4,
        2,
        gpu.device.num_sms as usize,
        None,
    )
    .unwrap();
    assert_eq!(
        plan.partition_keys, p,
        "the batch keeps the smallest partition"
    );
    let (layout, num_blocks) = shuffled_layout(16, &rows, &contexts, 300);
    check_paged(
        &gpu,
        &cpu,
        "boundaries",
        &layout,
        num_blocks,
        heads,
        Forced::default(),
        5000,
    );
    // Forced small partitions: hundreds of partials per row through the merge, boundaries at
    // multiples of 64 and 128 +- 1, a chunk whose rows have different partition counts.
    let contexts = [63, 64, 65, 127, 128, 129, 40_000, 1000];
    let mut rows = vec![1; contexts.len()];
    rows[7] = 100;
    let (layout, num_blocks) = shuffled_layout(16, &rows, &contexts, 301);
    for (j, forced) in [64, 128, 4096].into_iter().enumerate() {
        for (k, &h) in [(8, 2, 128), (14, 2, 64), (4, 4, 16)].iter().enumerate() {
            check_paged(
                &gpu,
                &cpu,
                "forced partitions",
                &layout,
                num_blocks,
                h,
                Forced::partition(forced),
                5100 + 10 * (3 * j + k) as u64,
            );
        }
    }
}

/// What a CUDA-graph decode step's attention computes (`cuda/graphs.rs`): the fixed plan, with
/// every sequence cut into partitions up to its table's capacity (those past a sequence's context
/// do nothing, and the merge skips rows of one partition) and padding rows (context 1 over the
/// null block), written by the graph's own input code (`decode_graph_attention_inputs`: the
/// `StaticInputs` a replay uses), launched at the device level with NaN-poisoned output and
/// scratch. Every row, padding included, against f64 attention over the padded layout; plans
/// sized for this device and for 132 SMs (4 partitions of 512 keys here).
#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn the_fixed_decode_graph_plan_matches_the_reference() {
    let gpu = gpu();
    let (batch, table_blocks, bs) = (4, 128, 16);
    // Three sequences of 1, 2 and 3 partitions of 512 keys, and one padding row.
    let contexts = [3, 600, 1500];
    let (layout, num_blocks) = shuffled_layout(bs, &[1; 3], &contexts, 900);
    for (i, &(heads, kv_heads, hd)) in [(8, 2, 64), (7, 1, 128)].iter().enumerate() {
        for num_sms in [None, Some(132)] {
            let (device_layout, padded) = decode_graph_attention_inputs(
                &gpu,
                &layout,
                batch,
                table_blocks,
                heads / kv_heads,
                kv_heads,
                num_blocks,
                num_sms,
            )
            .unwrap();
            assert_eq!(padded.num_seqs(), batch);
            assert_eq!(padded.context_lens, [3, 600, 1500, 1]);
            assert!(padded.block_table(3).iter().all(|&b| b == 0), "null block");
            let p = device_layout.partition_keys.unwrap();
            let partitions = (table_blocks * bs).div_ceil(p);
            if num_sms.is_some() {
                assert_eq!((p, partitions), (512, 4), "the plan this case is built for");
            }
            let seed = 9000 + 10 * i as u64;
            let (q, q_cpu) = random(&gpu, &[batch, heads, hd], seed, 2.0);
            let cache_shape = [num_blocks, bs, kv_heads, hd];
            let (k_cache, k_cpu) = random(&gpu, &cache_shape, seed + 1, 2.0);
            let (v_cache, v_cpu) = random(&gpu, &cache_shape, seed + 2, 1.0);
            // The scratch the call takes from the pool: NaN until a partition writes it.
            let scratch = poisoned(
                &gpu,
                &[batch * partitions * heads * (hd + 1)],
                DeviceDType::F32,
            );
            gpu.device.synchronize().unwrap();
            drop(scratch);
            let mut out = poisoned(&gpu, &[batch, heads, hd], DeviceDType::Bf16);
            let scale = 1.0 / (hd as f32).sqrt();
            gpu.device
                .paged_attention(
                    &q,
                    &k_cache,
                    &v_cache,
                    &device_layout,
                    scale,
                    &mut out,
                    &gpu.pool,
                )
                .unwrap();
            let (qd, kd, vd) = (&q_cpu.data, &k_cpu.data, &v_cpu.data);
            let exact = paged_attention_f64(qd, kd, vd, &padded, heads, kv_heads, hd);
            let naive = naive_paged_attention(qd, kd, vd, &padded, heads, kv_heads, hd);
            check_within_naive(
                &format!("graph plan heads {heads}/{kv_heads} hd {hd}: {p}-key partitions x {partitions}"),
                &gpu.to_host(&out).unwrap(),
                &exact,
                &naive,
                Rows::heads(heads, hd),
            );
        }
    }
}

/// Packs the rows `[from(s), to(s))` of each sequence (rows of `width` values) of a packed
/// tensor whose sequences start at `cu`.
fn pack_rows(
    data: &[f32],
    width: usize,
    cu: &[u32],
    range: impl Fn(usize) -> (usize, usize),
) -> Vec<f32> {
    let mut out = Vec::new();
    for (s, &start) in cu[..cu.len() - 1].iter().enumerate() {
        let (from, to) = range(s);
        let start = start as usize;
        out.extend_from_slice(&data[(start + from) * width..(start + to) * width]);
    }
    out
}

#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn paged_attention_over_written_cache_equals_flash_prefill() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let lens = [300usize, 1000, 17, 1, 129];
    let mut cu = vec![0u32];
    for &l in &lens {
        cu.push(cu.last().unwrap() + l as u32);
    }
    let t = *cu.last().unwrap() as usize;
    for (i, &(heads, kv_heads, hd)) in [(8, 2, 128), (14, 2, 64), (4, 4, 16)].iter().enumerate() {
        let seed = 6000 + 10 * i as u64;
        let (q, q_cpu) = random(&gpu, &[t, heads, hd], seed, 2.0);
        let (k, k_cpu) = random(&gpu, &[t, kv_heads, hd], seed + 1, 2.0);
        let (v, v_cpu) = random(&gpu, &[t, kv_heads, hd], seed + 2, 1.0);
        let scale = 1.0 / (hd as f32).sqrt();
        let mut flash = poisoned(&gpu, &[t, heads, hd], DeviceDType::Bf16);
        gpu.attention(&q, &k, &v, &cu, scale, &mut flash).unwrap();
        let flash = gpu.to_host(&flash).unwrap();
        let mut reference = cpu.zeros(&[t, heads, hd]).unwrap();
        cpu.attention(&q_cpu, &k_cpu, &v_cpu, &cu, scale, &mut reference)
            .unwrap();
        let naive = naive_attention(
            &q_cpu.data,
            &k_cpu.data,
            &v_cpu.data,
            &cu,
            heads,
            kv_heads,
            hd,
        );
        let what = format!("heads {heads}/{kv_heads} hd {hd}");
        let exact = attention_f64(
            &q_cpu.data,
            &k_cpu.data,
            &v_cpu.data,
            &cu,
            heads,
            kv_heads,
            hd,
        );
        let rows = Rows::heads(heads, hd);
        check_within_naive(
            &format!("cpu prefill {what}"),
            &reference.data,
            &exact,
            &naive,
            rows,
        );

        // Whole prompts in one step: every row of every sequence, over NaN-poisoned caches (a
        // read of any slot not written here would show).
        let (layout, num_blocks) = shuffled_layout(16, &lens, &lens, 400 + i as u64);
        let cache_shape = [num_blocks, 16, kv_heads, hd];
        let mut k_cache = poisoned(&gpu, &cache_shape, DeviceDType::Bf16);
        let mut v_cache = poisoned(&gpu, &cache_shape, DeviceDType::Bf16);
        gpu.write_kv(&k, &v, &layout.slot_mapping, &mut k_cache, &mut v_cache)
            .unwrap();
        let mut out = poisoned(&gpu, &[t, heads, hd], DeviceDType::Bf16);
        gpu.paged_attention(&q, &k_cache, &v_cache, &layout, scale, &mut out)
            .unwrap();
        let paged = gpu.to_host(&out).unwrap();
        check_within_naive(
            &format!("paged prefill {what}"),
            &paged,
            &exact,
            &naive,
            rows,
        );
        check_within_naive(
            &format!("flash prefill {what}"),
            &flash,
            &exact,
            &naive,
            rows,
        );
        check_kernels_agree(
            &format!("paged vs flash {what}"),
            &paged,
            &flash,
            max_abs_diff(&naive, &reference.data),
        );

        // Two steps: the first 60% of each prompt, then the rest as a chunk over that prefix.
        let split = |s: usize| lens[s] * 3 / 5;
        let first: Vec<usize> = (0..lens.len()).map(split).collect();
        let rest: Vec<usize> = (0..lens.len()).map(|s| lens[s] - split(s)).collect();
        let (mut k_cache, mut v_cache) = (
            poisoned(&gpu, &cache_shape, DeviceDType::Bf16),
            poisoned(&gpu, &cache_shape, DeviceDType::Bf16),
        );
        let mut chunk_out = Vec::new();
        for (step, (rows, contexts)) in [
            (first.clone(), first.clone()),
            (rest.clone(), lens.to_vec()),
        ]
        .into_iter()
        .enumerate()
        {
            let mut step_layout = layout.clone();
            step_layout.context_lens = contexts.iter().map(|&c| c as u32).collect();
            step_layout.cu_query = vec![0];
            step_layout.slot_mapping.clear();
            for (s, (&n, &c)) in rows.iter().zip(&contexts).enumerate() {
                step_layout
                    .cu_query
                    .push(step_layout.cu_query.last().unwrap() + n as u32);
                for p in c - n..c {
                    let b = step_layout.block_table(s)[p / 16];
                    step_layout.slot_mapping.push(b * 16 + (p % 16) as u32);
                }
            }
            let range = |s: usize| (contexts[s] - rows[s], contexts[s]);
            let n = step_layout.num_query_rows();
            if n == 0 {
                continue;
            }
            let upload = |data: &[f32], width: usize, shape: &[usize]| {
                let values: Vec<bf16> = pack_rows(data, width, &cu, range)
                    .iter()
                    .map(|&x| bf16::from_f32(x))
                    .collect();
                gpu.upload_pod(&values, shape, DeviceDType::Bf16).unwrap()
            };
            let kw = kv_heads * hd;
            let step_k = upload(&k_cpu.data, kw, &[n, kv_heads, hd]);
            let step_v = upload(&v_cpu.data, kw, &[n, kv_heads, hd]);
            let step_q = upload(&q_cpu.data, heads * hd, &[n, heads, hd]);
            gpu.write_kv(
                &step_k,
                &step_v,
                &step_layout.slot_mapping,
                &mut k_cache,
                &mut v_cache,
            )
            .unwrap();
            let mut out = poisoned(&gpu, &[n, heads, hd], DeviceDType::Bf16);
            gpu.paged_attention(&step_q, &k_cache, &v_cache, &step_layout, scale, &mut out)
                .unwrap();
            if step == 1 {
                chunk_out = gpu.to_host(&out).unwrap();
            }
        }
        let rest_range = |s: usize| (split(s), lens[s]);
        let width = heads * hd;
        let reference_rest = pack_rows(&reference.data, width, &cu, rest_range);
        let exact_rest = pack_rows(&exact, width, &cu, rest_range);
        let flash_rest = pack_rows(&flash, width, &cu, rest_range);
        let naive_rest = pack_rows(&naive, width, &cu, rest_range);
        check_within_naive(
            &format!("paged chunk after a cached prefix {what}"),
            &chunk_out,
            &exact_rest,
            &naive_rest,
            rows,
        );
        check_kernels_agree(
            &format!("paged chunk vs flash {what}"),
            &chunk_out,
            &flash_rest,
            max_abs_diff(&naive_rest, &reference_rest),
        );
    }
}

#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn a_step_scope_uploads_each_layout_once_and_keeps_them_apart() {
    // Inside `begin_step` .. `end_step` the backend keeps device copies of layouts and slot
    // mappings by address. Two layouts alive at once must each get their own, a repeated call
    // must give the same bits, and the results must equal unscoped calls.
    let gpu = gpu();
    let (heads, kv_heads, hd) = (8, 2, 64);
    let (a, num_blocks_a) = shuffled_layout(16, &[1, 1, 5], &[30, 900, 77], 501);
    let (b, num_blocks_b) = shuffled_layout(16, &[1, 3], &[1200, 40], 502);
    let num_blocks = num_blocks_a.max(num_blocks_b);
    let cache_shape = [num_blocks, 16, kv_heads, hd];
    let (k_cache, _) = random(&gpu, &cache_shape, 511, 2.0);
    let (v_cache, _) = random(&gpu, &cache_shape, 512, 1.0);
    let scale = 1.0 / (hd as f32).sqrt();
    let run = |layout: &PagedLayout, seed: u64| -> Vec<f32> {
        let rows = layout.num_query_rows();
        let (q, _) = random(&gpu, &[rows, heads, hd], seed, 2.0);
        let mut out = poisoned(&gpu, &[rows, heads, hd], DeviceDType::Bf16);
        gpu.paged_attention(&q, &k_cache, &v_cache, layout, scale, &mut out)
            .unwrap();
        gpu.to_host(&out).unwrap()
    };
    let (plain_a, plain_b) = (run(&a, 7), run(&b, 8));
    gpu.begin_step();
    let scoped = [run(&a, 7), run(&b, 8), run(&a, 7), run(&b, 8)];
    gpu.end_step();
    for (i, got) in scoped.iter().enumerate() {
        let expect = if i % 2 == 0 { &plain_a } else { &plain_b };
        assert!(
            got.iter()
                .zip(expect)
                .all(|(x, y)| x.to_bits() == y.to_bits()),
            "call {i} inside the step scope differs from the unscoped call"
        );
    }
}

/// The 2-stage hd128 decode kernel a GPU with 99 KiB of shared memory per block runs (sm_86,
/// sm_89: A10, L4, L40S, RTX 30/40), forced here by the limit the variant is chosen for: decode
/// rows of different contexts, a 4-row chunk at group 4 (16 flat rows: still the decode kernel),
/// split rows through the merge. The 3-stage kernel over the same inputs for comparison.
#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn the_small_shared_memory_decode_variant_matches_the_reference() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    assert_eq!(
        attention_variant(128, false, SM89_SMEM).unwrap().name,
        "paged_attn_decode_hd128_2stage"
    );
    let device_limit = gpu.device.max_shared_memory_per_block_optin().unwrap();
    println!(
        "this device: {device_limit} B per block -> {}",
        attention_variant(128, false, device_limit).unwrap().name
    );
    let (layout, num_blocks) = shuffled_layout(16, &[1, 1, 4, 1], &[1, 70, 200, 333], 800);
    for (i, partition) in [None, Some(64)].into_iter().enumerate() {
        for smem_limit in [SM89_SMEM, SM90_SMEM.min(device_limit)] {
            check_paged(
                &gpu,
                &cpu,
                "decode variant",
                &layout,
                num_blocks,
                (8, 2, 128),
                Forced {
                    partition_keys: partition,
                    smem_limit: Some(smem_limit),
                },
                8000 + i as u64,
            );
        }
    }
}

#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn every_paged_kernel_loads() {
    let gpu = gpu();
    gpu.device.function("paged_attn", "write_kv_bf16").unwrap();
    gpu.device
        .function("paged_attn", "paged_attn_decode_hd128_2stage")
        .unwrap();
    for hd in [16, 32, 64, 128] {
        for kind in ["decode", "prefill", "merge"] {
            gpu.device
                .function("paged_attn", &format!("paged_attn_{kind}_hd{hd}"))
                .unwrap();
        }
    }
}

#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn bad_inputs_are_errors() {
    let gpu = gpu();
    let (layout, num_blocks) = shuffled_layout(16, &[1], &[20], 500);
    let (q, _) = random(&gpu, &[1, 4, 64], 1, 1.0);
    let (k_cache, _) = random(&gpu, &[num_blocks, 16, 2, 64], 2, 1.0);
    let mut out = poisoned(&gpu, &[1, 4, 64], DeviceDType::Bf16);
    // A cache too small for the tables.
    let (small, _) = random(&gpu, &[1, 16, 2, 64], 3, 1.0);
    assert!(gpu
        .paged_attention(&q, &small, &small, &layout, 0.125, &mut out)
        .is_err());
    // Head dims without a kernel, and kv heads that do not divide the query heads.
    let (q80, _) = random(&gpu, &[1, 4, 80], 4, 1.0);
    let (c80, _) = random(&gpu, &[num_blocks, 16, 2, 80], 5, 1.0);
    let mut out80 = poisoned(&gpu, &[1, 4, 80], DeviceDType::Bf16);
    let err = gpu
        .paged_attention(&q80, &c80, &c80, &layout, 0.125, &mut out80)
        .unwrap_err();
    assert!(format!("{err:#}").contains("head_dim 80"), "{err:#}");
    let (c3, _) = random(&gpu, &[num_blocks, 16, 3, 64], 6, 1.0);
    assert!(gpu
        .paged_attention(&q, &c3, &c3, &layout, 0.125, &mut out)
        .is_err());
    // A forced partition that is not a whole number of key tiles.
    let mut device_layout = DevicePagedLayout::upload(&gpu, &layout).unwrap();
    device_layout.partition_keys = Some(100);
    assert!(gpu
        .device
        .paged_attention(
            &q,
            &k_cache,
            &k_cache,
            &device_layout,
            0.125,
            &mut out,
            &gpu.pool
        )
        .is_err());
}

// ---- work plans: host-only, these run everywhere (CI included) ---------------------------------

/// Every (query row, head, key) triple is covered by exactly one block, and the scratch rows
/// of split rows are dense and disjoint.
fn check_coverage(cu: &[u32], ctx: &[u32], group: usize, plan: &WorkPlan) {
    let p = plan.partition_keys;
    // seen[row * group + g][j]: how many blocks give row `row`, head g of the group, key j.
    let mut seen: Vec<Vec<u32>> = Vec::new();
    for (w, &c) in cu.windows(2).zip(ctx) {
        let n = (w[1] - w[0]) as usize;
        for local in 0..n * group {
            seen.push(vec![0; c as usize - n + local / group + 1]);
        }
    }
    for (items, block_m) in [
        (&plan.decode, DECODE_BLOCK_M),
        (&plan.prefill, PREFILL_BLOCK_M),
    ] {
        for &[s, m0, part, keys] in items.iter() {
            let (s, m0, part) = (s as usize, m0 as usize, part as usize);
            let n = (cu[s + 1] - cu[s]) as usize;
            let first_pos = ctx[s] as usize - n;
            let m_end = (m0 + block_m).min(n * group);
            let p_last = first_pos + (m_end - 1) / group;
            let (n_begin, n_end) = (part * p, (part * p + p).min(p_last + 1));
            assert_eq!(keys as usize, n_end - n_begin);
            for flat in m0..m_end {
                let position = first_pos + flat / group;
                let row_keys = &mut seen[cu[s] as usize * group + flat];
                for count in &mut row_keys[n_begin..n_end.min(position + 1)] {
                    *count += 1;
                }
            }
        }
    }
    for (i, keys) in seen.iter().enumerate() {
        assert!(keys.iter().all(|&c| c == 1), "flat row {i}: {keys:?}");
    }
    let mut next = 0;
    for (row, &[base, parts]) in plan.rows.iter().enumerate() {
        let position = seen[row * group].len() - 1;
        assert_eq!(parts as usize, (position + 1).div_ceil(p));
        if parts > 1 {
            assert_eq!(base as usize, next);
            assert!(plan.split_rows.contains(&(row as i32)));
            next += parts as usize;
        }
    }
    assert_eq!(next, plan.scratch_rows);
}

#[test]
fn work_plans_cover_every_key_once_without_a_gpu() {
    let cases: [(&[u32], &[u32], usize); 4] = [
        (&[0, 1, 2, 3, 4], &[1, 17, 4099, 40_000], 7),
        (&[0, 300, 301, 303], &[2300, 512, 1025], 4),
        (&[0, 1, 1], &[513, 0], 1),
        (&[0, 5, 6], &[5, 1], 2),
    ];
    for (cu, ctx, group) in cases {
        for forced in [None, Some(64), Some(512), Some(1024)] {
            let plan = WorkPlan::build(cu, ctx, group, 2, 132, forced).unwrap();
            check_coverage(cu, ctx, group, &plan);
        }
    }
}

#[test]
fn work_plan_partitions_grow_with_the_batch_without_a_gpu() {
    // One 131k decode row on 132 SMs: the minimum partition, 256 blocks per kv head.
    let one = WorkPlan::build(&[0, 1], &[131_072], 8, 1, 132, None).unwrap();
    assert_eq!(one.partition_keys, MIN_PARTITION_KEYS);
    assert_eq!(one.decode.len(), 256);
    // 256 rows of 32k: partitions grow until about 4 blocks per SM remain.
    let cu: Vec<u32> = (0..=256).collect();
    let many = WorkPlan::build(&cu, &[32_768; 256], 8, 1, 132, None).unwrap();
    assert!(many.partition_keys > MIN_PARTITION_KEYS);
    assert!(many.decode.len() >= 132 * 2, "{}", many.decode.len());
    assert!(many.decode.windows(2).all(|w| w[0][3] >= w[1][3]));
    // A long prefill chunk is parallel enough on its own: no split, no scratch.
    let chunk = WorkPlan::build(&[0, 8192], &[131_072], 8, 4, 132, None).unwrap();
    assert_eq!(chunk.scratch_rows, 0);
    assert!(chunk.decode.is_empty() && chunk.prefill.len() == 8192 * 8 / PREFILL_BLOCK_M);
    assert!(WorkPlan::build(&[0, 2], &[1], 1, 1, 132, None).is_err());
    assert!(WorkPlan::build(&[0, 1], &[10], 1, 1, 132, Some(100)).is_err());
}

/// Opt-in shared memory per block of sm_90, sm_80 and sm_86 / sm_89.
const SM90_SMEM: usize = 227 * 1024;
const SM80_SMEM: usize = 163 * 1024;
const SM89_SMEM: usize = 99 * 1024;

#[test]
fn paged_kernels_fit_two_blocks_per_sm_without_a_gpu() {
    for hd in [16, 32, 64, 128] {
        for prefill in [false, true] {
            let v = attention_variant(hd, prefill, SM90_SMEM).unwrap();
            assert!(2 * (v.smem + 1024) <= 228 * 1024, "{v:?}");
        }
    }
    assert_eq!(
        attention_variant(128, false, SM90_SMEM).unwrap().smem,
        109_312
    );
    assert!(attention_variant(80, false, SM90_SMEM).is_err());
}

/// hd128 decode needs 109,312 B with its 3-stage ring: more than sm_86 / sm_89 let a block have
/// (99 KiB), where the 2-stage variant runs instead. Every other kernel fits every sm_80+ GPU.
#[test]
fn paged_kernel_variants_fit_each_gpus_shared_memory_without_a_gpu() {
    for (limit, decode128) in [
        (SM90_SMEM, "paged_attn_decode_hd128"),
        (SM80_SMEM, "paged_attn_decode_hd128"),
        (SM89_SMEM, "paged_attn_decode_hd128_2stage"),
    ] {
        let v = attention_variant(128, false, limit).unwrap();
        assert_eq!(v.name, decode128, "limit {limit}");
        assert!(v.smem as usize <= limit);
        for hd in [16, 32, 64, 128] {
            for prefill in [false, true] {
                let v = attention_variant(hd, prefill, limit).unwrap();
                assert!(v.smem as usize <= limit, "{v:?} at {limit}");
                if hd != 128 || prefill {
                    assert_eq!(v, attention_variant(hd, prefill, SM90_SMEM).unwrap());
                }
            }
        }
    }
    assert_eq!(
        attention_variant(128, false, SM89_SMEM).unwrap(),
        AttentionVariant {
            name: "paged_attn_decode_hd128_2stage".into(),
            smem: 74_496,
            stages: 2
        }
    );
    let err = attention_variant(128, false, 64 * 1024).unwrap_err();
    assert!(
        format!("{err}")
            .contains("needs 74496 B of shared memory per block; this GPU allows 65536 B"),
        "{err}"
    );
}
