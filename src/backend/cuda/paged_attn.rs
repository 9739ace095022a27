//! Launches of `kernels/paged_attn.cu`: K/V writes into the paged cache and attention of a step's
//! query rows over block tables, in the canonical reduction order of `kernels/attn_tile.cuh`.
//!
//! The attention is cut into work items on the host ([`WorkPlan`]): each sequence's flat rows
//! (query row x query head of a kv head's group) in tiles, each decode tile's keys in the
//! canonical segments of [`SEGMENT_KEYS`] (one block of up to 4 warps each, so a lone 131k-token
//! decode row still fills the GPU). Rows whose context spans several segments leave one fp32 partial per segment
//! in a pooled scratch buffer, folded left to right by a second kernel. Prefill tiles walk all
//! their keys in one block and fold in the kernel, unless they are too few to fill the GPU: then
//! they are split per segment like decode. Either way every row gets the same bits.
//!
//! ```text
//!  sequence s, kv head g:   keys 0 ............................................ p_last
//!  tile of flat rows  ──►   [ segment 0   ][ segment 1   ][ segment 2   ][ ... ]    (512 keys each)
//!  decode:                    block          block          block      (items of one kv head)
//!  row r (position p):      partials 0 ..= p / 512 ──► merge (fold in order) ──► out[r]
//!                           (p < 512: one segment, written straight to out, no merge)
//! ```

pub use super::paged_plan::{WorkPlan, DECODE_BLOCK_M, KEY_TILE, PREFILL_BLOCK_M, SEGMENT_KEYS};
use super::tensor::{BufferPool, CudaTensor, DeviceDType, DeviceUpload};
use super::{as_i32, grid_stride_config, CudaDevice};
use crate::backend::PagedLayout;
use anyhow::{bail, ensure, Context, Result};
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{LaunchConfig, PushKernelArg};
use std::sync::{Arc, Mutex};

const MERGE_THREADS: u32 = 128;

/// Mirrors `PagedDecodeConfig` / `PagedPrefillConfig` in the kernel: the dynamic shared memory of
/// one variant with `warps` warps and a `stages`-deep ring.
fn smem_bytes(head_dim: usize, prefill: bool, warps: usize, stages: usize) -> u32 {
    let stride = head_dim + 8;
    let tile = KEY_TILE * stride;
    let bytes = if prefill {
        (16 * warps * stride + stages * 2 * tile) * 2 + 32 * warps * (head_dim / 2) * 4
    } else {
        warps * (16 * stride + stages * 2 * tile) * 2
    };
    bytes as u32
}

/// Mirrors `PagedDecodeSplitConfig`: Q, the ring and two fp32 score tiles of 16 x (64 + 8).
fn split_smem_bytes(head_dim: usize, stages: usize) -> u32 {
    let stride = head_dim + 8;
    ((16 * stride + stages * 2 * KEY_TILE * stride) * 2 + 2 * 16 * (KEY_TILE + 8) * 4) as u32
}

/// Warps of one decode item in `paged_decode_split` (`PagedDecodeSplit`): a 16-column slice of
/// the head dim and 16 keys of each tile per warp, at most 4.
pub fn split_decode_warps(head_dim: usize) -> usize {
    (head_dim / 16).min(4)
}

/// One compiled configuration of an attention kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttentionVariant {
    pub name: String,
    /// Dynamic shared memory per block.
    pub smem: u32,
    /// Warps per block.
    pub warps: usize,
    /// Work items per block: `warps` for the one-warp-per-item decode kernel, else 1.
    pub items_per_block: usize,
    /// Depth of its cp.async ring of K/V tiles.
    pub stages: usize,
}

/// The shared-memory opt-in limit of the smallest GPUs the compute_80 PTX runs on (sm_86, sm_89:
/// 99 KiB); sm_80 allows 163 KiB, sm_90 227 KiB.
pub const SMALLEST_SMEM_OPTIN: usize = 101_376;

/// The decode (`prefill == false`) or prefill kernel for `head_dim`: the configuration with the
/// most warps whose shared memory fits `smem_limit` (the device's opt-in limit per block). Decode
/// runs `paged_decode_split` (a block of up to 4 warps per item, 83 KB at hd128: every sm_80+ GPU);
/// the prefill's `_small` variants (fewer warps) are for GPUs with 99 KiB. Every variant runs the
/// same per-element arithmetic, so the choice never changes a bit.
pub fn attention_variant(
    head_dim: usize,
    prefill: bool,
    smem_limit: usize,
) -> Result<AttentionVariant> {
    choose_variant(head_dim, prefill, None, smem_limit)
}

/// Ring depths `paged_decode_split` is compiled with for `head_dim` (`_s3`, `_s4` beside the
/// 2-stage kernel at the Qwen2.5 head dims 64 and 128).
pub fn split_decode_stages(head_dim: usize) -> &'static [usize] {
    if head_dim >= 64 {
        &[2, 3, 4]
    } else {
        &[2]
    }
}

/// The ring depth decode runs with by default where it fits (else 2).
pub const DEFAULT_DECODE_STAGES: usize = 2;

/// `paged_decode_split` with a `stages`-deep ring (one of [`split_decode_stages`]), for
/// benchmarks and tests to compare: the same bits at every depth.
pub fn split_decode_variant(
    head_dim: usize,
    stages: usize,
    smem_limit: usize,
) -> Result<AttentionVariant> {
    ensure!(
        split_decode_stages(head_dim).contains(&stages),
        "paged attention: no {stages}-stage decode kernel for head_dim {head_dim} (stages {:?})",
        split_decode_stages(head_dim)
    );
    choose_variant(head_dim, false, Some((false, stages)), smem_limit)
}

/// Decode blocks one SM holds at once for `variant` (its shared memory against the SM's,
/// which is the opt-in limit plus the 1 KiB the driver keeps per block; at most 2, the split
/// kernel's launch bound): what [`WorkPlan::decode_run_for`] fills.
pub fn decode_blocks_per_sm(variant: &AttentionVariant, smem_limit: usize) -> usize {
    ((smem_limit + 1024) / (variant.smem as usize + 1024)).clamp(1, 2)
}

/// The earlier decode kernel, `paged_decode` (one warp per item, `warps` items per block; its
/// `_small` variants for 99 KiB GPUs), kept to compare against ([`DevicePagedLayout`]'s
/// `decode_warp_per_item`): the same bits as [`attention_variant`]'s.
pub fn warp_per_item_decode_variant(
    head_dim: usize,
    smem_limit: usize,
) -> Result<AttentionVariant> {
    choose_variant(head_dim, false, Some((true, 2)), smem_limit)
}

/// `decode`: `None` for the defaults, else (one warp per item?, split kernel's stages).
fn choose_variant(
    head_dim: usize,
    prefill: bool,
    decode: Option<(bool, usize)>,
    smem_limit: usize,
) -> Result<AttentionVariant> {
    let (warp_per_item, forced_stages) = match decode {
        Some((warp_per_item, stages)) => (warp_per_item, Some(stages)),
        None => (false, None),
    };
    if ![16, 32, 64, 128].contains(&head_dim) {
        bail!("paged attention: head_dim {head_dim} has no kernel (16, 32, 64, 128)");
    }
    let kind = if prefill { "prefill" } else { "decode" };
    // (name suffix, warps, items per block), most warps first: `PagedDecodeSplit`, `PagedDecode`,
    // `PagedDecodeSmall`, `PagedPrefill` and `PagedPrefillSmall` in the kernel (2 stages each).
    let split = split_decode_warps(head_dim);
    // The split kernel's ring depths to try, deepest wanted first: forced, or the default
    // (where compiled) then 2.
    let split_stages = match forced_stages {
        Some(stages) => vec![stages],
        None if split_decode_stages(head_dim).contains(&DEFAULT_DECODE_STAGES) => {
            vec![DEFAULT_DECODE_STAGES, 2]
        }
        None => vec![2],
    };
    let candidates: Vec<(&str, usize, usize)> = match (prefill, head_dim) {
        (true, 128) => vec![("", 4, 1), ("_small", 2, 1)],
        (true, _) => vec![("", 4, 1)],
        (false, _) if !warp_per_item => {
            split_stages.iter().map(|&s| ("split_", split, s)).collect()
        }
        (false, 128) => vec![("", 2, 2), ("_small", 1, 1)],
        (false, 64) => vec![("", 4, 4), ("_small", 2, 2)],
        (false, _) => vec![("", 4, 4)],
    };
    let variants = candidates
        .into_iter()
        .map(|(tag, warps, third)| {
            // The split kernel's third field is its ring depth (one item per block).
            let (items_per_block, stages) = if tag == "split_" {
                (1, third)
            } else {
                (third, 2)
            };
            let (name, smem) = match tag {
                "split_" => (
                    match third {
                        2 => format!("paged_attn_decode_split_hd{head_dim}"),
                        stages => format!("paged_attn_decode_split_hd{head_dim}_s{stages}"),
                    },
                    split_smem_bytes(head_dim, third),
                ),
                suffix => (
                    format!("paged_attn_{kind}_hd{head_dim}{suffix}"),
                    smem_bytes(head_dim, prefill, warps, 2),
                ),
            };
            AttentionVariant {
                name,
                smem,
                warps,
                items_per_block,
                stages,
            }
        })
        .collect::<Vec<_>>();
    let smallest = variants.iter().map(|v| v.smem).min().unwrap_or(0);
    variants
        .into_iter()
        .find(|v| v.smem as usize <= smem_limit)
        .ok_or_else(|| {
            anyhow::anyhow!(
                "paged attention: the {kind} kernel for head_dim {head_dim} needs {smallest} B of \
                 shared memory per block; this GPU allows {smem_limit} B"
            )
        })
}

/// A [`WorkPlan`] on the device, with what it was built for.
struct DevicePlan {
    /// (group, kv_heads, forced segment keys, decode blocks resident at once for the runs).
    key: (usize, usize, Option<usize>, Option<usize>),
    /// A CUDA graph's plan, fixed at capture: used for every call of its `(group, kv_heads)`.
    fixed: bool,
    plan: WorkPlan,
    tensor: CudaTensor,
}

/// A [`PagedLayout`] copied to the device.
pub struct DevicePagedLayout {
    pub block_size: usize,
    pub num_seqs: usize,
    pub num_query_rows: usize,
    pub max_blocks_per_seq: usize,
    pub max_context: usize,
    pub max_query_rows: usize,
    /// i32 [num_seqs + 1]
    pub cu_query: CudaTensor,
    /// i32 [num_seqs]
    pub context_lens: CudaTensor,
    /// i32 [num_seqs, max_blocks_per_seq]
    pub block_tables: CudaTensor,
    /// Keys per segment; `None` (what [`Self::upload`] sets): [`SEGMENT_KEYS`]. Tests force small
    /// segments to exercise the merge on short contexts (the bits then differ from the
    /// trainer's, which always uses [`SEGMENT_KEYS`]).
    pub segment_keys: Option<usize>,
    /// The shared memory per block the kernel variants are chosen for; `None` (what
    /// [`Self::upload`] sets): the device's opt-in limit. Tests force a smaller one to run the
    /// fallback variants a GPU with less shared memory would.
    pub smem_limit: Option<usize>,
    /// Decode with the earlier one-warp-per-item kernel ([`warp_per_item_decode_variant`])
    /// instead of `paged_decode_split`: the same bits, for benchmarks and tests to compare.
    pub decode_warp_per_item: bool,
    /// The split decode kernel's ring depth; `None`: [`DEFAULT_DECODE_STAGES`] where it fits.
    pub decode_stages: Option<usize>,
    /// Segments per decode block ([`WorkPlan::join_decode_runs`]); `None`: chosen for the GPU
    /// ([`WorkPlan::decode_run_for`]). Never changes a bit.
    pub decode_run: Option<usize>,
    /// Host copies the work plan is built from.
    host_cu_query: Vec<u32>,
    host_context_lens: Vec<u32>,
    /// The largest block id in the tables (checked against the cache at each call).
    max_block_id: usize,
    /// The last plan built: every layer of a step shares it.
    plan: Mutex<Option<Arc<DevicePlan>>>,
}

impl DevicePagedLayout {
    pub fn upload(backend: &impl DeviceUpload, layout: &PagedLayout) -> Result<Self> {
        // Structure only; block ids are checked against the cache in `paged_attention`.
        layout.check(usize::MAX)?;
        let to_i32 = |v: &[u32]| -> Result<Vec<i32>> {
            v.iter()
                .map(|&x| as_i32("paged layout entry", x as usize))
                .collect()
        };
        let n = layout.num_seqs();
        Ok(Self {
            block_size: layout.block_size,
            num_seqs: n,
            num_query_rows: layout.num_query_rows(),
            max_blocks_per_seq: layout.max_blocks_per_seq,
            max_context: layout.context_lens.iter().copied().max().unwrap_or(0) as usize,
            max_query_rows: layout
                .cu_query
                .windows(2)
                .map(|w| (w[1] - w[0]) as usize)
                .max()
                .unwrap_or(0),
            cu_query: backend.upload_pod(&to_i32(&layout.cu_query)?, &[n + 1], DeviceDType::I32)?,
            context_lens: backend.upload_pod(
                &to_i32(&layout.context_lens)?,
                &[n],
                DeviceDType::I32,
            )?,
            block_tables: backend.upload_pod(
                &to_i32(&layout.block_tables)?,
                &[n, layout.max_blocks_per_seq],
                DeviceDType::I32,
            )?,
            segment_keys: None,
            smem_limit: None,
            decode_warp_per_item: false,
            decode_stages: None,
            decode_run: None,
            host_cu_query: layout.cu_query.clone(),
            host_context_lens: layout.context_lens.clone(),
            max_block_id: layout.block_tables.iter().copied().max().unwrap_or(0) as usize,
            plan: Mutex::new(None),
        })
    }

    /// A layout whose arrays and work plan live in a CUDA graph's static buffers
    /// (`cuda/graphs.rs`): `num_seqs` decode rows, one per sequence, tables of
    /// `max_blocks_per_seq`, and a fixed plan (`plan_tensor` holds its items, rows and split rows,
    /// the rows rewritten before each replay). Block ids are checked by the graph runner when it
    /// writes the tables.
    #[allow(clippy::too_many_arguments)]
    pub fn for_graph(
        block_size: usize,
        max_blocks_per_seq: usize,
        cu_query: CudaTensor,
        context_lens: CudaTensor,
        block_tables: CudaTensor,
        group: usize,
        kv_heads: usize,
        plan: WorkPlan,
        plan_tensor: CudaTensor,
    ) -> Self {
        let num_seqs = context_lens.len();
        let segment_keys = plan.segment_keys;
        let device_plan = DevicePlan {
            key: (group, kv_heads, Some(segment_keys), None),
            fixed: true,
            plan,
            tensor: plan_tensor,
        };
        Self {
            block_size,
            num_seqs,
            num_query_rows: num_seqs,
            max_blocks_per_seq,
            max_context: max_blocks_per_seq * block_size,
            max_query_rows: 1,
            cu_query,
            context_lens,
            block_tables,
            segment_keys: Some(segment_keys),
            smem_limit: None,
            decode_warp_per_item: false,
            decode_stages: None,
            decode_run: None,
            host_cu_query: Vec::new(),
            host_context_lens: Vec::new(),
            max_block_id: 0,
            plan: Mutex::new(Some(Arc::new(device_plan))),
        }
    }

    /// The work plan for `(group, kv_heads)` on `device`, built and uploaded once.
    /// `decode_slots`: decode blocks the GPU holds at once, for the split kernel's runs (`None`:
    /// one segment per item, the one-warp kernel).
    fn plan(
        &self,
        device: &CudaDevice,
        group: usize,
        kv_heads: usize,
        decode_slots: Option<usize>,
        pool: &BufferPool,
    ) -> Result<Arc<DevicePlan>> {
        let key = (group, kv_heads, self.segment_keys, decode_slots);
        let mut cached = self.plan.lock().expect("paged plan lock poisoned");
        let fits = |p: &&Arc<DevicePlan>| {
            p.key == key || (p.fixed && p.key.0 == group && p.key.1 == kv_heads)
        };
        if let Some(p) = cached.as_ref().filter(fits) {
            return Ok(p.clone());
        }
        let mut plan = WorkPlan::build(
            &self.host_cu_query,
            &self.host_context_lens,
            group,
            kv_heads,
            device.num_sms as usize,
            self.segment_keys,
        )?;
        if let Some(slots) = decode_slots {
            let run = (self.decode_run).unwrap_or_else(|| plan.decode_run_for(kv_heads, slots));
            plan.join_decode_runs(run);
        }
        // One upload: decode items, prefill items (int4), rows (int2), split rows (int).
        let flat: Vec<i32> = (plan.decode.iter().chain(&plan.prefill).flatten())
            .chain(plan.rows.iter().flatten())
            .chain(&plan.split_rows)
            .copied()
            .collect();
        let tensor = pool.alloc(&[flat.len().max(1)], DeviceDType::I32)?;
        if !flat.is_empty() {
            // SAFETY: the tensor holds at least `flat.len()` i32; a copy from pageable memory has
            // staged the source before the call returns.
            unsafe {
                cudarc::driver::result::memcpy_htod_async(
                    tensor.ptr(),
                    bytemuck::cast_slice::<i32, u8>(&flat),
                    device.stream.cu_stream(),
                )
            }
            .context("copying the paged-attention plan to the GPU")?;
        }
        let p = Arc::new(DevicePlan {
            key,
            fixed: false,
            plan,
            tensor,
        });
        *cached = Some(p.clone());
        Ok(p)
    }
}

/// Checks the dtype of each named tensor.
fn expect_dtypes(op: &str, dtype: DeviceDType, tensors: &[(&str, &CudaTensor)]) -> Result<()> {
    for (what, t) in tensors {
        ensure!(
            t.dtype() == dtype,
            "{op}: {what} is {:?}, expected {dtype:?}",
            t.dtype()
        );
    }
    Ok(())
}

impl CudaDevice {
    /// Writes each row's K and V into its cache slot: `k, v [T, kv_heads, hd]` bf16,
    /// `slot_mapping [T]` u32, caches `[num_blocks, block_size, kv_heads, hd]` bf16. Slots outside
    /// the cache are skipped by the kernel (the caller checks them on the host).
    pub fn write_kv(
        &self,
        k: &CudaTensor,
        v: &CudaTensor,
        slot_mapping: &CudaTensor,
        k_cache: &mut CudaTensor,
        v_cache: &mut CudaTensor,
    ) -> Result<()> {
        let tensors = [
            ("k", k),
            ("v", v),
            ("k_cache", &*k_cache),
            ("v_cache", &*v_cache),
        ];
        expect_dtypes("write_kv", DeviceDType::Bf16, &tensors)?;
        expect_dtypes(
            "write_kv",
            DeviceDType::U32,
            &[("slot_mapping", slot_mapping)],
        )?;
        let rows = slot_mapping.len();
        if rows == 0 && k.is_empty() && v.is_empty() {
            return Ok(());
        }
        ensure!(
            rows > 0 && k.len().is_multiple_of(rows) && v.len() == k.len(),
            "write_kv: k {:?}, v {:?} for {rows} slots",
            k.shape(),
            v.shape()
        );
        let row_elems = k.len() / rows;
        ensure!(
            row_elems.is_multiple_of(8),
            "write_kv: rows of {row_elems} elements are not whole 16-byte vectors"
        );
        let cache_shape = k_cache.shape();
        ensure!(
            v_cache.shape() == cache_shape
                && cache_shape.len() == 4
                && cache_shape[2] * cache_shape[3] == row_elems,
            "write_kv: caches {cache_shape:?} and {:?} for rows of {row_elems} (k {:?})",
            v_cache.shape(),
            k.shape()
        );
        let num_slots = cache_shape[0] * cache_shape[1];
        let ints = [
            as_i32("write_kv rows", rows)?,
            as_i32("write_kv row elements", row_elems)?,
            as_i32("write_kv cache slots", num_slots)?,
        ];
        let pointers = [
            k_cache.ptr(),
            v_cache.ptr(),
            k.ptr(),
            v.ptr(),
            slot_mapping.ptr(),
        ];
        let f = self.function("paged_attn", "write_kv_bf16")?;
        let cfg = grid_stride_config(self, rows * (row_elems / 8), 256);
        let mut launch = self.stream.launch_builder(&f);
        for p in &pointers {
            launch.arg(p);
        }
        for i in &ints {
            launch.arg(i);
        }
        // SAFETY: argument order and types match the kernel; sizes checked above.
        unsafe { launch.launch(cfg) }?;
        Ok(())
    }

    /// Attention of the layout's query rows over their cached contexts: `q, out [rows, heads,
    /// hd]` bf16, caches `[num_blocks, block_size, kv_heads, hd]` bf16. Scratch for split rows
    /// comes from `pool`.
    #[allow(clippy::too_many_arguments)]
    pub fn paged_attention(
        &self,
        q: &CudaTensor,
        k_cache: &CudaTensor,
        v_cache: &CudaTensor,
        layout: &DevicePagedLayout,
        softmax_scale: f32,
        out: &mut CudaTensor,
        pool: &BufferPool,
    ) -> Result<()> {
        let shape = check_paged_attention(q, k_cache, v_cache, layout, out)?;
        let (rows, heads, head_dim, kv_heads) =
            (shape.rows, shape.heads, shape.head_dim, shape.kv_heads);
        let kernels = self.paged_kernels(layout, head_dim)?;
        as_i32("max context", layout.max_context)?;
        as_i32("query rows x heads", rows * heads)?;
        let decode_slots = (!layout.decode_warp_per_item).then(|| {
            self.num_sms as usize * decode_blocks_per_sm(&kernels.decode, kernels.smem_limit)
        });
        let device_plan = layout.plan(self, heads / kv_heads, kv_heads, decode_slots, pool)?;
        let plan = &device_plan.plan;
        ensure!(
            plan.rows.len() == rows,
            "paged_attention: the layout's plan has {} rows, q {rows}",
            plan.rows.len()
        );
        let operands = [q, k_cache, v_cache, &*out];
        let (args, scratch) = paged_args(operands, layout, &shape, &device_plan, pool)?;
        // One launch per kernel with work: a block runs `items_per_block` items (the one-warp
        // decode kernel: one per warp; the others: one); each for one kv head, into `out` (rows finished there) or the
        // scratch (partials of split rows).
        let (decode_items, prefill_items, row_plan, _) = args.plan_parts(plan);
        for (variant, items, count, per_block) in [
            (
                &kernels.decode,
                decode_items,
                plan.decode.len(),
                kernels.decode.items_per_block,
            ),
            (&kernels.prefill, prefill_items, plan.prefill.len(), 1),
        ] {
            if count == 0 {
                continue;
            }
            let (name, smem) = (&variant.name, variant.smem);
            let f = self.function_with_smem("paged_attn", name, smem)?;
            let blocks = count.div_ceil(per_block) * kv_heads;
            let cfg = LaunchConfig {
                grid_dim: (as_i32("paged attention blocks", blocks)? as u32, 1, 1),
                block_dim: (32 * variant.warps as u32, 1, 1),
                shared_mem_bytes: smem,
            };
            let num_items = as_i32("paged attention items", count)?;
            let mut launch = self.stream.launch_builder(&f);
            for p in &args.pointers {
                launch.arg(p);
            }
            launch.arg(&items).arg(&num_items).arg(&row_plan);
            for i in &args.ints {
                launch.arg(i);
            }
            launch.arg(&softmax_scale);
            // SAFETY: argument order and types match the kernel; sizes and block ids checked
            // above; the plan's items address rows and keys inside the layout.
            unsafe { launch.launch(cfg) }?;
        }
        self.launch_paged_merge(&kernels.merge, &args, plan, heads, softmax_scale)?;
        // The scratch returns to the pool; its next user runs after these kernels (one stream).
        drop(scratch);
        Ok(())
    }

    /// The kernels for `head_dim`, all chosen up front: a head dim without kernels, or a GPU
    /// without the shared memory for them, fails before any work.
    fn paged_kernels(&self, layout: &DevicePagedLayout, head_dim: usize) -> Result<PagedKernels> {
        let smem_limit = match layout.smem_limit {
            Some(limit) => limit,
            None => self.max_shared_memory_per_block_optin()?,
        };
        Ok(PagedKernels {
            decode: match (layout.decode_warp_per_item, layout.decode_stages) {
                (true, _) => warp_per_item_decode_variant(head_dim, smem_limit)?,
                (false, Some(stages)) => split_decode_variant(head_dim, stages, smem_limit)?,
                (false, None) => attention_variant(head_dim, false, smem_limit)?,
            },
            smem_limit,
            prefill: attention_variant(head_dim, true, smem_limit)?,
            merge: format!("paged_attn_merge_hd{head_dim}"),
        })
    }

    /// Folds the segments of each split row from the scratch into `out`.
    fn launch_paged_merge(
        &self,
        kernel: &str,
        args: &PagedArgs,
        plan: &WorkPlan,
        heads: usize,
        softmax_scale: f32,
    ) -> Result<()> {
        if plan.split_rows.is_empty() {
            return Ok(());
        }
        let (_, _, row_plan, split_rows) = args.plan_parts(plan);
        let f = self.function("paged_attn", kernel)?;
        let blocks = as_i32("merge blocks", plan.split_rows.len() * heads)? as u32;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (MERGE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut launch = self.stream.launch_builder(&f);
        launch
            .arg(&args.pointers[3])
            .arg(&args.pointers[4])
            .arg(&args.pointers[5])
            .arg(&row_plan)
            .arg(&split_rows)
            .arg(&args.ints[2])
            .arg(&softmax_scale);
        // SAFETY: argument order and types match the kernel; every split row's segments were
        // written by the launches above (same stream).
        unsafe { launch.launch(cfg) }?;
        Ok(())
    }
}

/// The kernels of one paged-attention call: the decode and prefill attention variants and the
/// merge of split rows.
struct PagedKernels {
    decode: AttentionVariant,
    /// The shared memory per block the variants were chosen for.
    smem_limit: usize,
    prefill: AttentionVariant,
    merge: String,
}

/// The checked geometry of one paged-attention call.
struct PagedShape {
    rows: usize,
    heads: usize,
    head_dim: usize,
    kv_heads: usize,
}

/// Checks dtypes, `q`/`out` against the layout's rows, the caches against its blocks and the
/// GQA ratio, and every block id in the tables against the cache.
fn check_paged_attention(
    q: &CudaTensor,
    k_cache: &CudaTensor,
    v_cache: &CudaTensor,
    layout: &DevicePagedLayout,
    out: &CudaTensor,
) -> Result<PagedShape> {
    let op = "paged_attention";
    let tensors = [
        ("q", q),
        ("k_cache", k_cache),
        ("v_cache", v_cache),
        ("out", out),
    ];
    expect_dtypes(op, DeviceDType::Bf16, &tensors)?;
    let tables = [
        ("cu_query", &layout.cu_query),
        ("context_lens", &layout.context_lens),
        ("block_tables", &layout.block_tables),
    ];
    expect_dtypes(op, DeviceDType::I32, &tables)?;
    let rows = layout.num_query_rows;
    let head_dim = q.cols();
    ensure!(
        rows > 0
            && q.shape().first() == Some(&rows)
            && q.len().is_multiple_of(rows * head_dim)
            && out.shape() == q.shape(),
        "{op}: q {:?}, out {:?} for {rows} query rows",
        q.shape(),
        out.shape()
    );
    let heads = q.len() / (rows * head_dim);
    let cache = k_cache.shape();
    ensure!(
        v_cache.shape() == cache && cache.len() == 4 && cache[1] == layout.block_size,
        "{op}: caches {cache:?} and {:?} for blocks of {}",
        v_cache.shape(),
        layout.block_size
    );
    let (num_blocks, kv_heads) = (cache[0], cache[2]);
    ensure!(
        cache[3] == head_dim && kv_heads > 0 && heads.is_multiple_of(kv_heads),
        "{op}: {heads} query heads of {head_dim} over a cache {cache:?}"
    );
    ensure!(
        layout.max_block_id < num_blocks,
        "{op}: block {} in the tables of a cache of {num_blocks} blocks",
        layout.max_block_id
    );
    Ok(PagedShape {
        rows,
        heads,
        head_dim,
        kv_heads,
    })
}

/// The arguments the paged-attention kernels share.
struct PagedArgs {
    /// q, k_cache, v_cache, out, part_o, part_stats, cu_query, context_lens, block_tables.
    pointers: [CUdeviceptr; 9],
    /// max_blocks_per_seq, block_size, heads, kv_heads, segment_keys.
    ints: [i32; 5],
    /// The plan tensor: decode items, prefill items (int4), rows (int2), split rows (int).
    plan: CUdeviceptr,
}

/// The kernels' pointer and integer arguments for `[q, k_cache, v_cache, out]`, with the split
/// rows' scratch from `pool` (returned beside them: it must live until the kernels have run).
fn paged_args(
    [q, k_cache, v_cache, out]: [&CudaTensor; 4],
    layout: &DevicePagedLayout,
    shape: &PagedShape,
    device_plan: &DevicePlan,
    pool: &BufferPool,
) -> Result<(PagedArgs, Option<CudaTensor>)> {
    let (heads, head_dim, plan) = (shape.heads, shape.head_dim, &device_plan.plan);
    let ints = [
        as_i32("max_blocks_per_seq", layout.max_blocks_per_seq)?,
        as_i32("block_size", layout.block_size)?,
        as_i32("heads", heads)?,
        as_i32("kv_heads", shape.kv_heads)?,
        as_i32("segment_keys", plan.segment_keys)?,
    ];
    // Scratch: part_o [scratch_rows, heads, hd] then part_stats [scratch_rows, heads] (max, sum),
    // fp32.
    let scratch = match plan.scratch_rows {
        0 => None,
        n => Some(pool.alloc(&[n * heads * (head_dim + 2)], DeviceDType::F32)?),
    };
    let part_o = scratch.as_ref().map_or(0, |s| s.ptr());
    let args = PagedArgs {
        pointers: [
            q.ptr(),
            k_cache.ptr(),
            v_cache.ptr(),
            out.ptr(),
            part_o,
            part_o + (plan.scratch_rows * heads * head_dim * 4) as u64,
            layout.cu_query.ptr(),
            layout.context_lens.ptr(),
            layout.block_tables.ptr(),
        ],
        ints,
        plan: device_plan.tensor.ptr(),
    };
    Ok((args, scratch))
}

impl PagedArgs {
    /// Where the plan tensor's parts start: decode items, prefill items, rows, split rows.
    fn plan_parts(&self, plan: &WorkPlan) -> (CUdeviceptr, CUdeviceptr, CUdeviceptr, CUdeviceptr) {
        let decode_items = self.plan;
        let prefill_items = decode_items + 16 * plan.decode.len() as u64;
        let row_plan = prefill_items + 16 * plan.prefill.len() as u64;
        let split_rows = row_plan + 8 * plan.rows.len() as u64;
        (decode_items, prefill_items, row_plan, split_rows)
    }
}
