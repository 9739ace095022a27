//! The CUDA side: the kernels `build.rs` embedded, loaded through cudarc's driver API.
//!
//! libcuda is opened at run time, so the same binary runs where there is no driver: [`probe`]
//! asks `is_culib_present()` before touching CUDA and explains why CUDA is unavailable. Kernel
//! families are the `kernels/*.cu` files; each is one fatbin (sm_90a + compute_80 PTX), loaded
//! once per device. Launch wrappers live beside this file, one module per kernel family.

pub mod rmsnorm;

use anyhow::{anyhow, bail, Context, Result};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};
use cudarc::nvrtc::Ptx;
use std::collections::HashMap;
use std::sync::Arc;

/// What `build.rs` compiled: `(family, fatbin)` for every `kernels/*.cu`.
pub mod embedded {
    include!(concat!(env!("OUT_DIR"), "/kernels.rs"));
}

/// One GPU with every embedded kernel family loaded.
pub struct CudaDevice {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub ordinal: usize,
    pub name: String,
    modules: HashMap<&'static str, Arc<CudaModule>>,
}

/// Opens device 0 if this build has kernels, libcuda is present and a device answers; otherwise
/// the reason, in words, for the "backend: cpu (...)" line the binaries print.
pub fn probe() -> std::result::Result<CudaDevice, String> {
    if !embedded::CUDA_KERNELS_COMPILED {
        return Err("this build has no CUDA kernels (built without nvcc)".into());
    }
    if !driver_present() {
        return Err("no CUDA driver (libcuda) on this machine".into());
    }
    match CudaContext::device_count() {
        Ok(0) => return Err("the CUDA driver reports no device".into()),
        Ok(_) => {}
        Err(e) => return Err(format!("the CUDA driver did not initialise: {e}")),
    }
    CudaDevice::open(0).map_err(|e| format!("{e:#}"))
}

/// Whether libcuda can be opened. cudarc panics on first use of a missing library, so every
/// path into CUDA asks this first.
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen libcuda.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

impl CudaDevice {
    pub fn open(ordinal: usize) -> Result<Self> {
        if !embedded::CUDA_KERNELS_COMPILED {
            bail!("this build has no CUDA kernels (built without nvcc)");
        }
        if !driver_present() {
            bail!("no CUDA driver (libcuda) on this machine");
        }
        let ctx = CudaContext::new(ordinal)
            .with_context(|| format!("cannot open CUDA device {ordinal}"))?;
        let name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        let stream = ctx.default_stream();
        let mut modules = HashMap::new();
        for (family, fatbin) in embedded::FATBINS {
            let module = ctx
                .load_module(Ptx::from_binary(fatbin.to_vec()))
                .with_context(|| format!("cannot load kernels/{family}.cu's fatbin on {name}"))?;
            modules.insert(*family, module);
        }
        Ok(Self {
            ctx,
            stream,
            ordinal,
            name,
            modules,
        })
    }

    /// A kernel by family (`.cu` file stem) and `extern "C"` name.
    pub fn function(&self, family: &str, name: &str) -> Result<CudaFunction> {
        let module = self
            .modules
            .get(family)
            .ok_or_else(|| anyhow!("no kernel family {family} in this build"))?;
        module
            .load_function(name)
            .with_context(|| format!("kernel {name} in kernels/{family}.cu"))
    }

    pub fn describe(&self) -> String {
        format!("cuda:{} ({})", self.ordinal, self.name)
    }
}
