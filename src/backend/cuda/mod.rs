//! The CUDA side: the kernels `build.rs` embedded, loaded through cudarc's driver API, and the
//! [`CudaBackend`] that runs the model with them.
//!
//! libcuda is opened at run time, so the same binary runs where there is no driver: [`probe`]
//! asks `is_culib_present()` before touching CUDA and explains why CUDA is unavailable. Kernel
//! families are the `kernels/*.cu` files; each is one fatbin (sm_90a + compute_80 PTX), loaded
//! once per device. Launch wrappers live beside this file, one module per kernel family; they
//! check every size against the tensors before launching.
//!
//! The files import downward only (`tests/layering/`): `tensor`, `gemm`, the kernel families'
//! device layouts (`flash_attn`, `paged_attn`: uploaded through [`tensor::DeviceUpload`], not
//! the backend) and `graph_inputs`; then `backend` ([`CudaBackend`]: memory, step scope, the
//! forward ops); then the files that add to it (`graphs`, `attention_grad`, `loss`, `adamw`,
//! `grad`).
//!
//! ```text
//!  CudaBackend ─┬─ CudaDevice  context, the one stream, loaded kernel families
//!               ├─ Gemm        cuBLASLt handle, workspace, plans cached per problem
//!               └─ BufferPool  caching allocator for activations (parameters: one Arena)
//! ```

pub mod adamw;
pub mod attention_grad;
pub mod backend;
pub mod flash_attn;
pub mod gemm;
pub mod gemm_algo;
pub mod gemm_backward;
pub mod gemm_rows;
pub mod gemm_survey;
pub mod grad;
pub mod graph_inputs;
pub mod graphs;
pub mod loss;
pub mod loss_tiles;
pub mod paged_attn;
pub mod paged_plan;
pub mod pointwise;
pub mod rank_sum;
pub mod rmsnorm;
pub mod sampling;
pub mod tensor;
pub mod tma;

pub use backend::CudaBackend;
pub use tensor::{BufferPool, CudaTensor, DeviceDType};

use anyhow::{anyhow, bail, Context, Result};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, LaunchConfig};
use cudarc::nvrtc::Ptx;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

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
    /// Streaming multiprocessors, for grid sizing.
    pub num_sms: u32,
    /// (major, minor) compute capability.
    pub compute_capability: (i32, i32),
    /// Whether attention runs the sm_90a kernels (`kernels/flash_attn_sm90.cu`): on by default on
    /// compute capability 9.x, off elsewhere ([`CudaDevice::set_hopper_attention`]).
    hopper_attention: std::sync::atomic::AtomicBool,
    modules: HashMap<&'static str, Arc<CudaModule>>,
    functions: Mutex<HashMap<(String, String), CudaFunction>>,
}

/// Opens device 0 if this build has kernels, libcuda is present and a device answers; otherwise
/// the reason, in words, for the "backend: cpu (...)" line the binaries print.
pub fn probe() -> std::result::Result<CudaDevice, String> {
    if !embedded::CUDA_KERNELS_COMPILED {
        return Err("this build has no CUDA kernels (built without nvcc)".into());
    }
    if embedded::CUDA_EMULATED {
        load_emulator()?;
    } else if !driver_present() {
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
/// path into CUDA asks this first. In an emulated build this loads the emulator's libraries.
pub fn driver_present() -> bool {
    if embedded::CUDA_EMULATED {
        return load_emulator().is_ok();
    }
    // SAFETY: only tries to dlopen libcuda.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Whether this build runs CUDA on the emulated device (`SWERVE_EMU=1`, `emu/`): kernels compiled
/// for the host, a stand-in libcuda and libcublasLt. Correctness only: no timing means anything.
pub fn is_emulated() -> bool {
    embedded::CUDA_EMULATED
}

/// The line every binary prints first in an emulated build; `None` in a real one.
pub fn emulation_banner() -> Option<&'static str> {
    is_emulated().then_some(
        "CUDA: emulated device (a SWERVE_EMU=1 build: kernels run on the CPU for correctness; \
         timings mean nothing; --device auto picks the CPU backend, --device cuda the emulator)",
    )
}

/// Loads the emulator's stand-in libcuda, libcublasLt and libnccl by absolute path
/// (RTLD_GLOBAL), once. cudarc then opens `libcuda.so` / `libcublasLt.so` by name, and the dynamic
/// loader hands back these already-loaded libraries, whose sonames are those names: the real
/// launch code runs on the emulated device with no environment to set. (`dist::nccl` opens the
/// stand-in libnccl by its path.)
fn load_emulator() -> std::result::Result<(), String> {
    static LOADED: std::sync::OnceLock<std::result::Result<(), String>> =
        std::sync::OnceLock::new();
    LOADED
        .get_or_init(|| {
            for path in embedded::EMULATOR_LIBRARIES {
                let c_path = std::ffi::CString::new(*path).map_err(|e| e.to_string())?;
                // SAFETY: dlopen of a library this build produced; the handle is never closed.
                let handle =
                    unsafe { libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
                if handle.is_null() {
                    // SAFETY: dlerror returns a thread-local C string or null.
                    let reason = unsafe {
                        let e = libc::dlerror();
                        if e.is_null() {
                            "unknown error".to_string()
                        } else {
                            std::ffi::CStr::from_ptr(e).to_string_lossy().into_owned()
                        }
                    };
                    return Err(format!(
                        "cannot load the emulated CUDA library {path} (rebuild with SWERVE_EMU=1): {reason}"
                    ));
                }
            }
            Ok(())
        })
        .clone()
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
        // Everything runs on one stream: no cross-stream events needed on any buffer.
        // SAFETY: no buffer of this context exists yet.
        unsafe { ctx.disable_event_tracking() };
        let name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        let num_sms = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .context("reading the SM count")? as u32;
        let attribute = |a, what: &str| {
            ctx.attribute(a)
                .with_context(|| format!("reading the {what}"))
        };
        use cudarc::driver::sys::CUdevice_attribute as Attr;
        let compute_capability = (
            attribute(
                Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                "compute capability",
            )?,
            attribute(
                Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                "compute capability",
            )?,
        );
        // A created stream, not `default_stream()`: that is the legacy NULL stream, on which
        // `cuStreamBeginCapture` is refused, so CUDA graphs could never be captured.
        let stream = ctx.new_stream().context("creating the CUDA stream")?;
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
            num_sms,
            compute_capability,
            hopper_attention: std::sync::atomic::AtomicBool::new(compute_capability.0 == 9),
            modules,
            functions: Mutex::new(HashMap::new()),
        })
    }

    /// A kernel by family (`.cu` file stem) and `extern "C"` name, looked up once.
    pub fn function(&self, family: &str, name: &str) -> Result<CudaFunction> {
        let key = (family.to_string(), name.to_string());
        if let Some(f) = self
            .functions
            .lock()
            .ok()
            .and_then(|m| m.get(&key).cloned())
        {
            return Ok(f);
        }
        let module = self
            .modules
            .get(family)
            .ok_or_else(|| anyhow!("no kernel family {family} in this build"))?;
        let f = module
            .load_function(name)
            .with_context(|| format!("kernel {name} in kernels/{family}.cu"))?;
        if let Ok(mut m) = self.functions.lock() {
            m.insert(key, f.clone());
        }
        Ok(f)
    }

    /// Picks the attention kernels: the sm_90a ones (`on`, compute capability 9.x only) or the
    /// portable sm_80 ones. Both follow the canonical reduction order (`kernels/attn_tile.cuh`);
    /// benchmarks and tests compare them on one GPU.
    pub fn set_hopper_attention(&self, on: bool) -> Result<()> {
        if on && self.compute_capability.0 != 9 {
            bail!(
                "the sm_90a attention kernels need compute capability 9.x; {} is {}.{}",
                self.name,
                self.compute_capability.0,
                self.compute_capability.1
            );
        }
        self.hopper_attention
            .store(on, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Whether attention runs the sm_90a kernels ([`CudaDevice::set_hopper_attention`]).
    pub fn hopper_attention(&self) -> bool {
        self.hopper_attention
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A kernel that takes `smem` bytes of dynamic shared memory per block: refused with the
    /// figures when the device cannot give a block that much, else loaded with its
    /// dynamic-shared-memory attribute raised to `smem` (needed above 48 KiB).
    pub fn function_with_smem(&self, family: &str, name: &str, smem: u32) -> Result<CudaFunction> {
        flash_attn::check_shared_memory(self, name, smem)?;
        let f = self.function(family, name)?;
        f.set_attribute(
            cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem as i32,
        )?;
        Ok(f)
    }

    pub fn describe(&self) -> String {
        format!("cuda:{} ({})", self.ordinal, self.name)
    }

    /// Waits for all work queued on the stream.
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().context("CUDA stream synchronize")
    }
}

/// A 1-D grid-stride launch covering `work_items` with `threads` per block, at most a few waves.
pub fn grid_stride_config(device: &CudaDevice, work_items: usize, threads: u32) -> LaunchConfig {
    let blocks = work_items.div_ceil(threads as usize).max(1);
    let cap = device.num_sms as usize * 8;
    LaunchConfig {
        grid_dim: (blocks.min(cap) as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Checks that a size fits the kernels' `int` arguments.
pub fn as_i32(what: &str, value: usize) -> Result<i32> {
    i32::try_from(value).map_err(|_| anyhow!("{what} = {value} exceeds the kernels' 32-bit sizes"))
}

// ---- device limits the launch wrappers choose kernel variants by ----------------------------------

impl CudaDevice {
    /// The most dynamic shared memory one block may opt into
    /// (`CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN`): 227 KiB on sm_90, 163 KiB on
    /// sm_80, 99 KiB on sm_86 / sm_89. Kernel families with configurations above the smallest of
    /// these pick a variant that fits (`paged_attn.rs`) or refuse with the figures.
    pub fn max_shared_memory_per_block_optin(&self) -> Result<usize> {
        let bytes = self
            .ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )
            .context("reading the shared-memory opt-in limit per block")?;
        Ok(usize::try_from(bytes).unwrap_or(0))
    }
}
