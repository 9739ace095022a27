//! GEMMs through cuBLASLt (DESIGN.md decision 4): bf16 inputs, fp32 accumulation, bf16 or fp32
//! output, the bias add fused as an epilogue.
//!
//! Row-major `out[T, n] = x[T, k] W[n, k]^T + b` is, in cuBLAS's column-major terms,
//! `out^T[n, T] = op(W)[n, k] x^T[k, T]` with `op = transpose`: A = W (stored k x n, ld k,
//! transposed), B = x (k x T, ld k), C = D = out (n x T, ld n), and the bias runs along the n rows
//! of C, which is what `CUBLASLT_EPILOGUE_BIAS` broadcasts.
//!
//! # The canonical order (issue 25, DESIGN.md decision 10)
//!
//! A token's logits and logprob must have the same f32 bits whether the engine computes its row
//! in a decode batch of 3 rows, a prefill chunk of 2,000, or the trainer in a packed micro-batch
//! of 16,384. cuBLASLt's result for an output element depends only on the algorithm that
//! computes it: the kernel's tile sizes fix the order in which its k products are summed, and
//! split-K (several CTAs each summing a slice of k, then a reduction) changes that order. The
//! heuristic picks the algorithm per problem, M included (it splits K when M x N is too small to
//! fill the GPU), so left alone it gives a row different bits at different batch sizes. Hence:
//!
//! - **Forward GEMMs keep one K order per class** ([`Pinning::Rows`]): each (transposes, N, K,
//!   leading dimensions, dtypes, epilogue, accumulation) class has a reference algorithm, the
//!   heuristic's best for the class at a reference M of
//!   [`REFERENCE_ROWS`](super::gemm_algo::REFERENCE_ROWS) rows (a constant, so the choice never
//!   depends on which batch came first), asked with `CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK
//!   = NONE` (no split-K) and its `SPLITK_NUM` forced to 1 (no fixed split either), and with a
//!   minimum pointer alignment fixed by the class (16 bytes where the leading dimensions allow,
//!   [`pinned_alignments`](super::gemm_algo::pinned_alignments)), so a view at an odd row offset
//!   gets the same algorithm, and a less aligned pointer is an error, not another algorithm.
//!   Each problem then runs the heuristic's own no-split-K, no-workspace choice for its M (narrow
//!   tiles that stream the weights at decode sizes) once a probe has shown that it gives the
//!   reference's bits, else the reference itself (`gemm_rows.rs`, issue 36). Each new M is
//!   checked with `cublasLtMatmulAlgoCheck`; an M the algorithm cannot run is an error naming the
//!   problem, never a silent fallback. These are q/k/v (with bias), o, gate/up and down.
//! - **The LM head is pinned across N too** ([`Pinning::RowsAndCols`]): one algorithm per
//!   (transposes, K, dtypes, ...), chosen at [`REFERENCE_COLS`](super::gemm_algo::REFERENCE_COLS)
//!   x `REFERENCE_ROWS`, because the engine (and `swerve-train score`) computes logits over the
//!   whole vocabulary (N = V) while the fused loss computes the same logits in vocabulary tiles
//!   (N = `LossTiles::vocab`, and a shorter last tile). Same k order, same bits; each (M, N)
//!   problem runs its own probed choice as above.
//!   [`Gemm::linear`] with an fp32 output is the LM head (the model's only fp32-output forward
//!   GEMM); the loss's tiles say so explicitly.
//! - **Backward-only GEMMs are not pinned** ([`Pinning::PerProblem`]: `d_x`, `d_weight`,
//!   `d_bias`, the loss's gradient products): the heuristic's best per problem and pointer
//!   alignment, split-K allowed. No sampler reproduces their bits.
//!
//! The logprob that follows from the logits has its own canonical order (vocabulary chunks,
//! merged left to right): `kernels/logsumexp.cuh`.
//!
//! Descriptors and layouts are built once per distinct problem and cached (the model has a
//! handful of shapes per batch size), with the class's algorithm; a call then only sets the bias
//! pointer and launches. One 32 MiB workspace (NVIDIA's recommendation for Hopper) serves all.
//!
//! Training adds the general row-major product [`RowMajorGemm`] (either operand transposed,
//! `beta = 1` to accumulate into bf16 or fp32 outputs) and, on it, the backward of a linear
//! layer (`gemm_backward.rs`). How an algorithm is chosen and pinned: `gemm_algo.rs`.

use super::gemm_algo::{self as algo, algo_class};
pub use super::gemm_algo::{GemmKey, Pinning};
use super::tensor::{CudaTensor, DeviceDType};
use anyhow::{anyhow, bail, ensure, Context, Result};
use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use std::collections::HashMap;
use std::ffi::c_void;
use std::mem::size_of;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Whether GEMMs run pinned (one configuration per class for every M: rollout and trainer
/// logprobs equal bit for bit) or per problem (cuBLASLt's heuristic for each shape: faster decode,
/// logprobs within rounding). A process-wide choice, made once from the command line
/// (`--exact-logprobs`) before any model is built: the engine and the trainer of one process must
/// agree. On by default.
static EXACT_LOGPROBS: AtomicBool = AtomicBool::new(true);

/// See [`EXACT_LOGPROBS`]. Plans made before a change keep their algorithms: call it before any
/// GEMM runs.
pub fn set_exact_logprobs(on: bool) {
    EXACT_LOGPROBS.store(on, Ordering::SeqCst);
}

/// See [`EXACT_LOGPROBS`].
pub fn exact_logprobs() -> bool {
    EXACT_LOGPROBS.load(Ordering::SeqCst)
}

/// The cuBLASLt workspace every GEMM of a stream shares (allocated once per stream).
pub const WORKSPACE_BYTES: usize = 32 << 20;

impl GemmKey {
    /// The forward linear `out[t, n] = x[t, k] W[n, k]^T (+ b)` as cuBLASLt's problem (module
    /// doc), packed operands, pinned: an fp32 output is the LM head, pinned across N as well.
    pub fn linear(n: usize, k: usize, t: usize, out_f32: bool, bias: bool) -> GemmKey {
        GemmKey {
            trans_a: true,
            trans_b: false,
            m: n as u64,
            n: t as u64,
            k: k as u64,
            lda: k as i64,
            ldb: k as i64,
            ldd: n as i64,
            out_f32,
            bias,
            accumulate: false,
            align: 256,
            pin: if out_f32 {
                Pinning::RowsAndCols
            } else {
                Pinning::Rows
            },
        }
    }
}

impl RowMajorGemm {
    /// The column-major cuBLASLt problem this is (see the type's doc): cuBLAS's A is `b`.
    pub fn key(&self) -> GemmKey {
        GemmKey {
            trans_a: self.trans_b,
            trans_b: self.trans_a,
            m: self.n as u64,
            n: self.m as u64,
            k: self.k as u64,
            lda: self.ldb as i64,
            ldb: self.lda as i64,
            ldd: self.ldo as i64,
            out_f32: self.out_f32,
            bias: false,
            accumulate: self.beta != 0.0,
            align: 256,
            pin: self.pin,
        }
    }
}

/// The alignment in bytes (a power of two, at most 256) common to every pointer.
fn common_alignment(ptrs: &[CUdeviceptr]) -> u32 {
    ptrs.iter()
        .map(|&p| {
            if p == 0 {
                256
            } else {
                1u64 << p.trailing_zeros().min(8)
            }
        })
        .min()
        .unwrap_or(256) as u32
}

/// One row-major product `out[M, N] = alpha op(a)[M, K] op(b)[K, N] + beta out` (bf16 operands,
/// fp32 accumulation; `out` bf16 or fp32). `lda`, `ldb`, `ldo` are the stored matrices' row
/// strides in elements: `a` is stored `[M, K]` (`[K, M]` when `trans_a`), `b` `[K, N]` (`[N, K]`
/// when `trans_b`).
///
/// In cuBLAS's column-major terms this is `out^T = op(b)^T op(a)^T`: cuBLAS's A is our `b` and its
/// B our `a`, with the transpose flags carried over and m = N, n = M.
#[derive(Clone, Copy, Debug)]
pub struct RowMajorGemm {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a: CUdeviceptr,
    pub lda: usize,
    pub trans_a: bool,
    pub b: CUdeviceptr,
    pub ldb: usize,
    pub trans_b: bool,
    pub out: CUdeviceptr,
    pub ldo: usize,
    pub out_f32: bool,
    pub alpha: f32,
    pub beta: f32,
    /// How its algorithm is chosen: [`Pinning::PerProblem`] for backward-only products.
    pub pin: Pinning,
}

pub(super) struct Plan {
    pub(super) desc: sys::cublasLtMatmulDesc_t,
    pub(super) a: sys::cublasLtMatrixLayout_t,
    pub(super) b: sys::cublasLtMatrixLayout_t,
    pub(super) d: sys::cublasLtMatrixLayout_t,
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

impl Plan {
    pub(super) fn problem(&self) -> algo::Problem {
        algo::Problem {
            desc: self.desc,
            a: self.a,
            b: self.b,
            d: self.d,
        }
    }

    /// The matmul descriptor (fp32 compute and scale) and the bf16 A, B and (bf16 or f32) D
    /// layouts of `key`; the algorithm is left for the heuristic.
    pub(super) fn layouts(key: &GemmKey) -> Result<Plan> {
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
            // SAFETY: plain data, overwritten by the heuristic's choice.
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
        Ok(plan)
    }

    /// The descriptor's transposes and epilogue (bias or none).
    pub(super) fn set_attributes(&self, key: &GemmKey) -> Result<()> {
        let set = |attr: sys::cublasLtMatmulDescAttributes_t, value: *const c_void, size: usize| {
            // SAFETY: `value` points to `size` readable bytes of the attribute's type.
            cublas("set descriptor attribute", unsafe {
                lt::set_matmul_desc_attribute(self.desc, attr, value, size)
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
        Ok(())
    }
}

pub(super) struct Handle(pub(super) sys::cublasLtHandle_t);

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
    pub(super) stream: Arc<CudaStream>,
    // Plans are dropped before the handle (field order).
    plans: Mutex<HashMap<GemmKey, Plan>>,
    /// Each pinned class's one algorithm ([`algo_class`] keys).
    pinned: Mutex<HashMap<GemmKey, sys::cublasLtMatmulAlgo_t>>,
    /// The mutation issue 25's tests run: every GEMM planned per problem (see
    /// [`Gemm::set_unpinned`]).
    unpinned: AtomicBool,
    /// Run every pinned problem with its class's reference algorithm, never one fitted to its M
    /// (see [`Gemm::set_class_algorithm_only`]).
    pub(super) class_only: AtomicBool,
    /// Per (class, algorithm): whether the algorithm gave the class's reference bits on a probe
    /// (`gemm_rows.rs`).
    pub(super) verified: Mutex<HashMap<(GemmKey, [u64; 8]), bool>>,
    /// The mutation issue 36's tests run: per-M algorithms trusted without a probe.
    pub(super) unprobed: AtomicBool,
    pub(super) handle: Handle,
    _workspace: CudaSlice<u8>,
    pub(super) workspace_ptr: CUdeviceptr,
    /// bf16 ones for column sums as GEMMs, grown to the longest column seen.
    ones: Mutex<Option<(CudaSlice<u16>, CUdeviceptr)>>,
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
            pinned: Mutex::new(HashMap::new()),
            unpinned: AtomicBool::new(false),
            class_only: AtomicBool::new(false),
            verified: Mutex::new(HashMap::new()),
            unprobed: AtomicBool::new(false),
            handle,
            _workspace: workspace,
            workspace_ptr,
            ones: Mutex::new(None),
        })
    }

    /// Distinct problems planned so far.
    pub fn cached_plans(&self) -> usize {
        self.plans.lock().map(|p| p.len()).unwrap_or(0)
    }

    /// Tests only (issue 25's mutation): with `true`, every GEMM is planned as cuBLASLt's
    /// heuristic would plan it per problem (M included, split-K allowed), which makes a row's
    /// bits depend on the batch size; `false` restores the pinning. Clears the plan cache.
    pub fn set_unpinned(&self, unpinned: bool) -> Result<()> {
        self.unpinned.store(unpinned, Ordering::SeqCst);
        self.plans
            .lock()
            .map_err(|_| anyhow!("GEMM plan cache lock poisoned"))?
            .clear();
        Ok(())
    }

    /// Benchmarks and tests: with `true`, every pinned problem runs its class's reference
    /// algorithm (one tile for every M: the first exact GEMMs, slow at decode sizes) instead of
    /// the algorithm fitted to its M; the bits are the same either way. Clears the plan cache.
    pub fn set_class_algorithm_only(&self, on: bool) -> Result<()> {
        self.class_only.store(on, Ordering::SeqCst);
        self.plans
            .lock()
            .map_err(|_| anyhow!("GEMM plan cache lock poisoned"))?
            .clear();
        Ok(())
    }

    /// A plan for `key`: layouts and descriptor, then its algorithm: the heuristic's for this
    /// problem, or for a pinned class the one fitted to this M that keeps the class's bits
    /// (`gemm_rows.rs`), checked against this problem.
    fn plan(&self, key: &GemmKey, a: CUdeviceptr, bias: Option<CUdeviceptr>) -> Result<Plan> {
        let mut plan = Plan::layouts(key)?;
        plan.set_attributes(key)?;
        if key.pin == Pinning::PerProblem {
            let aligns = [key.align; 4];
            plan.algo = algo::heuristic(
                self.handle.0,
                &plan.problem(),
                WORKSPACE_BYTES,
                aligns,
                false,
            )?;
        } else {
            let reference = self.pinned_algorithm(key)?;
            plan.algo = self.row_tiled_algorithm(&plan, key, reference, a, bias)?;
            algo::check(
                self.handle.0,
                &plan.problem(),
                &plan.algo,
                WORKSPACE_BYTES,
                key,
            )?;
        }
        Ok(plan)
    }

    /// The one algorithm of `key`'s pinned class: the heuristic's best, without split-K, for
    /// the class's reference problem, chosen the first time the class is seen.
    pub(super) fn pinned_algorithm(&self, key: &GemmKey) -> Result<sys::cublasLtMatmulAlgo_t> {
        let class = algo_class(key);
        let mut pinned = self
            .pinned
            .lock()
            .map_err(|_| anyhow!("GEMM algorithm cache lock poisoned"))?;
        if let Some(a) = pinned.get(&class) {
            return Ok(*a);
        }
        let reference = algo::reference_problem(&class);
        let plan = Plan::layouts(&reference)?;
        plan.set_attributes(&reference)?;
        let aligns = algo::pinned_alignments(&class);
        let chosen = algo::heuristic(
            self.handle.0,
            &plan.problem(),
            WORKSPACE_BYTES,
            aligns,
            true,
        )
        .with_context(|| format!("choosing the pinned algorithm for {reference:?}"))?;
        let chosen = algo::without_split_k(chosen)?;
        pinned.insert(class, chosen);
        Ok(chosen)
    }

    /// `key` as planned: a pinned key's alignment is its class's (checked against the
    /// pointers), a per-problem key's the pointers' own; the test mutation plans everything
    /// per problem.
    fn planned_key(
        &self,
        key: GemmKey,
        a: CUdeviceptr,
        b: CUdeviceptr,
        d: CUdeviceptr,
    ) -> Result<GemmKey> {
        let mut key = key;
        if self.unpinned.load(Ordering::SeqCst) || !exact_logprobs() {
            key.pin = Pinning::PerProblem;
        }
        if key.pin == Pinning::PerProblem {
            key.align = common_alignment(&[a, b, d]);
        } else {
            key.align = 0;
            algo::check_pinned_pointers(&key, algo::pinned_alignments(&key), [a, b, d])?;
        }
        Ok(key)
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
        let key = self.planned_key(key, a, b, d)?;
        let mut plans = self
            .plans
            .lock()
            .map_err(|_| anyhow!("GEMM plan cache lock poisoned"))?;
        let plan = match plans.entry(key) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(self.plan(&key, a, bias)?),
        };
        let algo = plan.algo;
        self.matmul_with(plan, &algo, (alpha, beta), (a, b, d), bias)
    }

    /// `d = alpha a op b + beta d (+ bias)` for `plan`'s problem with `algo`: the one
    /// `cublasLtMatmul` call (the plan's own algorithm, or a probe's or survey's).
    ///
    /// # Safety
    /// The pointers must address device memory of the sizes the plan's layouts describe.
    pub(super) unsafe fn matmul_with(
        &self,
        plan: &Plan,
        algo: &sys::cublasLtMatmulAlgo_t,
        (alpha, beta): (f32, f32),
        (a, b, d): (CUdeviceptr, CUdeviceptr, CUdeviceptr),
        bias: Option<CUdeviceptr>,
    ) -> Result<()> {
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
                algo,
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
        // x is [T, k] or any shape of T * k elements whose trailing dims make k (attention's
        // [T, heads, head_dim] output into o_proj), as in the CPU reference.
        ensure!(
            k > 0 && !x.is_empty() && x.len().is_multiple_of(k),
            "linear: x {:?} for weight {:?}",
            x.shape(),
            weight.shape()
        );
        let t = x.len() / k;
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
        let key = GemmKey::linear(n, k, t, out_f32, bias.is_some());
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

    /// Runs one [`RowMajorGemm`].
    ///
    /// # Safety
    /// The pointers must address device memory holding the matrices the sizes and strides imply.
    pub unsafe fn row_major(&self, g: RowMajorGemm) -> Result<()> {
        let (a_rows, a_cols) = if g.trans_a { (g.k, g.m) } else { (g.m, g.k) };
        let (b_rows, b_cols) = if g.trans_b { (g.n, g.k) } else { (g.k, g.n) };
        ensure!(
            g.m > 0 && g.n > 0 && g.k > 0,
            "GEMM of an empty matrix: [{}, {}] x [{}, {}]",
            g.m,
            g.k,
            g.k,
            g.n
        );
        ensure!(
            g.lda >= a_cols && g.ldb >= b_cols && g.ldo >= g.n,
            "GEMM strides {} / {} / {} below the rows' {a_cols} / {b_cols} / {}",
            g.lda,
            g.ldb,
            g.ldo,
            g.n
        );
        let _ = (a_rows, b_rows);
        self.run(g.key(), g.alpha, g.b, g.a, g.beta, g.out, None)
    }

    /// A device vector of at least `len` bf16 ones.
    pub(super) fn ones(&self, len: usize) -> Result<CUdeviceptr> {
        let mut ones = self
            .ones
            .lock()
            .map_err(|_| anyhow!("GEMM ones lock poisoned"))?;
        if let Some((slice, ptr)) = ones.as_ref() {
            if slice.len() >= len {
                return Ok(*ptr);
            }
        }
        let len = len.next_power_of_two().max(1024);
        let host = vec![half::bf16::ONE.to_bits(); len];
        let slice = self
            .stream
            .clone_htod(&host)
            .context("uploading the column-sum ones")?;
        let ptr = {
            let (ptr, _sync) = slice.device_ptr(&self.stream);
            ptr
        };
        *ones = Some((slice, ptr));
        Ok(ptr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rm(m: usize, n: usize, k: usize, lda: usize, ta: bool, ldb: usize, tb: bool) -> GemmKey {
        RowMajorGemm {
            m,
            n,
            k,
            a: 0,
            lda,
            trans_a: ta,
            b: 0,
            ldb,
            trans_b: tb,
            out: 0,
            ldo: n,
            out_f32: false,
            alpha: 1.0,
            beta: 0.0,
            pin: Pinning::PerProblem,
        }
        .key()
    }

    #[test]
    fn row_major_products_map_to_the_column_major_problem() {
        // The forward linear `x[T, k] W[n, k]^T` is the key `Gemm::linear` builds by hand.
        let (t, k, n) = (5, 96, 24);
        let key = rm(t, n, k, k, false, k, true);
        let linear = GemmKey {
            trans_a: true,
            trans_b: false,
            m: n as u64,
            n: t as u64,
            k: k as u64,
            lda: k as i64,
            ldb: k as i64,
            ldd: n as i64,
            out_f32: false,
            bias: false,
            accumulate: false,
            align: 256,
            pin: Pinning::PerProblem,
        };
        assert_eq!(key, linear);
        // d_weight[n, k] = d_out^T[n, T] x[T, k]: cuBLAS A = x (k x T, ld k), B = d_out^T.
        let key = rm(n, k, t, n, true, k, false);
        assert_eq!((key.trans_a, key.trans_b), (false, true));
        assert_eq!((key.m, key.n, key.k), (k as u64, n as u64, t as u64));
        assert_eq!((key.lda, key.ldb, key.ldd), (k as i64, n as i64, k as i64));
    }

    #[test]
    fn alignment_is_the_largest_common_power_of_two() {
        assert_eq!(common_alignment(&[0x1000, 0x2000]), 256);
        assert_eq!(common_alignment(&[0x1000, 0x1010]), 16);
        assert_eq!(common_alignment(&[0x1002, 0x1000]), 2);
        assert_eq!(common_alignment(&[]), 256);
    }
}
