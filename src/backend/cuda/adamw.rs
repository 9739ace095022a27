//! Launch of `kernels/adamw.cu`: one fused AdamW update of an f32 master tensor and its moments.

use super::tensor::{CudaTensor, DeviceDType};
use super::{grid_stride_config, CudaDevice};
use crate::backend::adamw::{AdamWScalars, AdamWStep};
use anyhow::{ensure, Result};
use cudarc::driver::{DeviceRepr, PushKernelArg};

/// The kernel's by-value `AdamWScalars` argument.
#[repr(transparent)]
#[derive(Clone, Copy)]
struct KernelScalars(AdamWScalars);

// SAFETY: `AdamWScalars` is `#[repr(C)]` with eight f32 fields, the layout of the kernel's struct.
unsafe impl DeviceRepr for KernelScalars {}

impl CudaDevice {
    /// One AdamW step over `master`, `exp_avg`, `exp_avg_sq` (f32) from `grad` (f32), all of one
    /// size; bit for bit the CPU reference ([`crate::backend::adamw::adamw_update_slice`]).
    pub fn adamw(
        &self,
        master: &mut CudaTensor,
        grad: &CudaTensor,
        exp_avg: &mut CudaTensor,
        exp_avg_sq: &mut CudaTensor,
        step: &AdamWStep,
    ) -> Result<()> {
        let n = master.len();
        for (what, t) in [
            ("master", &*master),
            ("grad", grad),
            ("exp_avg", &*exp_avg),
            ("exp_avg_sq", &*exp_avg_sq),
        ] {
            ensure!(
                t.dtype() == DeviceDType::F32 && t.len() == n,
                "adamw_update: {what} {:?} {:?} beside master {:?} (all f32)",
                t.shape(),
                t.dtype(),
                master.shape()
            );
        }
        if n == 0 {
            return Ok(());
        }
        let scalars = KernelScalars(step.scalars());
        let n_i = n as i64;
        let f = self.function("adamw", "adamw_f32")?;
        let (p, g, m, v) = (master.ptr(), grad.ptr(), exp_avg.ptr(), exp_avg_sq.ptr());
        let mut launch = self.stream.launch_builder(&f);
        launch
            .arg(&p)
            .arg(&g)
            .arg(&m)
            .arg(&v)
            .arg(&n_i)
            .arg(&scalars);
        // SAFETY: argument order and types match the kernel; sizes checked above.
        unsafe { launch.launch(grid_stride_config(self, n.div_ceil(4), 256)) }?;
        Ok(())
    }
}
