//! Launch of `kernels/rank_sum.cu`: the canonical tensor-parallel sum, every rank's partial
//! values of the same elements summed in rank order in fp32 and rounded once
//! (`src/dist/nccl/ordered.rs` calls it between the exchange and the gather; the CPU reference
//! is [`crate::dist::sum_in_rank_order`]).

use super::tensor::{CudaTensor, DeviceDType};
use super::{as_i32, grid_stride_config, CudaDevice};
use anyhow::{bail, ensure, Result};
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::PushKernelArg;

impl CudaDevice {
    /// `out[i] = Σ_r partials[r, i]` in rank order, fp32, rounded once, for `i < out.len()`;
    /// `partials [ranks, stride]` and `out` of one dtype (bf16 or f32), `out.len() <= stride`.
    pub fn rank_sum(&self, partials: &CudaTensor, out: &mut CudaTensor) -> Result<()> {
        let shape = partials.shape();
        ensure!(
            shape.len() == 2
                && shape[0] > 0
                && out.len() <= shape[1]
                && partials.dtype() == out.dtype(),
            "rank_sum: partials {shape:?} {:?}, out {:?} {:?}",
            partials.dtype(),
            out.shape(),
            out.dtype()
        );
        // SAFETY: `partials` holds ranks x stride elements, `out` the count summed (checked).
        unsafe {
            self.rank_sum_raw(
                out.ptr(),
                partials.ptr(),
                out.dtype(),
                shape[0],
                shape[1],
                out.len(),
            )
        }
    }

    /// [`Self::rank_sum`] on raw device addresses: `count` elements into `out` from `ranks` rows
    /// of `partials`, `stride` elements apart.
    ///
    /// # Safety
    /// `partials` must hold `ranks * stride` elements of `dtype`, `out` `count`, `count <=
    /// stride`, both live until the stream has run the kernel.
    pub unsafe fn rank_sum_raw(
        &self,
        out: CUdeviceptr,
        partials: CUdeviceptr,
        dtype: DeviceDType,
        ranks: usize,
        stride: usize,
        count: usize,
    ) -> Result<()> {
        ensure!(
            ranks > 0 && count <= stride,
            "rank_sum: {count} elements of {ranks} rows of {stride}"
        );
        let name = match dtype {
            DeviceDType::Bf16 => "rank_sum_bf16",
            DeviceDType::F32 => "rank_sum_f32",
            other => bail!("rank_sum: sums bf16 or f32, not {other:?}"),
        };
        if count == 0 {
            return Ok(());
        }
        let (ranks_i, stride_i, count_i) = (as_i32("ranks", ranks)?, stride as i64, count as i64);
        let f = self.function("rank_sum", name)?;
        let mut launch = self.stream.launch_builder(&f);
        launch
            .arg(&out)
            .arg(&partials)
            .arg(&ranks_i)
            .arg(&stride_i)
            .arg(&count_i);
        launch.launch(grid_stride_config(self, count, 256))?;
        Ok(())
    }
}
