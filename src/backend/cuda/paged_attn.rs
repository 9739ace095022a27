//! Launches of `kernels/paged_attn.cu`: K/V writes into the paged cache and attention of a step's
//! query rows over block tables.

use super::backend::CudaBackend;
use super::tensor::{BufferPool, CudaTensor, DeviceDType};
use super::CudaDevice;
use crate::backend::PagedLayout;
use anyhow::{bail, Result};

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
}

impl DevicePagedLayout {
    pub fn upload(backend: &CudaBackend, layout: &PagedLayout) -> Result<Self> {
        let to_i32 = |v: &[u32]| -> Vec<i32> { v.iter().map(|&x| x as i32).collect() };
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
            cu_query: backend.upload_pod(&to_i32(&layout.cu_query), &[n + 1], DeviceDType::I32)?,
            context_lens: backend.upload_pod(
                &to_i32(&layout.context_lens),
                &[n],
                DeviceDType::I32,
            )?,
            block_tables: backend.upload_pod(
                &to_i32(&layout.block_tables),
                &[n, layout.max_blocks_per_seq],
                DeviceDType::I32,
            )?,
        })
    }
}

impl CudaDevice {
    /// Writes each row's K and V into its cache slot.
    pub fn write_kv(
        &self,
        _k: &CudaTensor,
        _v: &CudaTensor,
        _slot_mapping: &CudaTensor,
        _k_cache: &mut CudaTensor,
        _v_cache: &mut CudaTensor,
    ) -> Result<()> {
        bail!("write_kv: the CUDA paged-attention kernels are not in this build yet")
    }

    /// Attention of the layout's query rows over their cached contexts.
    #[allow(clippy::too_many_arguments)]
    pub fn paged_attention(
        &self,
        _q: &CudaTensor,
        _k_cache: &CudaTensor,
        _v_cache: &CudaTensor,
        _layout: &DevicePagedLayout,
        _softmax_scale: f32,
        _out: &mut CudaTensor,
        _pool: &BufferPool,
    ) -> Result<()> {
        bail!("paged_attention: the CUDA paged-attention kernels are not in this build yet")
    }
}
