//! CUDA graphs for decode steps: a step in which every sequence adds one token replays a graph
//! captured once per (batch bucket, block-table capacity), so the ~15 launches per layer of a
//! small batch cost one graph launch instead of ~15 x layers kernel launches from the host.
//!
//! ```text
//!  step of B sequences, contexts <= C      bucket: B' = smallest of BATCH_BUCKETS >= B,
//!  (one query row each, every row          table capacity: T = next power of two >= C / block_size
//!   sampled on the device)
//!          │                                 graphs[(B', T, weights, KV cache)]
//!          ▼                                     │ missing: warm up eagerly on the graph's own
//!  pad to B' rows: token 0, position 0,          │ inputs, capture the same ops, replay once and
//!  context 1, slot 0 of the null block,          │ require the replay's bits == the eager run's
//!  greedy                                        ▼
//!          │            one host->device copy of the dynamic inputs, graph launch, 8 bytes x B'
//!          └──────────► back (token, logprob)
//! ```
//!
//! What a graph bakes in, and why it stays valid:
//! - **Inputs** live in one arena per graph (tokens, positions, slots, context lengths, block
//!   tables, the attention work plan, temperatures, uniform draws, and the output). The model code
//!   is the generic one: the step scope ([`crate::backend::Backend::begin_step`]) is pre-filled
//!   with these buffers for the host arrays passed in, so no op uploads anything. A host copy
//!   inside a capture is refused, which fails the capture rather than baking a stale input.
//! - **The attention plan** is fixed per graph: every sequence gets `ceil(T * block_size / P)`
//!   partitions of `P` keys; a partition past a sequence's context does nothing, and the merge
//!   skips rows that fit one partition. Only the per-row partition counts change between replays.
//! - **Intermediate buffers** come from the backend's graph pool, which eager work never uses; a
//!   graph's intermediates may be reused by another graph's, which is safe because replays run
//!   one at a time on one stream and read nothing a previous replay left behind.
//! - **Weights and the KV cache** (every layer's addresses, baked into the kernels' arguments)
//!   are covered by a generation counter in the key, not by their addresses (a new cache or model
//!   can reuse some of the old one's addresses and not others): every weight upload or in-place
//!   weight update, every KV cache allocation (`Qwen2Model::new_paged_kv`), release and restore
//!   ([`crate::backend::Backend::reset_graphs`]) starts a new generation and drops the graphs of
//!   the old one.

use super::backend::CudaBackend;
use super::paged_attn::{DevicePagedLayout, WorkPlan, DECODE_BLOCK_M, MIN_PARTITION_KEYS};
use super::tensor::{Arena, CudaTensor, DeviceDType};
use crate::backend::{PagedLayout, RowDraw};
use crate::model::{PagedKv, Qwen2Model};
use anyhow::{anyhow, ensure, Context, Result};
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::CudaGraph;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::atomic::Ordering;

/// Sequences per graph. A step of B sequences runs the smallest bucket >= B; larger steps run
/// eagerly (their launches are a small share of the step).
pub const BATCH_BUCKETS: [usize; 13] = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256];
/// Smallest block-table capacity of a graph (256 tokens at 16 per block); capacities double.
const MIN_TABLE_BLOCKS: usize = 16;
/// Blocks per SM the graph's partition size aims at (as the eager plan's).
const BLOCKS_PER_SM_TARGET: usize = 4;

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
struct GraphKey {
    batch: usize,
    table_blocks: usize,
    /// [`DecodeGraphs::generation`] at capture: the weights and KV cache the graph bakes in.
    generation: u64,
}

/// The decode graphs of one backend.
#[derive(Default)]
pub struct DecodeGraphs {
    graphs: HashMap<GraphKey, DecodeGraph>,
    /// Why graphs are off, once a capture failed or disagreed with its eager run.
    disabled: Option<String>,
    pub captures: u64,
    pub replays: u64,
    /// Bumped whenever the memory graphs bake in may have changed: weights uploaded or
    /// overwritten, a KV cache allocated or released. A graph replays only in its own generation.
    generation: u64,
}

impl DecodeGraphs {
    pub fn clear(&mut self) {
        self.graphs.clear();
    }
    /// Starts a new generation: every graph captured so far is dropped.
    fn bump(&mut self) {
        self.generation += 1;
        self.graphs.clear();
    }
    pub fn disabled_reason(&self) -> Option<&str> {
        self.disabled.as_deref()
    }
}

/// A captured graph. SAFETY of `Send`: the executable graph is only launched on its stream, with
/// the backend's context bound (cudarc binds it), while the backend's graph lock is held.
struct SendGraph(CudaGraph);
unsafe impl Send for SendGraph {}

struct DecodeGraph {
    graph: SendGraph,
    inputs: StaticInputs,
    /// [`baked_addresses`] at capture: a second guard beside the generation (two caches alive at
    /// once, used in turn, are one generation).
    baked: Vec<u64>,
}

/// Every weight and KV-cache address a captured decode step bakes into its launches, and the
/// cache's size.
fn baked_addresses(model: &Qwen2Model<CudaBackend>, kv: &PagedKv<CudaTensor>) -> Vec<u64> {
    (model.params.iter().map(|t| t.ptr()))
        .chain(kv.layers.iter().flat_map(|(k, v)| [k.ptr(), v.ptr()]))
        .chain([kv.num_blocks as u64])
        .collect()
}

/// One graph's input and output buffers, views of one arena. The dynamic ones (everything but
/// `cu_query` and `out`) are contiguous from `tokens` on and rewritten by one copy per replay.
struct StaticInputs {
    batch: usize,
    table_blocks: usize,
    block_size: usize,
    partition_keys: usize,
    partitions: usize,
    /// Plan items (static) and rows (per step), as the plan tensor holds them.
    items: Vec<[i32; 4]>,
    tokens: CudaTensor,
    positions: CudaTensor,
    slots: CudaTensor,
    context_lens: CudaTensor,
    block_tables: CudaTensor,
    plan: CudaTensor,
    temperatures: CudaTensor,
    uniforms: CudaTensor,
    cu_query: CudaTensor,
    out: CudaTensor,
}

/// The host side of one step, padded to the graph's batch.
struct HostStep {
    tokens: Vec<u32>,
    positions: Vec<u32>,
    layout: PagedLayout,
    temperatures: Vec<f32>,
    uniforms: Vec<f64>,
    plan_rows: Vec<[i32; 2]>,
}

impl StaticInputs {
    fn new(
        backend: &CudaBackend,
        batch: usize,
        table_blocks: usize,
        block_size: usize,
        group: usize,
        kv_heads: usize,
        num_sms: usize,
    ) -> Result<Self> {
        let keys = table_blocks * block_size;
        let work = batch * keys * kv_heads;
        let target = num_sms.max(1) * BLOCKS_PER_SM_TARGET;
        let mut partition_keys = MIN_PARTITION_KEYS;
        while partition_keys < keys && 2 * partition_keys * target <= work {
            partition_keys *= 2;
        }
        let partitions = keys.div_ceil(partition_keys);
        let mut items = Vec::new();
        for s in 0..batch {
            for m0 in (0..group).step_by(DECODE_BLOCK_M) {
                for part in 0..partitions {
                    items.push([s, m0, part, partition_keys].map(|x| x as i32));
                }
            }
        }
        let plan_ints = 4 * items.len() + 2 * batch + batch;
        let shapes: [(&[usize], DeviceDType); 10] = [
            (&[batch], DeviceDType::U32),
            (&[batch], DeviceDType::U32),
            (&[batch], DeviceDType::U32),
            (&[batch], DeviceDType::I32),
            (&[batch, table_blocks], DeviceDType::I32),
            (&[plan_ints], DeviceDType::I32),
            (&[batch], DeviceDType::F32),
            (&[batch], DeviceDType::F64),
            (&[batch + 1], DeviceDType::I32),
            (&[batch, 2], DeviceDType::U32),
        ];
        let bytes = Arena::bytes_for(
            shapes
                .iter()
                .map(|(s, d)| s.iter().product::<usize>() * d.size()),
        );
        let mut arena = Arena::new(&backend.device.stream, bytes)?;
        let mut take = |i: usize| arena.take(shapes[i].0, shapes[i].1);
        let inputs = Self {
            batch,
            table_blocks,
            block_size,
            partition_keys,
            partitions,
            items,
            tokens: take(0)?,
            positions: take(1)?,
            slots: take(2)?,
            context_lens: take(3)?,
            block_tables: take(4)?,
            plan: take(5)?,
            temperatures: take(6)?,
            uniforms: take(7)?,
            cu_query: take(8)?,
            out: take(9)?,
        };
        let cu_query: Vec<i32> = (0..=batch as i32).collect();
        let mut cu = inputs.share(&inputs.cu_query)?;
        backend.write_bytes(&mut cu, bytemuck::cast_slice(&cu_query))?;
        Ok(inputs)
    }

    fn share(&self, t: &CudaTensor) -> Result<CudaTensor> {
        t.share()
            .ok_or_else(|| anyhow!("graph inputs must be arena views"))
    }

    /// The step's host arrays, padded to the graph's batch; errors name what does not fit.
    fn host_step(
        &self,
        tokens: &[u32],
        positions: &[u32],
        layout: &PagedLayout,
        draws: &[RowDraw],
        num_blocks: usize,
    ) -> Result<HostStep> {
        let (n, b, t) = (tokens.len(), self.batch, self.table_blocks);
        ensure!(
            n <= b && positions.len() == n && draws.len() == n && layout.num_seqs() == n,
            "decode graph of {b}: {n} tokens, {} positions, {} draws, {} sequences",
            positions.len(),
            draws.len(),
            layout.num_seqs()
        );
        ensure!(
            layout.block_size == self.block_size && layout.max_blocks_per_seq <= t,
            "decode graph: blocks of {} in tables of {} for a graph of {} x {t}",
            layout.block_size,
            layout.max_blocks_per_seq,
            self.block_size
        );
        let mut step = HostStep {
            tokens: tokens.to_vec(),
            positions: positions.to_vec(),
            layout: PagedLayout {
                block_size: self.block_size,
                cu_query: (0..=b as u32).collect(),
                context_lens: layout.context_lens.clone(),
                block_tables: Vec::with_capacity(b * t),
                max_blocks_per_seq: t,
                slot_mapping: layout.slot_mapping.clone(),
            },
            temperatures: draws.iter().map(|d| d.temperature).collect(),
            uniforms: draws.iter().map(|d| d.uniform).collect(),
            plan_rows: Vec::with_capacity(b),
        };
        // Replays run no op's host checks: every context must fit its table (the kernels read
        // entries up to its last key) and every block id the cache.
        layout.check(num_blocks).context("decode graph")?;
        for s in 0..n {
            let table = layout.block_table(s);
            step.layout.block_tables.extend_from_slice(table);
            step.layout
                .block_tables
                .extend(std::iter::repeat_n(0, t - table.len()));
        }
        // Padding rows: token 0 at position 0 of a one-token context in the null block, greedy.
        step.tokens.resize(b, 0);
        step.positions.resize(b, 0);
        step.layout.context_lens.resize(b, 1);
        step.layout.slot_mapping.resize(b, 0);
        step.layout.block_tables.resize(b * t, 0);
        step.temperatures.resize(b, 0.0);
        step.uniforms.resize(b, 0.0);
        for (s, &context) in step.layout.context_lens.iter().enumerate() {
            let parts = (context as usize).div_ceil(self.partition_keys).max(1);
            step.plan_rows
                .push([(s * self.partitions) as i32, parts as i32]);
        }
        Ok(step)
    }

    /// Writes a step's dynamic inputs with one host-to-device copy.
    fn write(&self, backend: &CudaBackend, step: &HostStep) -> Result<()> {
        let base = self.tokens.ptr();
        let end = self.uniforms.ptr() as usize + self.uniforms.num_bytes() - base as usize;
        let mut staging = vec![0u8; end];
        let mut put = |t: &CudaTensor, bytes: &[u8]| {
            let at = (t.ptr() - base) as usize;
            staging[at..at + bytes.len()].copy_from_slice(bytes);
        };
        let to_i32 = |v: &[u32]| v.iter().map(|&x| x as i32).collect::<Vec<i32>>();
        put(&self.tokens, bytemuck::cast_slice(&step.tokens));
        put(&self.positions, bytemuck::cast_slice(&step.positions));
        put(&self.slots, bytemuck::cast_slice(&step.layout.slot_mapping));
        put(
            &self.context_lens,
            bytemuck::cast_slice(&to_i32(&step.layout.context_lens)),
        );
        put(
            &self.block_tables,
            bytemuck::cast_slice(&to_i32(&step.layout.block_tables)),
        );
        let plan: Vec<i32> = (self.items.iter().flatten())
            .chain(step.plan_rows.iter().flatten())
            .copied()
            .chain(0..self.batch as i32)
            .collect();
        put(&self.plan, bytemuck::cast_slice(&plan));
        put(&self.temperatures, bytemuck::cast_slice(&step.temperatures));
        put(&self.uniforms, bytemuck::cast_slice(&step.uniforms));
        ensure!(end.is_multiple_of(4), "graph input region of {end} bytes");
        // SAFETY: the region runs from the first dynamic view to the end of the last, all carved
        // in this order from one arena, so it lies inside the arena.
        let mut region = unsafe { self.tokens.share_as(&[end / 4], DeviceDType::U32) }
            .ok_or_else(|| anyhow!("graph inputs must be arena views"))?;
        backend.write_bytes(&mut region, &staging)
    }

    /// The device layout over these buffers, with the graph's plan.
    fn device_layout(&self, group: usize, kv_heads: usize) -> Result<DevicePagedLayout> {
        let plan = WorkPlan {
            partition_keys: self.partition_keys,
            decode: self.items.clone(),
            prefill: Vec::new(),
            rows: vec![[0, 1]; self.batch],
            split_rows: (0..self.batch as i32).collect(),
            scratch_rows: self.batch * self.partitions,
        };
        Ok(DevicePagedLayout::for_graph(
            self.block_size,
            self.table_blocks,
            self.share(&self.cu_query)?,
            self.share(&self.context_lens)?,
            self.share(&self.block_tables)?,
            group,
            kv_heads,
            plan,
            self.share(&self.plan)?,
        ))
    }
}

impl CudaBackend {
    /// A pure decode step (one query row per sequence, every row sampled on the device) through
    /// a CUDA graph; `None` when the step has no graph (shape out of the buckets, graphs off)
    /// and should run eagerly.
    pub fn run_decode_graph(
        &self,
        model: &Qwen2Model<CudaBackend>,
        kv: &mut PagedKv<CudaTensor>,
        tokens: &[u32],
        positions: &[u32],
        layout: &PagedLayout,
        draws: &[RowDraw],
    ) -> Result<Option<Vec<(u32, f32)>>> {
        let n = tokens.len();
        let (heads, kv_heads) = (model.local.heads_local, model.local.kv_heads_local);
        let group = heads / kv_heads.max(1);
        let Some(&batch) = BATCH_BUCKETS.iter().find(|&&b| b >= n) else {
            return Ok(None);
        };
        if n == 0
            || layout
                .cu_query
                .iter()
                .enumerate()
                .any(|(i, &c)| c as usize != i)
            || group > DECODE_BLOCK_M
            || kv.layers.is_empty()
        {
            return Ok(None);
        }
        for (r, draw) in draws.iter().enumerate() {
            draw.check(r)?;
        }
        let mut graphs = self.graphs.lock().expect("graph lock poisoned");
        if graphs.disabled.is_some() {
            return Ok(None);
        }
        let key = GraphKey {
            batch,
            table_blocks: layout
                .max_blocks_per_seq
                .next_power_of_two()
                .max(MIN_TABLE_BLOCKS),
            generation: graphs.generation,
        };
        let graphs = &mut *graphs;
        let baked = baked_addresses(model, kv);
        if graphs.graphs.get(&key).is_some_and(|g| g.baked != baked) {
            graphs.graphs.remove(&key);
        }
        let graph = match graphs.graphs.entry(key) {
            Entry::Occupied(graph) => graph.into_mut(),
            Entry::Vacant(slot) => {
                let inputs = (tokens, positions, layout, draws);
                return match self.capture_decode(model, kv, key, group, kv_heads, inputs) {
                    Ok((graph, sampled)) => {
                        slot.insert(graph);
                        graphs.captures += 1;
                        Ok(Some(sampled))
                    }
                    Err(e) => {
                        let reason = format!("{e:#}");
                        eprintln!("swerve: CUDA graphs for decode steps are off: {reason}");
                        graphs.disabled = Some(reason);
                        Ok(None)
                    }
                };
            }
        };
        let step = graph
            .inputs
            .host_step(tokens, positions, layout, draws, kv.num_blocks)?;
        graph.inputs.write(self, &step)?;
        graph.graph.0.launch().context("launching a decode graph")?;
        let sampled = read_samples(self, &graph.inputs.out, n)?;
        graphs.replays += 1;
        Ok(Some(sampled))
    }

    /// (graphs captured, replays, why graphs are off if they are).
    pub fn decode_graph_stats(&self) -> (u64, u64, Option<String>) {
        match self.graphs.lock() {
            Ok(g) => (g.captures, g.replays, g.disabled.clone()),
            Err(_) => (0, 0, Some("graph lock poisoned".into())),
        }
    }

    /// Drops every graph (their weights or cache may be gone: a new generation) and turns graphs
    /// back on.
    pub fn reset_decode_graphs(&self) {
        if let Ok(mut graphs) = self.graphs.lock() {
            graphs.bump();
            graphs.disabled = None;
        }
    }

    /// A new generation of the memory graphs bake in (weights uploaded or overwritten): every
    /// graph captured so far is dropped, the next decode step captures anew.
    pub fn bump_graph_generation(&self) {
        if let Ok(mut graphs) = self.graphs.lock() {
            graphs.bump();
        }
    }

    /// The current generation of the weights and KV cache graphs are keyed on.
    pub fn graph_generation(&self) -> u64 {
        self.graphs.lock().map(|g| g.generation).unwrap_or(0)
    }

    /// Warms up, captures, replays once and checks a new graph against its eager run.
    fn capture_decode(
        &self,
        model: &Qwen2Model<CudaBackend>,
        kv: &mut PagedKv<CudaTensor>,
        key: GraphKey,
        group: usize,
        kv_heads: usize,
        (tokens, positions, layout, draws): (&[u32], &[u32], &PagedLayout, &[RowDraw]),
    ) -> Result<(DecodeGraph, Vec<(u32, f32)>)> {
        let inputs = StaticInputs::new(
            self,
            key.batch,
            key.table_blocks,
            layout.block_size,
            group,
            kv_heads,
            self.device.num_sms as usize,
        )?;
        let step = inputs.host_step(tokens, positions, layout, draws, kv.num_blocks)?;
        inputs.write(self, &step)?;
        self.graph_mode.store(true, Ordering::Relaxed);
        let result = (|| {
            // Eager warm-up on the graph's own buffers: loads kernels, plans GEMMs, fills the
            // graph pool so the capture allocates nothing new, and gives the reference bits.
            self.run_pinned(model, kv, &inputs, &step, group, kv_heads)?;
            let eager = self.read_bytes(&inputs.out)?;
            let allocations = self.graph_pool.stats().device_allocations;
            self.device
                .stream
                .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
                .context("beginning a stream capture")?;
            self.capturing.store(true, Ordering::Relaxed);
            let captured = self.run_pinned(model, kv, &inputs, &step, group, kv_heads);
            self.capturing.store(false, Ordering::Relaxed);
            let graph = self
                .device
                .stream
                .end_capture(CUgraphInstantiate_flags(0))
                .context("ending the stream capture")?;
            captured?;
            let graph = graph.ok_or_else(|| anyhow!("the capture recorded no work"))?;
            ensure!(
                self.graph_pool.stats().device_allocations == allocations,
                "the capture allocated device memory its warm-up did not"
            );
            graph.launch().context("launching a decode graph")?;
            let replayed = self.read_bytes(&inputs.out)?;
            ensure!(
                replayed == eager,
                "the captured decode step (batch {}) gave different bits than its eager run",
                key.batch
            );
            Ok(graph)
        })();
        self.capturing.store(false, Ordering::Relaxed);
        self.graph_mode.store(false, Ordering::Relaxed);
        let graph = result?;
        let sampled = read_samples(self, &inputs.out, tokens.len())?;
        Ok((
            DecodeGraph {
                graph: SendGraph(graph),
                inputs,
                baked: baked_addresses(model, kv),
            },
            sampled,
        ))
    }

    /// The step's ops on the pinned inputs: the model's paged forward, the LM head and sampling.
    fn run_pinned(
        &self,
        model: &Qwen2Model<CudaBackend>,
        kv: &mut PagedKv<CudaTensor>,
        inputs: &StaticInputs,
        step: &HostStep,
        group: usize,
        kv_heads: usize,
    ) -> Result<()> {
        use crate::backend::Backend;
        self.begin_step();
        let result = (|| {
            self.pin_step_array(&step.tokens, inputs.share(&inputs.tokens)?);
            self.pin_step_array(&step.positions, inputs.share(&inputs.positions)?);
            self.pin_step_array(&step.layout.slot_mapping, inputs.share(&inputs.slots)?);
            self.pin_step_layout(&step.layout, inputs.device_layout(group, kv_heads)?);
            let hidden =
                model.forward_paged(self, &step.tokens, &step.positions, &step.layout, kv)?;
            let logits = model.lm_head(self, &hidden)?;
            let mut out = inputs.share(&inputs.out)?;
            self.device
                .sample_rows(&logits, &inputs.temperatures, &inputs.uniforms, &mut out)
        })();
        self.end_step();
        result
    }
}

/// The attention inputs a decode graph of `batch` sequences with tables of `table_blocks` blocks
/// holds for the decode rows of `layout`, written exactly as a replay writes them (padding rows:
/// context 1 over the null block; the fixed plan: every sequence split into partitions up to the
/// table's capacity), and the device layout the graph's attention runs on. `num_sms` sizes the
/// partitions as a device of that many SMs would (`None`: this one). Returns it with the padded
/// host layout it was written from. For kernel-level tests of what a replay computes
/// (`tests/gpu_paged.rs`).
#[allow(clippy::too_many_arguments)]
pub fn decode_graph_attention_inputs(
    backend: &CudaBackend,
    layout: &PagedLayout,
    batch: usize,
    table_blocks: usize,
    group: usize,
    kv_heads: usize,
    num_blocks: usize,
    num_sms: Option<usize>,
) -> Result<(DevicePagedLayout, PagedLayout)> {
    let n = layout.num_seqs();
    ensure!(
        layout
            .cu_query
            .iter()
            .enumerate()
            .all(|(i, &c)| c as usize == i),
        "decode graph inputs: one query row per sequence"
    );
    let inputs = StaticInputs::new(
        backend,
        batch,
        table_blocks,
        layout.block_size,
        group,
        kv_heads,
        num_sms.unwrap_or(backend.device.num_sms as usize),
    )?;
    let positions: Vec<u32> = layout
        .context_lens
        .iter()
        .map(|&c| c.saturating_sub(1))
        .collect();
    let draws = vec![
        RowDraw {
            temperature: 0.0,
            uniform: 0.0,
        };
        n
    ];
    let step = inputs.host_step(&vec![0; n], &positions, layout, &draws, num_blocks)?;
    inputs.write(backend, &step)?;
    Ok((inputs.device_layout(group, kv_heads)?, step.layout))
}

/// The first `n` (token, logprob) pairs of a graph's output.
fn read_samples(backend: &CudaBackend, out: &CudaTensor, n: usize) -> Result<Vec<(u32, f32)>> {
    let words: Vec<u32> = super::backend::pod_vec(&backend.read_bytes(out)?);
    Ok(words
        .chunks_exact(2)
        .take(n)
        .map(|pair| (pair[0], f32::from_bits(pair[1])))
        .collect())
}
