//! The paged-attention kernels (kernels/paged_attn.cu) against the CPU reference backend:
//! attention over shuffled, non-contiguous block tables with decode rows of very different
//! context lengths, multi-row chunks over cached prefixes, GQA 1/2/4/7, head dims 16/32/64/128,
//! segment boundaries, and the small-shared-memory variant. Outputs are poisoned (NaN bytes)
//! before each launch. Cache writes and equality with the prefill flash kernel over a cache
//! `write_kv` filled are tested in tests/gpu_paged_cache.rs; how the work is planned (host-only
//! work plans, the CUDA-graph decode plan, per-step layout uploads) in tests/gpu_paged_plan.rs;
//! the helpers they share are in tests/common/paged.rs.
//!
//! Tolerance (DESIGN.md), row by row (`common::gpu::within_naive`): each query row and head
//! within twice that row's own error of transformers' eager bf16 attention (scores rounded to
//! bf16, softmax in f32, probabilities rounded to bf16, P V in f32, output rounded), plus half an
//! output ulp, both measured against attention in f64; the CPU reference backend must pass the
//! same bound. A tensor-wide bound let short rows set the bound of long ones: the swapped-table
//! tests show a long row's error that one passes and the row check fails.
//!
//! The GPU tests need a CUDA GPU: run them through scripts/gpu-pack.sh; without one they fail,
//! never pass (or a SWERVE_EMU=1 build runs them on the emulated device). The swapped-table
//! check with the CPU reference standing in for the kernel is host-only and runs everywhere.

mod common;

use common::gpu::{check_within_naive, gpu, poisoned, random, round_bf16, within_naive, Rows};
use common::paged::{
    naive_paged_attention, paged_attention_f64, shuffled_layout, Heads, SM89_SMEM, SM90_SMEM,
};
use swerve::backend::cpu::{CpuBackend, CpuTensor};
use swerve::backend::cuda::paged_attn::{
    attention_variant, warp_per_item_decode_variant, DevicePagedLayout, WorkPlan,
};
use swerve::backend::cuda::{CudaBackend, DeviceDType};
use swerve::backend::{Backend, PagedLayout};
use swerve::bench::kernels::{max_abs_diff, random_bf16};

/// What a case forces at the device level: the key segment (small ones exercise the merge on
/// short contexts) and the shared-memory limit the kernel variant is chosen for (a small one picks
/// the fallback with fewer warps per block, as a GPU with less shared memory would).
#[derive(Clone, Copy, Debug, Default)]
struct Forced {
    segment_keys: Option<usize>,
    smem_limit: Option<usize>,
    /// The earlier one-warp-per-item decode kernel instead of `paged_decode_split`.
    warp_per_item: bool,
    /// The split decode kernel's ring depth and segments per block (runs).
    decode_stages: Option<usize>,
    decode_run: Option<usize>,
}

impl Forced {
    fn segment(p: usize) -> Self {
        Self {
            segment_keys: Some(p),
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
    let defaults = forced.decode_stages.is_none() && forced.decode_run.is_none();
    if forced.segment_keys.is_none()
        && forced.smem_limit.is_none()
        && !forced.warp_per_item
        && defaults
    {
        gpu.paged_attention(&q, &k_cache, &v_cache, kernel_layout, scale, &mut out)
            .unwrap();
    } else {
        let mut device_layout = DevicePagedLayout::upload(gpu, kernel_layout).unwrap();
        device_layout.segment_keys = forced.segment_keys;
        device_layout.smem_limit = forced.smem_limit;
        device_layout.decode_warp_per_item = forced.warp_per_item;
        device_layout.decode_stages = forced.decode_stages;
        device_layout.decode_run = forced.decode_run;
        // The pool hands the call the buffer of the scratch's size class it got back last: poison
        // it, so a partial the kernel never writes reads as NaN, not as an earlier run's value.
        let (group, sms) = (heads / kv_heads, gpu.device.num_sms as usize);
        let (cu, ctx) = (&kernel_layout.cu_query, &kernel_layout.context_lens);
        let plan = WorkPlan::build(cu, ctx, group, kv_heads, sms, forced.segment_keys).unwrap();
        if plan.scratch_rows > 0 {
            let floats = plan.scratch_rows * heads * (hd + 2);
            let mut scratch = gpu.pool.alloc(&[floats], DeviceDType::F32).unwrap();
            gpu.fill_bytes(&mut scratch, 0xFF).unwrap();
        }
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
    for forced in [Forced::default(), Forced::segment(128)] {
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
    // A long chunk alone over a long prefix: 63 prefill tiles, split per segment on a GPU of more
    // SMs than 63 blocks, folded in the kernel on a smaller one.
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
fn segment_boundaries_and_many_segments_match_cpu_reference() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let heads = (8, 2, 128);
    // The canonical segment, and contexts at its multiples +- 1, plus a 70-row chunk whose rows
    // straddle the boundary at 2P.
    let p = WorkPlan::build(&[0, 1], &[4096], 4, 2, gpu.device.num_sms as usize, None)
        .unwrap()
        .segment_keys;
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
        plan.segment_keys, p,
        "the segment never depends on the batch"
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
    // Forced small segments: hundreds of partials per row through the merge, boundaries at
    // multiples of 64 and 128 +- 1, a chunk whose rows have different segment counts.
    let contexts = [63, 64, 65, 127, 128, 129, 40_000, 1000];
    let mut rows = vec![1; contexts.len()];
    rows[7] = 100;
    let (layout, num_blocks) = shuffled_layout(16, &rows, &contexts, 301);
    for (j, forced) in [64, 128, 4096].into_iter().enumerate() {
        for (k, &h) in [(8, 2, 128), (14, 2, 64), (4, 4, 16)].iter().enumerate() {
            check_paged(
                &gpu,
                &cpu,
                "forced segments",
                &layout,
                num_blocks,
                h,
                Forced::segment(forced),
                5100 + 10 * (3 * j + k) as u64,
            );
        }
    }
}

/// The earlier one-warp-per-item decode kernel, in its hd128 form for GPUs with 99 KiB of shared
/// memory per block (sm_86, sm_89: A10, L4, L40S, RTX 30/40) and its two-warp form, against the
/// reference: decode rows of different contexts, a 4-row chunk at group 4 (16 flat rows: still
/// the decode kernel), split rows through the merge.
#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn the_warp_per_item_decode_variants_match_the_reference() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    assert_eq!(
        warp_per_item_decode_variant(128, SM89_SMEM).unwrap().name,
        "paged_attn_decode_hd128_small"
    );
    let device_limit = gpu.device.max_shared_memory_per_block_optin().unwrap();
    println!(
        "this device: {device_limit} B per block -> {} / {}",
        attention_variant(128, false, device_limit).unwrap().name,
        warp_per_item_decode_variant(128, device_limit)
            .unwrap()
            .name
    );
    let (layout, num_blocks) = shuffled_layout(16, &[1, 1, 4, 1], &[1, 70, 200, 333], 800);
    for (i, segment) in [None, Some(64)].into_iter().enumerate() {
        for smem_limit in [SM89_SMEM, SM90_SMEM.min(device_limit)] {
            check_paged(
                &gpu,
                &cpu,
                "decode variant",
                &layout,
                num_blocks,
                (8, 2, 128),
                Forced {
                    segment_keys: segment,
                    smem_limit: Some(smem_limit),
                    warp_per_item: true,
                    ..Forced::default()
                },
                8000 + i as u64,
            );
        }
    }
}

/// Issue 36: `paged_decode_split` (a block of up to 4 warps per item: scores split by keys,
/// P V by head-dim columns) gives the bits of the one-warp-per-item kernel, for every head dim,
/// GQA 1, 4, 7 and 8, contexts on and around tile and segment boundaries, chunks of several
/// rows, with the canonical 512-key segments and with forced 64-key ones (the merge); and so do
/// its deeper rings (3 and 4 stages at hd 64 and 128) and its runs (a block streaming 2, 3 or
/// 16 consecutive segments, each finished as it would be alone). Each is also checked against
/// the reference.
#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn the_split_decode_kernel_gives_the_warp_per_item_kernels_bits() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let contexts = [1, 63, 64, 65, 511, 512, 513, 700, 1100];
    let rows = [1, 1, 1, 1, 1, 1, 1, 2, 1];
    let (layout, num_blocks) = shuffled_layout(16, &rows, &contexts, 8100);
    let mut checked = 0;
    for (j, heads) in [
        (8, 2, 16),
        (4, 4, 32),
        (14, 2, 64),
        (28, 4, 128),
        (32, 4, 128),
        (16, 2, 128),
    ]
    .into_iter()
    .enumerate()
    {
        for segment in [None, Some(64)] {
            let seed = 8200 + 10 * j as u64;
            let run = |warp_per_item, decode_stages, decode_run| {
                let forced = Forced {
                    segment_keys: segment,
                    warp_per_item,
                    decode_stages,
                    decode_run,
                    ..Forced::default()
                };
                let forced_layout = Forced {
                    smem_limit: Some(gpu.device.max_shared_memory_per_block_optin().unwrap()),
                    ..forced
                };
                run_paged(
                    &gpu,
                    &cpu,
                    "split decode",
                    &layout,
                    None,
                    num_blocks,
                    heads,
                    forced_layout,
                    seed,
                )
            };
            let one_warp = run(true, None, None);
            let mut mappings = vec![(None, None), (Some(2), Some(3))];
            if heads.2 >= 64 {
                mappings.extend([(Some(3), Some(2)), (Some(4), Some(16))]);
            }
            for (stages, decode_run) in mappings {
                let split = run(false, stages, decode_run);
                let differ = split
                    .kernel
                    .iter()
                    .zip(&one_warp.kernel)
                    .filter(|(a, b)| a.to_bits() != b.to_bits())
                    .count();
                assert_eq!(
                    differ, 0,
                    "{}: {differ} values differ between the kernels",
                    split.what
                );
            }
            check_paged(
                &gpu,
                &cpu,
                "split decode",
                &layout,
                num_blocks,
                heads,
                Forced {
                    segment_keys: segment,
                    ..Forced::default()
                },
                seed,
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 12);
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
        .function("paged_attn", "paged_attn_decode_hd128_small")
        .unwrap();
    for hd in [16, 32, 64, 128] {
        gpu.device
            .function("paged_attn", &format!("paged_attn_decode_split_hd{hd}"))
            .unwrap();
    }
    for name in [
        "paged_attn_decode_hd64_small",
        "paged_attn_prefill_hd128_small",
    ] {
        gpu.device.function("paged_attn", name).unwrap();
    }
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
    // A forced segment that is not a whole number of key tiles.
    let mut device_layout = DevicePagedLayout::upload(&gpu, &layout).unwrap();
    device_layout.segment_keys = Some(100);
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
