//! Exact forward GEMMs with tiles fitted to M (issue 36, item 2).
//!
//! A pinned class (`gemm.rs`: one (N, K, layout) of a forward linear layer or the LM head) has a
//! reference algorithm, chosen at 4,096 rows without split-K: its K order defines the class's
//! bits. Run at every M, it is 2-4x slower than it need be at decode sizes (a tile made for
//! thousands of rows leaves most SMs idle when the weights stream for a handful). What decides a
//! row's bits is only the order of the sums over K (the MMA chain each output element is
//! accumulated by), not the M or N tiling, so each problem instead runs cuBLASLt's first choice for
//! its own M without a reduction scheme (no split-K) and without workspace (no stream-K partials):
//!
//! ```text
//!  class (N, K)    reference algorithm (4,096 rows)      defines the bits
//!  problem M = 3   heuristic(M = 3, no split-K, ws 0) ──► probe: same bits as the reference?
//!                     yes ─► run it (narrow tiles: the weights at bandwidth)
//!                     no  ─► run the reference (and say so once)
//! ```
//!
//! The probe runs both algorithms on the problem's own weights and about [`PROBE_OUTPUTS`] / N
//! rows of random inputs (where the algorithm runs that many rows; else the problem's own M, at
//! most 64) and compares every output bit; the answer is kept per (class, algorithm), so
//! each algorithm is probed once per class. Measured on an H100 (`swerve-bench gemm`, every
//! Qwen2.5 shape at TP 1-8, M 1-4,096): every such choice kept the reference bits, and ran the
//! decode GEMMs at 50-79% of the copy bandwidth against 17-52% for the reference. The probe
//! keeps that a checked fact on every card and library version rather than an assumption. Inside
//! a CUDA graph capture (no probe can run there) an unprobed algorithm is not used: the graph
//! runs the reference, with the same bits (the engine's eager warm-up before each capture plans
//! and probes the same problems first).

use super::gemm::{Gemm, GemmKey, Plan, WORKSPACE_BYTES};
use super::gemm_algo::{self as algo, algo_class};
use crate::rng::{Rng, XorShift64};
use anyhow::{anyhow, Context, Result};
use cudarc::cublaslt::sys;
use cudarc::driver::sys::{CUdeviceptr, CUstreamCaptureStatus};
use cudarc::driver::{CudaSlice, DevicePtr};
use std::sync::atomic::{AtomicBool, Ordering};

/// Outputs a probe aims for: enough that a K order differing by an ulp or two of f32 in a few
/// outputs out of a hundred flips at least one bf16 output (each such difference does with a
/// chance of about 2^-15): the rows are this over N, between [`MIN_PROBE_ROWS`] and
/// [`MAX_PROBE_ROWS`].
pub const PROBE_OUTPUTS: u64 = 1 << 20;
pub const MIN_PROBE_ROWS: u64 = 64;
pub const MAX_PROBE_ROWS: u64 = 4096;

type Algo = sys::cublasLtMatmulAlgo_t;

/// Whether pinned problems may run an algorithm fitted to their M (the default) or always their
/// class's reference algorithm (`swerve-bench --exact-gemm-tiles class`, to measure what the
/// fitting gains; the bits are the same). Process-wide, set before any GEMM runs.
static TILES_PER_M: AtomicBool = AtomicBool::new(true);

/// See [`TILES_PER_M`].
pub fn set_tiles_per_m(on: bool) {
    TILES_PER_M.store(on, Ordering::SeqCst);
}

impl Gemm {
    /// The algorithm a pinned problem runs (module doc): the heuristic's no-split-K,
    /// no-workspace choice for this M when it gives the class's reference bits, else
    /// `reference`.
    pub(super) fn row_tiled_algorithm(
        &self,
        plan: &Plan,
        key: &GemmKey,
        reference: Algo,
        a: CUdeviceptr,
        bias: Option<CUdeviceptr>,
    ) -> Result<Algo> {
        // An accumulating product (beta 1) would need C saved and restored around a probe.
        if self.class_only.load(Ordering::SeqCst)
            || !TILES_PER_M.load(Ordering::SeqCst)
            || key.accumulate
        {
            return Ok(reference);
        }
        let class = algo_class(key);
        let aligns = algo::pinned_alignments(&class);
        let candidate = match algo::heuristic(self.handle.0, &plan.problem(), 0, aligns, true) {
            Ok(found) => algo::without_split_k(found)?,
            Err(_) => return Ok(reference),
        };
        if candidate.data == reference.data {
            return Ok(candidate);
        }
        let id = (class, candidate.data);
        let known = self
            .verified
            .lock()
            .map_err(|_| anyhow!("GEMM probe cache lock poisoned"))?
            .get(&id)
            .copied();
        let same = match known {
            Some(same) => same,
            None if self.unprobed.load(Ordering::SeqCst) => true,
            None if self.capturing()? => return Ok(reference),
            None => {
                let same = self
                    .same_bits(key, &candidate, &reference, a, bias)
                    .with_context(|| format!("probing a per-M GEMM algorithm for {key:?}"))?;
                if !same {
                    eprintln!(
                        "swerve: cuBLASLt's algorithm for {key:?} gives other bits than its \
                         class's reference algorithm (another order of the sums over K); that \
                         problem runs the reference (exact, slower)"
                    );
                }
                self.verified
                    .lock()
                    .map_err(|_| anyhow!("GEMM probe cache lock poisoned"))?
                    .insert(id, same);
                same
            }
        };
        Ok(if same { candidate } else { reference })
    }

    /// Probes so far: (algorithms that kept their class's bits, algorithms that did not).
    pub fn probes(&self) -> Result<(usize, usize)> {
        let verified = self
            .verified
            .lock()
            .map_err(|_| anyhow!("GEMM probe cache lock poisoned"))?;
        let kept = verified.values().filter(|&&same| same).count();
        Ok((kept, verified.len() - kept))
    }

    /// Tests only (issue 36's mutation): with `true`, per-M algorithms run without a probe, so a
    /// library choice that sums K in another order changes a row's bits. Clears the plan cache.
    pub fn set_unprobed(&self, on: bool) -> Result<()> {
        self.unprobed.store(on, Ordering::SeqCst);
        self.verified
            .lock()
            .map_err(|_| anyhow!("GEMM probe cache lock poisoned"))?
            .clear();
        self.set_class_algorithm_only(false)
    }

    fn capturing(&self) -> Result<bool> {
        let status = self
            .stream
            .capture_status()
            .context("querying the stream's capture status")?;
        Ok(status != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }

    /// Whether `candidate` and `reference` give the same output bits for `key`'s weights (A,
    /// at `a`) and bias on random inputs (module doc). `false` where either cannot run a probe.
    fn same_bits(
        &self,
        key: &GemmKey,
        candidate: &Algo,
        reference: &Algo,
        a: CUdeviceptr,
        bias: Option<CUdeviceptr>,
    ) -> Result<bool> {
        let many = (PROBE_OUTPUTS / key.m.max(1)).clamp(MIN_PROBE_ROWS, MAX_PROBE_ROWS);
        for rows in [many, key.n.min(MIN_PROBE_ROWS)] {
            let mut probe = *key;
            probe.n = rows;
            let plan = Plan::layouts(&probe)?;
            plan.set_attributes(&probe)?;
            let runs = |algo: &Algo| {
                algo::check(
                    self.handle.0,
                    &plan.problem(),
                    algo,
                    WORKSPACE_BYTES,
                    &probe,
                )
                .is_ok()
            };
            if runs(candidate) && runs(reference) {
                return self.probe(&plan, &probe, [candidate, reference], a, bias);
            }
        }
        Ok(false)
    }

    /// Runs both algorithms on `probe`'s problem with random inputs and compares the outputs.
    fn probe(
        &self,
        plan: &Plan,
        probe: &GemmKey,
        algos: [&Algo; 2],
        a: CUdeviceptr,
        bias: Option<CUdeviceptr>,
    ) -> Result<bool> {
        // B (the inputs): `ldb` elements per stored column, k columns when transposed, else n.
        let b_cols = if probe.trans_b { probe.k } else { probe.n };
        let b_len = (probe.ldb as u64 * b_cols) as usize;
        let mut rng = XorShift64::new(0x9e37_79b9);
        let inputs: Vec<u16> = (0..b_len)
            .map(|_| half::bf16::from_f32(rng.next_signed_f32()).to_bits())
            .collect();
        let b = self
            .stream
            .clone_htod(&inputs)
            .context("uploading probe inputs")?;
        let elem = if probe.out_f32 { 4 } else { 2 };
        let d_len = probe.ldd as usize * probe.n as usize * elem;
        let mut outs = Vec::new();
        for algo in algos {
            let d: CudaSlice<u8> = self.stream.alloc_zeros(d_len).context("probe output")?;
            let (b_ptr, d_ptr) = (device_ptr(&b, &self.stream), device_ptr(&d, &self.stream));
            // SAFETY: the probe's buffers have the sizes its layouts describe; the weights and
            // bias are the real problem's.
            unsafe { self.matmul_with(plan, algo, (1.0, 0.0), (a, b_ptr, d_ptr), bias) }?;
            outs.push(d);
        }
        let first = self
            .stream
            .clone_dtoh(&outs[0])
            .context("reading a probe")?;
        let second = self
            .stream
            .clone_dtoh(&outs[1])
            .context("reading a probe")?;
        Ok(first == second)
    }
}

fn device_ptr<T>(
    slice: &CudaSlice<T>,
    stream: &std::sync::Arc<cudarc::driver::CudaStream>,
) -> CUdeviceptr
where
    CudaSlice<T>: DevicePtr<T>,
{
    let (ptr, _sync) = slice.device_ptr(stream);
    ptr
}
