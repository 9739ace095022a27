//! What a backend keeps of its CUDA graphs for decode steps (`graphs.rs` captures and replays
//! them): the graphs by key (`DecodeGraphs`), and each graph's static input buffers
//! (`StaticInputs`) with how one step's host arrays are padded and written into them. Apart
//! from `graphs.rs` so that [`super::CudaBackend`], which holds the graphs, does not depend on the
//! code that runs it.

use super::paged_attn::{DevicePagedLayout, WorkPlan, DECODE_BLOCK_M, SEGMENT_KEYS};
use super::sampling::SAMPLE_WORDS;
use super::tensor::{Arena, CudaTensor, DeviceDType, DeviceUpload};
use crate::backend::{PagedLayout, RowDraw};
use anyhow::{anyhow, ensure, Context, Result};
use cudarc::driver::CudaGraph;
use std::collections::HashMap;

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub(super) struct GraphKey {
    pub(super) batch: usize,
    pub(super) table_blocks: usize,
    /// [`DecodeGraphs::generation`] at capture: the weights and KV cache the graph bakes in.
    pub(super) generation: u64,
}

/// The decode graphs of one backend.
#[derive(Default)]
pub struct DecodeGraphs {
    pub(super) graphs: HashMap<GraphKey, DecodeGraph>,
    /// Why graphs are off, once a capture failed or disagreed with its eager run.
    pub(super) disabled: Option<String>,
    pub captures: u64,
    pub replays: u64,
    /// Bumped whenever the memory graphs bake in may have changed: weights uploaded or
    /// overwritten, a KV cache allocated or released. A graph replays only in its own generation.
    pub(super) generation: u64,
}

impl DecodeGraphs {
    pub fn clear(&mut self) {
        self.graphs.clear();
    }
    /// Starts a new generation: every graph captured so far is dropped.
    pub(super) fn bump(&mut self) {
        self.generation += 1;
        self.graphs.clear();
    }
    pub fn disabled_reason(&self) -> Option<&str> {
        self.disabled.as_deref()
    }
}

/// A captured graph. SAFETY of `Send`: the executable graph is only launched on its stream, with
/// the backend's context bound (cudarc binds it), while the backend's graph lock is held.
pub(super) struct SendGraph(pub(super) CudaGraph);
unsafe impl Send for SendGraph {}

pub(super) struct DecodeGraph {
    pub(super) graph: SendGraph,
    pub(super) inputs: StaticInputs,
    /// `baked_addresses` (`graphs.rs`) at capture: a second guard beside the generation (two caches alive at
    /// once, used in turn, are one generation).
    pub(super) baked: Vec<u64>,
}

/// One graph's input and output buffers, views of one arena. The dynamic ones (everything but
/// `cu_query` and `out`) are contiguous from `tokens` on and rewritten by one copy per replay.
pub(super) struct StaticInputs {
    pub(super) batch: usize,
    pub(super) table_blocks: usize,
    pub(super) block_size: usize,
    pub(super) segment_keys: usize,
    pub(super) segments: usize,
    /// Plan items (static) and rows (per step), as the plan tensor holds them.
    pub(super) items: Vec<[i32; 4]>,
    pub(super) tokens: CudaTensor,
    pub(super) positions: CudaTensor,
    pub(super) slots: CudaTensor,
    pub(super) context_lens: CudaTensor,
    pub(super) block_tables: CudaTensor,
    pub(super) plan: CudaTensor,
    pub(super) temperatures: CudaTensor,
    pub(super) uniforms: CudaTensor,
    pub(super) cu_query: CudaTensor,
    pub(super) out: CudaTensor,
}

/// The host side of one step, padded to the graph's batch.
pub(super) struct HostStep {
    pub(super) tokens: Vec<u32>,
    pub(super) positions: Vec<u32>,
    pub(super) layout: PagedLayout,
    pub(super) temperatures: Vec<f32>,
    pub(super) uniforms: Vec<f64>,
    pub(super) plan_rows: Vec<[i32; 2]>,
}

impl StaticInputs {
    pub(super) fn new(
        backend: &impl DeviceUpload,
        batch: usize,
        table_blocks: usize,
        block_size: usize,
        group: usize,
    ) -> Result<Self> {
        // Every sequence is cut into the canonical segments up to its table's capacity (the
        // eager plan's cut, so a replay gives the eager step's bits).
        let keys = table_blocks * block_size;
        let (segment_keys, segments) = (SEGMENT_KEYS, keys.div_ceil(SEGMENT_KEYS));
        let mut items = Vec::new();
        for s in 0..batch {
            for m0 in (0..group).step_by(DECODE_BLOCK_M) {
                for segment in 0..segments {
                    items.push([s, m0, segment, segment_keys].map(|x| x as i32));
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
            (&[batch, SAMPLE_WORDS], DeviceDType::U32),
        ];
        let bytes = Arena::bytes_for(
            shapes
                .iter()
                .map(|(s, d)| s.iter().product::<usize>() * d.size()),
        );
        let mut arena = Arena::new(backend.stream(), bytes)?;
        let mut take = |i: usize| arena.take(shapes[i].0, shapes[i].1);
        let inputs = Self {
            batch,
            table_blocks,
            block_size,
            segment_keys,
            segments,
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

    pub(super) fn share(&self, t: &CudaTensor) -> Result<CudaTensor> {
        t.share()
            .ok_or_else(|| anyhow!("graph inputs must be arena views"))
    }

    /// The step's host arrays, padded to the graph's batch; errors name what does not fit.
    pub(super) fn host_step(
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
            let parts = (context as usize).div_ceil(self.segment_keys).max(1);
            step.plan_rows
                .push([(s * self.segments) as i32, parts as i32]);
        }
        Ok(step)
    }

    /// Writes a step's dynamic inputs with one host-to-device copy.
    pub(super) fn write(&self, backend: &impl DeviceUpload, step: &HostStep) -> Result<()> {
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
    pub(super) fn device_layout(&self, group: usize, kv_heads: usize) -> Result<DevicePagedLayout> {
        let plan = WorkPlan {
            segment_keys: self.segment_keys,
            decode: self.items.clone(),
            prefill: Vec::new(),
            rows: vec![[0, 1]; self.batch],
            split_rows: (0..self.batch as i32).collect(),
            scratch_rows: self.batch * self.segments,
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
