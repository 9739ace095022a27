//! GEMMs through cuBLASLt (DESIGN.md decision 4): bf16 inputs, fp32 accumulation, bf16 or fp32
//! output, the bias add fused as an epilogue.
//!
//! Row-major `out[T, n] = x[T, k] W[n, k]^T + b` is, in cuBLAS's column-major terms,
//! `out^T[n, T] = op(W)[n, k] x^T[k, T]` with `op = transpose`: A = W (stored k x n, ld k,
//! transposed), B = x (k x T, ld k), C = D = out (n x T, ld n), and the bias runs along the n rows
//! of C, which is what `CUBLASLT_EPILOGUE_BIAS` broadcasts.
//!
//! Descriptors, layouts and the heuristic's algorithm are built once per distinct problem and
//! cached (the model has a handful of shapes per batch size); a call then only sets the bias
//! pointer and launches. One 32 MiB workspace (NVIDIA's recommendation for Hopper) serves all.

use super::tensor::{CudaTensor, DeviceDType};
use anyhow::{anyhow, bail, ensure, Context, Result};
use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use std::collections::HashMap;
use std::ffi::c_void;
use std::mem::size_of;
use std::sync::{Arc, Mutex};

const WORKSPACE_BYTES: usize = 32 << 20;

/// One column-major cuBLASLt problem `D[m, n] = alpha op(A)[m, k] op(B)[k, n] + beta C (+ bias[m])`.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct GemmKey {
    pub trans_a: bool,
    pub trans_b: bool,
    pub m: u64,
    pub n: u64,
    pub k: u64,
    pub lda: i64,
    pub ldb: i64,
    pub ldd: i64,
    pub out_f32: bool,
    pub bias: bool,
    /// Whether C (= D) is accumulated into; changes the heuristic's choice.
    pub accumulate: bool,
}

struct Plan {
    desc: sys::cublasLtMatmulDesc_t,
    a: sys::cublasLtMatrixLayout_t,
    b: sys::cublasLtMatrixLayout_t,
    d: sys::cublasLtMatrixLayout_t,
    algo: sys::cublasLtMatmulAlgo_t,
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: created by this plan, destroyed once.
        unsafe {
            let _ = lt::destroy_matrix_layout(self.a);
            let _ = lt::destroy_matrix_layout(self.b);
            let _ = lt::destroy_matrix_layout(self.d);
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

struct Handle(sys::cublasLtHandle_t);

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: created by `Gemm::new`, destroyed once.
        unsafe {
            let _ = lt::destroy_handle(self.0);
        }
    }
}

/// The cuBLASLt handle, workspace and plan cache of one device stream.
pub struct Gemm {
    stream: Arc<CudaStream>,
    // Plans are dropped before the handle (field order).
    plans: Mutex<HashMap<GemmKey, Plan>>,
    handle: Handle,
    _workspace: CudaSlice<u8>,
    workspace_ptr: CUdeviceptr,
}

// SAFETY: the raw cuBLASLt objects are only used under the plan mutex or read-only, on one stream.
unsafe impl Send for Gemm {}
unsafe impl Sync for Gemm {}

fn data_type(f32_out: bool) -> sys::cudaDataType {
    if f32_out {
        sys::cudaDataType_t::CUDA_R_32F
    } else {
        sys::cudaDataType_t::CUDA_R_16BF
    }
}

fn cublas<T>(what: &str, r: std::result::Result<T, lt::CublasError>) -> Result<T> {
    r.map_err(|e| anyhow!("cuBLASLt {what}: {e:?}"))
}

impl Gemm {
    pub fn new(stream: Arc<CudaStream>) -> Result<Self> {
        let handle = Handle(cublas(
            "create handle (is libcublasLt on LD_LIBRARY_PATH?)",
            lt::create_handle(),
        )?);
        // SAFETY: scratch memory for cuBLASLt; never read by us.
        let workspace = unsafe { stream.alloc::<u8>(WORKSPACE_BYTES) }
            .context("allocating the cuBLASLt workspace")?;
        let workspace_ptr = {
            let (ptr, _sync) = workspace.device_ptr(&stream);
            ptr
        };
        Ok(Self {
            stream,
            plans: Mutex::new(HashMap::new()),
            handle,
            _workspace: workspace,
            workspace_ptr,
        })
    }

    /// Distinct problems planned so far.
    pub fn cached_plans(&self) -> usize {
        self.plans.lock().map(|p| p.len()).unwrap_or(0)
    }

    fn plan(&self, key: &GemmKey) -> Result<Plan> {
        let (a_rows, a_cols) = if key.trans_a {
            (key.k, key.m)
        } else {
            (key.m, key.k)
        };
        let (b_rows, b_cols) = if key.trans_b {
            (key.n, key.k)
        } else {
            (key.k, key.n)
        };
        let bf16 = sys::cudaDataType_t::CUDA_R_16BF;
        let desc = cublas(
            "create matmul descriptor",
            lt::create_matmul_desc(
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cudaDataType_t::CUDA_R_32F,
            ),
        )?;
        let mut plan = Plan {
            desc,
            a: cublas(
                "layout A",
                lt::create_matrix_layout(bf16, a_rows, a_cols, key.lda),
            )?,
            b: std::ptr::null_mut(),
            d: std::ptr::null_mut(),
            // SAFETY: plain data, overwritten by the heuristic's choice below.
            algo: unsafe { std::mem::zeroed() },
        };
        plan.b = cublas(
            "layout B",
            lt::create_matrix_layout(bf16, b_rows, b_cols, key.ldb),
        )?;
        plan.d = cublas(
            "layout D",
            lt::create_matrix_layout(data_type(key.out_f32), key.m, key.n, key.ldd),
        )?;
        let set = |attr: sys::cublasLtMatmulDescAttributes_t, value: *const c_void, size: usize| {
            // SAFETY: `value` points to `size` readable bytes of the attribute's type.
            cublas("set descriptor attribute", unsafe {
                lt::set_matmul_desc_attribute(plan.desc, attr, value, size)
            })
        };
        let (ta, tb) = (key.trans_a as i32, key.trans_b as i32);
        set(
            sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
            &ta as *const i32 as *const c_void,
            size_of::<i32>(),
        )?;
        set(
            sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB,
            &tb as *const i32 as *const c_void,
            size_of::<i32>(),
        )?;
        let epilogue = if key.bias {
            sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS
        } else {
            sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DEFAULT
        };
        set(
            sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_EPILOGUE,
            &epilogue as *const sys::cublasLtEpilogue_t as *const c_void,
            size_of::<sys::cublasLtEpilogue_t>(),
        )?;

        let pref = cublas("create preference", lt::create_matmul_pref())?;
        let workspace = WORKSPACE_BYTES;
        // SAFETY: valid preference handle; the value is a usize as the attribute requires.
        let heuristic = unsafe {
            let set_ws = lt::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &workspace as *const usize as *const c_void,
                size_of::<usize>(),
            );
            let heuristic = set_ws.and_then(|_| {
                lt::get_matmul_algo_heuristic(
                    self.handle.0,
                    plan.desc,
                    plan.a,
                    plan.b,
                    plan.d,
                    plan.d,
                    pref,
                )
            });
            let _ = lt::destroy_matmul_pref(pref);
            heuristic
        };
        plan.algo = cublas(&format!("no algorithm for {key:?}"), heuristic)?.algo;
        Ok(plan)
    }

    /// Runs one planned problem. `bias` (length m, dtype of D) only with `key.bias`.
    ///
    /// # Safety
    /// The pointers must address device memory of the sizes `key` implies, on this device.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn run(
        &self,
        key: GemmKey,
        alpha: f32,
        a: CUdeviceptr,
        b: CUdeviceptr,
        beta: f32,
        d: CUdeviceptr,
        bias: Option<CUdeviceptr>,
    ) -> Result<()> {
        ensure!(
            key.bias == bias.is_some(),
            "GEMM bias flag and pointer disagree"
        );
        let mut plans = self
            .plans
            .lock()
            .map_err(|_| anyhow!("GEMM plan cache lock poisoned"))?;
        let plan = match plans.entry(key) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(self.plan(&key)?),
        };
        if let Some(bias) = bias {
            cublas(
                "set bias pointer",
                lt::set_matmul_desc_attribute(
                    plan.desc,
                    sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                    &bias as *const CUdeviceptr as *const c_void,
                    size_of::<CUdeviceptr>(),
                ),
            )?;
        }
        cublas(
            "matmul",
            lt::matmul(
                self.handle.0,
                plan.desc,
                &alpha as *const f32 as *const c_void,
                &beta as *const f32 as *const c_void,
                a as *const c_void,
                plan.a,
                b as *const c_void,
                plan.b,
                d as *const c_void,
                plan.d,
                d as *mut c_void,
                plan.d,
                &plan.algo,
                self.workspace_ptr as *mut c_void,
                WORKSPACE_BYTES,
                self.stream.cu_stream() as *mut _,
            ),
        )
    }

    /// `out[T, n] = x[T, k] W[n, k]^T (+ bias[n])`; x and W bf16, out bf16 or fp32 (bias only with
    /// a bf16 output, in bf16).
    pub fn linear(
        &self,
        x: &CudaTensor,
        weight: &CudaTensor,
        bias: Option<&CudaTensor>,
        out: &mut CudaTensor,
    ) -> Result<()> {
        ensure!(
            x.dtype() == DeviceDType::Bf16 && weight.dtype() == DeviceDType::Bf16,
            "linear: inputs must be bf16 (x {:?}, weight {:?})",
            x.dtype(),
            weight.dtype()
        );
        ensure!(
            weight.shape().len() == 2,
            "linear: weight {:?}",
            weight.shape()
        );
        let (n, k) = (weight.shape()[0], weight.shape()[1]);
        ensure!(
            x.cols() == k && !x.is_empty(),
            "linear: x {:?} for weight {:?}",
            x.shape(),
            weight.shape()
        );
        let t = x.rows();
        ensure!(
            out.len() == t * n,
            "linear: out {:?} for [{t}, {n}]",
            out.shape()
        );
        let out_f32 = out.dtype() == DeviceDType::F32;
        if let Some(b) = bias {
            if out_f32 || b.dtype() != DeviceDType::Bf16 || b.len() != n {
                bail!(
                    "linear: bias {:?} {:?} for a {:?} output of {n} features",
                    b.shape(),
                    b.dtype(),
                    out.dtype()
                );
            }
        }
        let key = GemmKey {
            trans_a: true,
            trans_b: false,
            m: n as u64,
            n: t as u64,
            k: k as u64,
            lda: k as i64,
            ldb: k as i64,
            ldd: n as i64,
            out_f32,
            bias: bias.is_some(),
            accumulate: false,
        };
        // SAFETY: the shapes were checked against the tensors' sizes above.
        unsafe {
            self.run(
                key,
                1.0,
                weight.ptr(),
                x.ptr(),
                0.0,
                out.ptr(),
                bias.map(|b| b.ptr()),
            )
        }
    }
}
