//! How [`super::gemm::Gemm`] chooses a cuBLASLt algorithm: [`Pinning`], the class a pinned
//! algorithm is shared by ([`algo_class`]), the reference problem it is chosen on, the fixed
//! alignments, and the cuBLASLt calls (heuristic with or without split-K, the algo config's
//! `SPLITK_NUM`, `cublasLtMatmulAlgoCheck`). The canonical order these implement is written down
//! in `gemm.rs`'s module doc.

use anyhow::{anyhow, ensure, Result};
use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;
use std::ffi::c_void;
use std::mem::size_of;

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
    /// The smallest alignment (bytes, a power of two up to 256) of the A, B and D pointers; set
    /// by [`super::gemm::Gemm::run`] from the pointers themselves for a [`Pinning::PerProblem`] GEMM (0 for a
    /// pinned one, whose class fixes its alignments).
    pub align: u32,
    /// How the algorithm is chosen.
    pub pin: Pinning,
}

/// How a GEMM's algorithm is chosen.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Pinning {
    /// The heuristic's best for this very problem (its M, N and pointer alignment), split-K
    /// allowed: the backward-only GEMMs (`d_x`, `d_weight`, `d_bias`, the loss's gradient
    /// products), whose bits no sampler has to reproduce.
    PerProblem,
    /// One algorithm per (transposes, N, K, leading dimensions of the operands, dtypes,
    /// epilogue, accumulation), used for every M (token rows): the forward linear layers.
    Rows,
    /// One algorithm per (transposes, K, leading dimensions of the inputs, dtypes, epilogue,
    /// accumulation), used for every M and every N: the LM head, whose logits the engine takes
    /// over the whole vocabulary and the loss in vocabulary tiles (both must give equal bits).
    RowsAndCols,
}

/// Token rows (cuBLAS's n) of the reference problem a pinned algorithm is chosen on.
///
/// Tuning note (to be measured on a GPU; `swerve-bench`): the pinned algorithm runs decode
/// (M = 1..256 rows, bandwidth-bound: the weights stream once per step, and a tile chosen for
/// thousands of rows gives few CTAs when N / tile_n is small, with no split-K to spread K over
/// the SMs) and prefill / training (M in the thousands, compute-bound). 4096 sits where prefill
/// chunks and packed training micro-batches live, which carry nearly all the FLOPs; a smaller
/// reference favours decode latency at their expense. Whatever the value, it is one constant:
/// the choice never depends on which M came first.
pub const REFERENCE_ROWS: u64 = 4096;

/// Output columns (cuBLAS's m) of the reference problem of a [`Pinning::RowsAndCols`] GEMM:
/// the loss's vocabulary tile (`LossTiles::DEFAULT.vocab`).
pub const REFERENCE_COLS: u64 = 8192;

/// The alignment (bytes) a pinned GEMM promises the heuristic for every pointer whose rows
/// allow it: what Hopper's tensor-core kernels need for 128-bit loads.
pub const PINNED_ALIGNMENT: u32 = 16;

/// The key every problem of one pinned class maps to (M, and for [`Pinning::RowsAndCols`] N and
/// D's leading dimension, zeroed; the alignment fixed); a [`Pinning::PerProblem`] key is its own
/// class.
pub fn algo_class(key: &GemmKey) -> GemmKey {
    let mut class = *key;
    match key.pin {
        Pinning::PerProblem => return class,
        Pinning::Rows => {}
        Pinning::RowsAndCols => {
            // N varies (the whole vocabulary, a loss tile, the last tile); what the algorithm
            // needs to know of D's leading dimension is whether its rows stay 16-byte aligned:
            // 0 if so, 1 if not (an odd test vocabulary).
            let elem = if key.out_f32 { 4 } else { 2 };
            class.m = 0;
            class.ldd = i64::from(!(key.ldd as u64 * elem).is_multiple_of(PINNED_ALIGNMENT as u64));
        }
    }
    class.n = 0;
    class.align = 0;
    class
}

/// The minimum alignment (bytes) of the A, B, C and D pointers of a pinned class: 16 where the
/// leading dimension keeps every row (column in cuBLAS's terms) of a 16-byte-aligned base
/// 16-byte aligned, else the element size. A [`Pinning::RowsAndCols`] D is a whole (allocated,
/// 256-byte-aligned) logits buffer: 16 when its rows are (the class says), else the element.
pub fn pinned_alignments(class: &GemmKey) -> [u32; 4] {
    let fits = |ld: i64, elem: u32| {
        if (ld as u64 * elem as u64).is_multiple_of(PINNED_ALIGNMENT as u64) {
            PINNED_ALIGNMENT
        } else {
            elem
        }
    };
    let d_elem = if class.out_f32 { 4 } else { 2 };
    let d = match (class.pin, class.ldd) {
        (Pinning::RowsAndCols, 0) => PINNED_ALIGNMENT,
        (Pinning::RowsAndCols, _) => d_elem,
        _ => fits(class.ldd, d_elem),
    };
    [fits(class.lda, 2), fits(class.ldb, 2), d, d]
}

/// The problem a pinned class's algorithm is chosen on: the class at [`REFERENCE_ROWS`] rows
/// (and [`REFERENCE_COLS`] columns for [`Pinning::RowsAndCols`]), D packed.
pub fn reference_problem(class: &GemmKey) -> GemmKey {
    let mut key = *class;
    key.n = REFERENCE_ROWS;
    if class.pin == Pinning::RowsAndCols {
        key.m = REFERENCE_COLS;
        // A packed D, or one whose rows are not 16-byte aligned when the class's are not.
        key.ldd = REFERENCE_COLS as i64 + class.ldd;
    }
    key
}

/// Checks that every pointer meets the class's promised alignment: a pinned GEMM never falls
/// back to another algorithm for a less aligned view.
pub fn check_pinned_pointers(key: &GemmKey, aligns: [u32; 4], ptrs: [u64; 3]) -> Result<()> {
    for (what, ptr, align) in [
        ("A", ptrs[0], aligns[0]),
        ("B", ptrs[1], aligns[1]),
        ("D", ptrs[2], aligns[3]),
    ] {
        ensure!(
            ptr.is_multiple_of(align as u64),
            "pinned GEMM {key:?}: {what} = {ptr:#x} is not {align}-byte aligned, the alignment \
             its class's one algorithm was chosen for (a view at an odd offset?)"
        );
    }
    Ok(())
}

fn cublas<T>(what: &str, r: std::result::Result<T, lt::CublasError>) -> Result<T> {
    r.map_err(|e| anyhow!("cuBLASLt {what}: {e:?}"))
}

/// The raw layouts and descriptor a heuristic or check runs against.
pub(crate) struct Problem {
    pub desc: sys::cublasLtMatmulDesc_t,
    pub a: sys::cublasLtMatrixLayout_t,
    pub b: sys::cublasLtMatrixLayout_t,
    pub d: sys::cublasLtMatrixLayout_t,
}

/// The heuristic's best algorithm for `p` within `workspace` bytes and the `aligns` of A, B, C,
/// D; `no_split_k` restricts it to `CUBLASLT_REDUCTION_SCHEME_NONE` (no split-K reduction).
pub(crate) fn heuristic(
    handle: sys::cublasLtHandle_t,
    p: &Problem,
    workspace: usize,
    aligns: [u32; 4],
    no_split_k: bool,
) -> Result<sys::cublasLtMatmulAlgo_t> {
    let best = heuristic_results(handle, p, workspace, aligns, no_split_k, 1)?;
    best.first()
        .map(|r| r.algo)
        .ok_or_else(|| anyhow!("cuBLASLt heuristic: no algorithm for this problem"))
}

/// Up to `count` of the heuristic's algorithms for `p`, best first (see [`heuristic`]).
pub(crate) fn heuristic_results(
    handle: sys::cublasLtHandle_t,
    p: &Problem,
    workspace: usize,
    aligns: [u32; 4],
    no_split_k: bool,
    count: usize,
) -> Result<Vec<sys::cublasLtMatmulHeuristicResult_t>> {
    use sys::cublasLtMatmulPreferenceAttributes_t as P;
    let pref = cublas("create preference", lt::create_matmul_pref())?;
    let set = |attr: P, value: *const c_void, size: usize| {
        // SAFETY: valid preference handle; `value` points to `size` bytes of the attribute's type.
        unsafe { lt::set_matmul_pref_attribute(pref, attr, value, size) }
    };
    let mut r = set(
        P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
        &workspace as *const usize as *const c_void,
        size_of::<usize>(),
    );
    let attrs = [
        P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
        P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
        P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
    ];
    for (attr, align) in attrs.into_iter().zip(aligns.iter()) {
        r = r.and_then(|_| set(attr, align as *const u32 as *const c_void, size_of::<u32>()));
    }
    if no_split_k {
        let none = sys::cublasLtReductionScheme_t::CUBLASLT_REDUCTION_SCHEME_NONE as u32;
        r = r.and_then(|_| {
            set(
                P::CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                &none as *const u32 as *const c_void,
                size_of::<u32>(),
            )
        });
    }
    let count = count.clamp(1, 64);
    // SAFETY: plain data, written by the call.
    let mut results: Vec<sys::cublasLtMatmulHeuristicResult_t> =
        (0..count).map(|_| unsafe { std::mem::zeroed() }).collect();
    let mut returned = 0i32;
    let result = r.and_then(|_| {
        // SAFETY: the descriptor and layouts are live (owned by the caller's plan); `results`
        // holds `count` writable entries.
        let st = unsafe {
            sys::cublasLtMatmulAlgoGetHeuristic(
                handle,
                p.desc,
                p.a,
                p.b,
                p.d,
                p.d,
                pref,
                count as i32,
                results.as_mut_ptr(),
                &mut returned,
            )
        };
        match st {
            sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS => Ok(()),
            other => Err(lt::CublasError(other)),
        }
    });
    // SAFETY: created above, destroyed once.
    let _ = unsafe { lt::destroy_matmul_pref(pref) };
    cublas("heuristic (no algorithm for this problem)", result)?;
    results.truncate(returned.max(0) as usize);
    results.retain(|r| r.state == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS);
    ensure!(
        !results.is_empty(),
        "cuBLASLt heuristic: no algorithm for this problem"
    );
    Ok(results)
}

/// An algorithm's configuration as cuBLASLt reports it (`cublasLtMatmulAlgoConfigGetAttribute`):
/// what tells two kernels apart when their bits are compared. `None` where the library does not
/// report the attribute (the emulated device reports only some).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct AlgoConfig {
    pub id: Option<u64>,
    pub tile: Option<u64>,
    pub stages: Option<u64>,
    pub split_k: Option<u64>,
    pub reduction: Option<u64>,
    pub swizzle: Option<u64>,
    pub custom: Option<u64>,
    pub inner_shape: Option<u64>,
    pub cluster_shape: Option<u64>,
}

impl AlgoConfig {
    pub fn of(algo: &sys::cublasLtMatmulAlgo_t) -> AlgoConfig {
        use sys::cublasLtMatmulAlgoConfigAttributes_t as A;
        AlgoConfig {
            id: config_value(algo, A::CUBLASLT_ALGO_CONFIG_ID),
            tile: config_value(algo, A::CUBLASLT_ALGO_CONFIG_TILE_ID),
            stages: config_value(algo, A::CUBLASLT_ALGO_CONFIG_STAGES_ID),
            split_k: config_value(algo, A::CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
            reduction: config_value(algo, A::CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME),
            swizzle: config_value(algo, A::CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
            custom: config_value(algo, A::CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION),
            inner_shape: config_value(algo, A::CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID),
            cluster_shape: config_value(algo, A::CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID),
        }
    }

    /// `id/tile/stages/inner/cluster/swizzle/custom/splitk`, `-` for an unreported one.
    pub fn label(&self) -> String {
        let f = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
        format!(
            "{}/{}/{}/{}/{}/{}/{}/{}",
            f(self.id),
            f(self.tile),
            f(self.stages),
            f(self.inner_shape),
            f(self.cluster_shape),
            f(self.swizzle),
            f(self.custom),
            f(self.split_k)
        )
    }
}

/// One algo config attribute of at most 8 bytes (little-endian), `None` where unsupported.
fn config_value(
    algo: &sys::cublasLtMatmulAlgo_t,
    attr: sys::cublasLtMatmulAlgoConfigAttributes_t,
) -> Option<u64> {
    let mut size = 0usize;
    // SAFETY: the documented size query (NULL buffer, size 0).
    let st = unsafe {
        sys::cublasLtMatmulAlgoConfigGetAttribute(algo, attr, std::ptr::null_mut(), 0, &mut size)
    };
    if st != sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS || size == 0 || size > 8 {
        return None;
    }
    let mut bytes = [0u8; 8];
    let mut written = 0usize;
    // SAFETY: `bytes` holds the `size` <= 8 bytes the attribute has.
    let st = unsafe {
        sys::cublasLtMatmulAlgoConfigGetAttribute(
            algo,
            attr,
            bytes.as_mut_ptr() as *mut c_void,
            size,
            &mut written,
        )
    };
    (st == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS).then(|| u64::from_le_bytes(bytes))
}

/// A `u32` algo config attribute (`SPLITK_NUM`, `REDUCTION_SCHEME`).
fn config_u32(
    algo: &sys::cublasLtMatmulAlgo_t,
    attr: sys::cublasLtMatmulAlgoConfigAttributes_t,
) -> Result<u32> {
    let (mut value, mut written) = (0u32, 0usize);
    // SAFETY: `value` holds the 4 bytes the attribute has.
    let st = unsafe {
        sys::cublasLtMatmulAlgoConfigGetAttribute(
            algo,
            attr,
            &mut value as *mut u32 as *mut c_void,
            size_of::<u32>(),
            &mut written,
        )
    };
    ensure!(
        st == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS,
        "cuBLASLt algo config {attr:?}: {st:?}"
    );
    Ok(value)
}

fn set_config_u32(
    algo: &mut sys::cublasLtMatmulAlgo_t,
    attr: sys::cublasLtMatmulAlgoConfigAttributes_t,
    value: u32,
) -> Result<()> {
    // SAFETY: `value` is the 4 bytes the attribute holds.
    let st = unsafe {
        sys::cublasLtMatmulAlgoConfigSetAttribute(
            algo,
            attr,
            &value as *const u32 as *const c_void,
            size_of::<u32>(),
        )
    };
    ensure!(
        st == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS,
        "cuBLASLt set algo config {attr:?} = {value}: {st:?}"
    );
    Ok(())
}

/// `algo` with split-K off: `SPLITK_NUM` 1 and no reduction scheme (what the heuristic already
/// returns under the `NONE` mask; set again in case a library version ignores the mask).
pub fn without_split_k(mut algo: sys::cublasLtMatmulAlgo_t) -> Result<sys::cublasLtMatmulAlgo_t> {
    use sys::cublasLtMatmulAlgoConfigAttributes_t as A;
    if config_u32(&algo, A::CUBLASLT_ALGO_CONFIG_SPLITK_NUM)? != 1 {
        set_config_u32(&mut algo, A::CUBLASLT_ALGO_CONFIG_SPLITK_NUM, 1)?;
        let none = sys::cublasLtReductionScheme_t::CUBLASLT_REDUCTION_SCHEME_NONE as u32;
        set_config_u32(&mut algo, A::CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, none)?;
    }
    Ok(algo)
}

/// `cublasLtMatmulAlgoCheck`: whether the pinned `algo` runs `p` within `workspace` bytes. An
/// M (or N) it does not support is an error naming the problem, never a silent fallback.
pub(crate) fn check(
    handle: sys::cublasLtHandle_t,
    p: &Problem,
    algo: &sys::cublasLtMatmulAlgo_t,
    workspace: usize,
    key: &GemmKey,
) -> Result<()> {
    // SAFETY: plain data, written by the call.
    let mut result: sys::cublasLtMatmulHeuristicResult_t = unsafe { std::mem::zeroed() };
    // SAFETY: live handle, descriptor and layouts; `result` is writable.
    let st = unsafe {
        sys::cublasLtMatmulAlgoCheck(handle, p.desc, p.a, p.b, p.d, p.d, algo, &mut result)
    };
    ensure!(
        st == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS,
        "cuBLASLt: the pinned algorithm of this GEMM's class does not run {key:?} ({st:?}); the \
         class's configuration must serve every row count (issue 25), so this is refused rather \
         than run with another algorithm"
    );
    ensure!(
        result.workspaceSize <= workspace,
        "cuBLASLt: the pinned algorithm needs {} bytes of workspace for {key:?}, {workspace} \
         available",
        result.workspaceSize
    );
    Ok(())
}
