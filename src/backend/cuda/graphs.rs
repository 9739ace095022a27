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
//!   tables, the attention work plan, temperatures, uniform draws, and the output; the types are
//!   in `graph_inputs.rs`). The model code is the generic one, called back through
//!   [`crate::backend::DecodeModel`]: the step scope ([`crate::backend::Backend::begin_step`]) is
//!   pre-filled with these buffers for the host arrays passed in, so no op uploads anything. A
//!   host copy inside a capture is refused, which fails the capture rather than baking a stale
//!   input.
//! - **The attention plan** is fixed per graph: every sequence gets `ceil(T * block_size / 512)`
//!   canonical segments (`SEGMENT_KEYS`, as the eager plan: a replay's bits are the eager step's);
//!   a segment past a sequence's context does nothing, and the merge skips rows of one segment.
//!   Only the per-row segment counts change between replays.
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
use super::graph_inputs::{DecodeGraph, GraphKey, HostStep, SendGraph, StaticInputs};
use super::paged_attn::{DevicePagedLayout, DECODE_BLOCK_M};
use super::tensor::CudaTensor;
use crate::backend::{DecodeModel, PagedLayout, RowDraw};
use anyhow::{anyhow, ensure, Context, Result};
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use std::collections::hash_map::Entry;
use std::sync::atomic::Ordering;

/// Sequences per graph. A step of B sequences runs the smallest bucket >= B; larger steps run
/// eagerly (their launches are a small share of the step).
pub const BATCH_BUCKETS: [usize; 13] = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256];
/// Smallest block-table capacity of a graph (256 tokens at 16 per block); capacities double.
const MIN_TABLE_BLOCKS: usize = 16;

/// Every weight and KV-cache address a captured decode step bakes into its launches, and the
/// cache's size.
fn baked_addresses<M: DecodeModel<CudaBackend>>(model: &M, kv: &M::Cache) -> Vec<u64> {
    (model.step_tensors(kv).iter().map(|t| t.ptr()))
        .chain([model.cache_blocks(kv) as u64])
        .collect()
}

impl CudaBackend {
    /// A pure decode step (one query row per sequence, every row sampled on the device) through
    /// a CUDA graph; `None` when the step has no graph (shape out of the buckets, graphs off)
    /// and should run eagerly.
    pub fn run_decode_graph<M: DecodeModel<CudaBackend>>(
        &self,
        model: &M,
        kv: &mut M::Cache,
        tokens: &[u32],
        positions: &[u32],
        layout: &PagedLayout,
        draws: &[RowDraw],
    ) -> Result<Option<Vec<(u32, f32)>>> {
        let n = tokens.len();
        let (heads, kv_heads) = model.heads_local();
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
            || model.cache_blocks(kv) == 0
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
        let step =
            graph
                .inputs
                .host_step(tokens, positions, layout, draws, model.cache_blocks(kv))?;
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
    fn capture_decode<M: DecodeModel<CudaBackend>>(
        &self,
        model: &M,
        kv: &mut M::Cache,
        key: GraphKey,
        group: usize,
        kv_heads: usize,
        (tokens, positions, layout, draws): (&[u32], &[u32], &PagedLayout, &[RowDraw]),
    ) -> Result<(DecodeGraph, Vec<(u32, f32)>)> {
        let inputs =
            StaticInputs::new(self, key.batch, key.table_blocks, layout.block_size, group)?;
        let step = inputs.host_step(tokens, positions, layout, draws, model.cache_blocks(kv))?;
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
    fn run_pinned<M: DecodeModel<CudaBackend>>(
        &self,
        model: &M,
        kv: &mut M::Cache,
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
            let logits =
                model.step_logits(self, kv, &step.tokens, &step.positions, &step.layout)?;
            let mut out = inputs.share(&inputs.out)?;
            let chunk = self.loss_tiles().vocab;
            self.device.sample_rows(
                &logits,
                &inputs.temperatures,
                &inputs.uniforms,
                chunk,
                1, // graphs run at tensor-parallel 1 only: one vocabulary shard
                &mut out,
            )
        })();
        self.end_step();
        result
    }
}

/// The attention inputs a decode graph of `batch` sequences with tables of `table_blocks` blocks
/// holds for the decode rows of `layout`, written exactly as a replay writes them (padding rows:
/// context 1 over the null block; the fixed plan: every sequence split into segments up to the
/// table's capacity), and the device layout the graph's attention runs on. Returns it with the padded
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
    let inputs = StaticInputs::new(backend, batch, table_blocks, layout.block_size, group)?;
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
    Ok(super::sampling::finish_samples(&words, 1)
        .into_iter()
        .take(n)
        .collect())
}
