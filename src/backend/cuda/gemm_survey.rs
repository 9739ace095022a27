//! One forward GEMM problem run with an algorithm the caller picks, and the algorithms cuBLASLt
//! offers for it without split-K: what `swerve-bench gemm` uses to find out, on a GPU, which of
//! cuBLASLt's per-M choices give a row the pinned algorithm's bits (issue 36, item 2: if a
//! choice per M keeps the K order, exact decode GEMMs need no pinning to a 4,096-row tile). The
//! engine and the trainer do not use it.

use super::gemm::{Gemm, GemmKey, Plan, WORKSPACE_BYTES};
use super::gemm_algo::{self as algo, AlgoConfig};
use anyhow::{ensure, Result};
use cudarc::cublaslt::sys;
use cudarc::driver::sys::CUdeviceptr;

/// A problem's descriptor and layouts, ready to run with any algorithm.
pub struct ExplicitPlan {
    plan: Plan,
    key: GemmKey,
}

/// One algorithm and what cuBLASLt says of it.
#[derive(Clone, Copy)]
pub struct Candidate {
    pub algo: sys::cublasLtMatmulAlgo_t,
    /// Workspace bytes it needs.
    pub workspace: usize,
    /// The heuristic's estimate of waves (0 where it gives none: the pinned algorithm).
    pub waves: f32,
    pub config: AlgoConfig,
}

impl Candidate {
    fn same_algo(&self, other: &Candidate) -> bool {
        self.algo.data == other.algo.data
    }
}

impl Gemm {
    /// The descriptor and layouts of `key` (a pinned key: its class's alignments are promised).
    pub fn explicit_plan(&self, key: GemmKey) -> Result<ExplicitPlan> {
        let plan = Plan::layouts(&key)?;
        plan.set_attributes(&key)?;
        Ok(ExplicitPlan { plan, key })
    }

    /// Up to `count` algorithms the heuristic offers for `plan`'s very problem without a
    /// reduction scheme (no split-K) within `workspace` bytes, best first, each distinct.
    pub fn no_split_k_candidates(
        &self,
        plan: &ExplicitPlan,
        workspace: usize,
        count: usize,
    ) -> Result<Vec<Candidate>> {
        let aligns = algo::pinned_alignments(&algo::algo_class(&plan.key));
        let results = algo::heuristic_results(
            self.handle.0,
            &plan.plan.problem(),
            workspace,
            aligns,
            true,
            count,
        )?;
        let mut out: Vec<Candidate> = Vec::new();
        for r in results {
            let c = Candidate {
                algo: r.algo,
                workspace: r.workspaceSize,
                waves: r.wavesCount,
                config: AlgoConfig::of(&r.algo),
            };
            if !out.iter().any(|o| o.same_algo(&c)) {
                out.push(c);
            }
        }
        Ok(out)
    }

    /// cuBLASLt's own choice for `plan`'s very problem, split-K allowed, the full workspace
    /// (what `--exact-logprobs false` runs; pointers taken as 256-byte aligned).
    pub fn per_problem_candidate(&self, plan: &ExplicitPlan) -> Result<Candidate> {
        let results = algo::heuristic_results(
            self.handle.0,
            &plan.plan.problem(),
            WORKSPACE_BYTES,
            [256; 4],
            false,
            1,
        )?;
        let r = &results[0];
        Ok(Candidate {
            algo: r.algo,
            workspace: r.workspaceSize,
            waves: r.wavesCount,
            config: AlgoConfig::of(&r.algo),
        })
    }

    /// The algorithm `key`'s pinned class runs at every M (what `--exact-logprobs` uses).
    pub fn pinned_candidate(&self, key: &GemmKey) -> Result<Candidate> {
        let algo = self.pinned_algorithm(key)?;
        Ok(Candidate {
            algo,
            workspace: 0,
            waves: 0.0,
            config: AlgoConfig::of(&algo),
        })
    }

    /// Whether `candidate` runs `plan`'s problem within the workspace (`cublasLtMatmulAlgoCheck`).
    pub fn candidate_runs(&self, plan: &ExplicitPlan, candidate: &Candidate) -> bool {
        algo::check(
            self.handle.0,
            &plan.plan.problem(),
            &candidate.algo,
            WORKSPACE_BYTES,
            &plan.key,
        )
        .is_ok()
    }

    /// `d = a op b (+ bias)` for `plan`'s problem with `candidate`'s algorithm (alpha 1, beta 0).
    ///
    /// # Safety
    /// The pointers must address device memory of the sizes `plan`'s key implies.
    pub unsafe fn run_explicit(
        &self,
        plan: &ExplicitPlan,
        candidate: &Candidate,
        a: CUdeviceptr,
        b: CUdeviceptr,
        d: CUdeviceptr,
        bias: Option<CUdeviceptr>,
    ) -> Result<()> {
        ensure!(
            plan.key.bias == bias.is_some(),
            "GEMM bias flag and pointer disagree"
        );
        self.matmul_with(&plan.plan, &candidate.algo, (1.0, 0.0), (a, b, d), bias)
    }
}
