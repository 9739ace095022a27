//! How paged attention's work is planned (`WorkPlan`, `src/backend/cuda/paged_attn.rs`): the
//! host-only work plans (every key covered once, fixed canonical segments, kernel
//! variants that fit each GPU's shared memory; these run everywhere, CI included), the fixed plan
//! a CUDA-graph decode step replays, and the per-step scope that uploads each layout once. The
//! kernels' numbers against the references are tested in tests/gpu_paged.rs.
//!
//! The GPU tests need a CUDA GPU: run them through scripts/gpu-pack.sh; without one they fail,
//! never pass (or a SWERVE_EMU=1 build runs them on the emulated device).

mod common;

use common::gpu::{check_within_naive, gpu, poisoned, random, Rows};
use common::paged::{
    naive_paged_attention, paged_attention_f64, shuffled_layout, SM80_SMEM, SM89_SMEM, SM90_SMEM,
};
use swerve::backend::cuda::graphs::decode_graph_attention_inputs;
use swerve::backend::cuda::paged_attn::{
    attention_variant, decode_blocks_per_sm, split_decode_variant, warp_per_item_decode_variant,
    AttentionVariant, WorkPlan, DECODE_BLOCK_M, PREFILL_BLOCK_M, SEGMENT_KEYS,
};
use swerve::backend::cuda::paged_plan::MAX_DECODE_RUN;
use swerve::backend::cuda::DeviceDType;
use swerve::backend::{Backend, PagedLayout};

/// What a CUDA-graph decode step's attention computes (`cuda/graphs.rs`): the fixed plan, with
/// every sequence cut into segments up to its table's capacity (those past a sequence's context
/// do nothing, and the merge skips rows of one segment) and padding rows (context 1 over the
/// null block), written by the graph's own input code (`decode_graph_attention_inputs`: the
/// `StaticInputs` a replay uses), launched at the device level with NaN-poisoned output and
/// scratch. Every row, padding included, against f64 attention over the padded layout (4
/// segments of 512 keys here).
#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn the_fixed_decode_graph_plan_matches_the_reference() {
    let gpu = gpu();
    let (batch, table_blocks, bs) = (4, 128, 16);
    // Three sequences of 1, 2 and 3 segments of 512 keys, and one padding row.
    let contexts = [3, 600, 1500];
    let (layout, num_blocks) = shuffled_layout(bs, &[1; 3], &contexts, 900);
    for (i, &(heads, kv_heads, hd)) in [(8, 2, 64), (7, 1, 128)].iter().enumerate() {
        {
            let (device_layout, padded) = decode_graph_attention_inputs(
                &gpu,
                &layout,
                batch,
                table_blocks,
                heads / kv_heads,
                kv_heads,
                num_blocks,
            )
            .unwrap();
            assert_eq!(padded.num_seqs(), batch);
            assert_eq!(padded.context_lens, [3, 600, 1500, 1]);
            assert!(padded.block_table(3).iter().all(|&b| b == 0), "null block");
            let p = device_layout.segment_keys.unwrap();
            let segments = (table_blocks * bs).div_ceil(p);
            assert_eq!((p, segments), (512, 4), "the plan this case is built for");
            let seed = 9000 + 10 * i as u64;
            let (q, q_cpu) = random(&gpu, &[batch, heads, hd], seed, 2.0);
            let cache_shape = [num_blocks, bs, kv_heads, hd];
            let (k_cache, k_cpu) = random(&gpu, &cache_shape, seed + 1, 2.0);
            let (v_cache, v_cpu) = random(&gpu, &cache_shape, seed + 2, 1.0);
            // The scratch the call takes from the pool: NaN until a segment writes it.
            let scratch = poisoned(
                &gpu,
                &[batch * segments * heads * (hd + 2)],
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
                &format!(
                    "graph plan heads {heads}/{kv_heads} hd {hd}: {p}-key segments x {segments}"
                ),
                &gpu.to_host(&out).unwrap(),
                &exact,
                &naive,
                Rows::heads(heads, hd),
            );
        }
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

// ---- work plans: host-only, these run everywhere (CI included) ---------------------------------

/// Every (query row, head, key) triple is covered by exactly one block, and the scratch rows
/// of split rows are dense and disjoint.
fn check_coverage(cu: &[u32], ctx: &[u32], group: usize, plan: &WorkPlan) {
    let p = plan.segment_keys;
    // Sequences whose prefill tiles fold their segments in the kernel (segment -1): no scratch.
    let whole: Vec<usize> = (plan.prefill.iter())
        .filter(|item| item[2] < 0)
        .map(|item| item[0] as usize)
        .collect();
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
            let (s, m0) = (s as usize, m0 as usize);
            let n = (cu[s + 1] - cu[s]) as usize;
            let first_pos = ctx[s] as usize - n;
            let m_end = (m0 + block_m).min(n * group);
            let p_last = first_pos + (m_end - 1) / group;
            // A decode item may be a run of consecutive segments (its keys: all of theirs).
            let (n_begin, n_end) = match usize::try_from(part) {
                Ok(part) => (part * p, (part * p + keys as usize).min(p_last + 1)),
                Err(_) => (0, p_last + 1),
            };
            assert_eq!(keys as usize, n_end - n_begin);
            let most = if block_m == DECODE_BLOCK_M {
                MAX_DECODE_RUN * p
            } else {
                p
            };
            assert!(
                part < 0 || (keys > 0 && keys as usize <= most),
                "{keys} keys"
            );
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
        let seq = cu
            .windows(2)
            .position(|w| (w[0]..w[1]).contains(&(row as u32)))
            .unwrap();
        let expect = if whole.contains(&seq) {
            1
        } else {
            (position + 1).div_ceil(p)
        };
        assert_eq!(parts as usize, expect, "row {row}");
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
            // Runs of segments cover the same keys with fewer items, longest first.
            for run in [2, 3, MAX_DECODE_RUN] {
                let mut joined = plan.clone();
                joined.join_decode_runs(run);
                check_coverage(cu, ctx, group, &joined);
                assert!(joined.decode.windows(2).all(|w| w[0][3] >= w[1][3]));
                assert_eq!(
                    (&joined.rows, joined.scratch_rows),
                    (&plan.rows, plan.scratch_rows)
                );
            }
        }
    }
}

#[test]
fn work_plans_cut_keys_into_the_canonical_segments_without_a_gpu() {
    // One 131k decode row: 256 segments of 512 keys, one warp each, whatever the GPU.
    for sms in [1, 132, 1000] {
        let one = WorkPlan::build(&[0, 1], &[131_072], 8, 1, sms, None).unwrap();
        assert_eq!(one.segment_keys, SEGMENT_KEYS);
        assert_eq!(one.decode.len(), 256);
        assert_eq!(one.scratch_rows, 256);
    }
    // 256 rows of 32k: the same segments (never chosen from the batch).
    let cu: Vec<u32> = (0..=256).collect();
    let many = WorkPlan::build(&cu, &[32_768; 256], 8, 1, 132, None).unwrap();
    assert_eq!(many.segment_keys, SEGMENT_KEYS);
    assert_eq!(many.decode.len(), 256 * 64);
    assert!(many.decode.windows(2).all(|w| w[0][3] >= w[1][3]));
    // A long prefill chunk is parallel enough on its own: folded in the kernel, no scratch.
    let chunk = WorkPlan::build(&[0, 8192], &[131_072], 8, 4, 132, None).unwrap();
    assert_eq!(chunk.scratch_rows, 0);
    assert!(chunk.decode.is_empty() && chunk.prefill.len() == 8192 * 8 / PREFILL_BLOCK_M);
    assert!(chunk.prefill.iter().all(|item| item[2] == -1));
    // A short chunk over a long history would be a handful of blocks: split per segment.
    let short = WorkPlan::build(&[0, 20], &[3000], 4, 1, 132, None).unwrap();
    assert_eq!(short.prefill.len(), 2 * 3000usize.div_ceil(SEGMENT_KEYS));
    assert!(short.prefill.iter().all(|item| item[2] >= 0));
    assert_eq!(short.split_rows.len(), 20);
    assert!(WorkPlan::build(&[0, 2], &[1], 1, 1, 132, None).is_err());
    assert!(WorkPlan::build(&[0, 1], &[10], 1, 1, 132, Some(100)).is_err());
}

#[test]
fn paged_kernels_fit_hopper_shared_memory_without_a_gpu() {
    for hd in [16, 32, 64, 128] {
        for prefill in [false, true] {
            let v = attention_variant(hd, prefill, SM90_SMEM).unwrap();
            assert!(v.smem as usize + 1024 <= SM90_SMEM, "{v:?}");
        }
    }
    let decode = attention_variant(128, false, SM90_SMEM).unwrap();
    assert_eq!(
        (decode.smem, decode.warps, decode.items_per_block),
        (83_200, 4, 1)
    );
    assert_eq!(decode.name, "paged_attn_decode_split_hd128");
    let one_warp = warp_per_item_decode_variant(128, SM90_SMEM).unwrap();
    assert_eq!(
        (one_warp.smem, one_warp.warps, one_warp.items_per_block),
        (147_968, 2, 2)
    );
    let prefill = attention_variant(128, true, SM90_SMEM).unwrap();
    assert_eq!((prefill.smem, prefill.warps), (119_808, 4));
    assert!(attention_variant(80, false, SM90_SMEM).is_err());
}

/// Runs of segments per decode block (issue 36): a lone short row keeps a block per segment, a
/// lone long row becomes one wave of runs, many rows a block per row; deeper rings hold fewer
/// blocks per SM. Each plan still covers every key once.
#[test]
fn decode_runs_fill_the_gpu_without_a_gpu() {
    let s2 = split_decode_variant(128, 2, SM90_SMEM).unwrap();
    let s3 = split_decode_variant(128, 3, SM90_SMEM).unwrap();
    let s4 = split_decode_variant(128, 4, SM90_SMEM).unwrap();
    assert_eq!((s2.smem, s3.smem, s4.smem), (83_200, 118_016, 152_832));
    assert_eq!(s4.name, "paged_attn_decode_split_hd128_s4");
    let per_sm = |v: &AttentionVariant, limit| decode_blocks_per_sm(v, limit);
    assert_eq!((per_sm(&s2, SM90_SMEM), per_sm(&s3, SM90_SMEM)), (2, 1));
    assert_eq!(per_sm(&s2, SM80_SMEM), 1);
    assert!(split_decode_variant(128, 4, SM89_SMEM).is_err());
    assert!(split_decode_variant(32, 3, SM90_SMEM).is_err());
    // (rows, context, expected run) with 7 query heads per kv head, 4 kv heads, 264 slots.
    for (rows, context, expect) in [
        (1, 4096, 1),
        (1, 32_768, 1),
        (1, 131_072, 4),
        (8, 131_072, 16),
        (128, 4096, 16), // every run the whole row (8 segments)
    ] {
        let cu: Vec<u32> = (0..=rows).collect();
        let ctx = vec![context; rows as usize];
        let plan = WorkPlan::build(&cu, &ctx, 7, 4, 132, None).unwrap();
        let run = plan.decode_run_for(4, 264);
        assert_eq!(run, expect, "{rows} x {context}");
        let mut joined = plan.clone();
        joined.join_decode_runs(run);
        let segments = (context as usize).div_ceil(SEGMENT_KEYS);
        assert_eq!(
            joined.decode.len(),
            rows as usize * segments.div_ceil(run.min(segments))
        );
        check_coverage(&cu, &ctx, 7, &joined);
    }
}

/// On sm_86 / sm_89 (99 KiB per block) the hd128 prefill runs with fewer warps per block (the
/// same per-warp arithmetic, so the same bits), and so does the earlier one-warp-per-item decode
/// at hd128 and hd64; the split decode kernel and every other kernel fit every sm_80+ GPU as they
/// are.
#[test]
fn paged_kernel_variants_fit_each_gpus_shared_memory_without_a_gpu() {
    for limit in [SM90_SMEM, SM80_SMEM, SM89_SMEM] {
        for hd in [16, 32, 64, 128] {
            for prefill in [false, true] {
                let v = attention_variant(hd, prefill, limit).unwrap();
                assert!(v.smem as usize <= limit, "{v:?} at {limit}");
                let small = limit == SM89_SMEM && hd == 128 && prefill;
                assert_eq!(v.name.ends_with("_small"), small, "{v:?} at {limit}");
                if !small {
                    assert_eq!(v, attention_variant(hd, prefill, SM90_SMEM).unwrap());
                }
            }
            let v = warp_per_item_decode_variant(hd, limit).unwrap();
            assert!(v.smem as usize <= limit, "{v:?} at {limit}");
            let small = limit == SM89_SMEM && (hd == 128 || hd == 64);
            assert_eq!(v.name.ends_with("_small"), small, "{v:?} at {limit}");
        }
    }
    assert_eq!(
        warp_per_item_decode_variant(128, SM89_SMEM).unwrap(),
        AttentionVariant {
            name: "paged_attn_decode_hd128_small".into(),
            smem: 73_984,
            warps: 1,
            items_per_block: 1,
            stages: 2,
        }
    );
    let err = attention_variant(128, false, 64 * 1024).unwrap_err();
    assert!(
        format!("{err}")
            .contains("needs 83200 B of shared memory per block; this GPU allows 65536 B"),
        "{err}"
    );
}
