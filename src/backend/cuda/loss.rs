//! The fused LM-head loss on the GPU (`BackendGrad::lm_head_stats` and `lm_head_loss_grad`, the
//! two passes; the trait's provided `lm_head_loss` runs them with the host half between):
//! cuBLASLt GEMMs for the logits tiles and the two gradient products, `kernels/dapo_loss.cu` for
//! everything element-wise, the objective's per-row terms on the host
//! ([`crate::backend::loss::finish_rows`], shared with the reference).
//!
//! ```text
//! pass 1  for each tile of rows x vocab:   logits = h W^T (fp32 scratch)      [GEMM]
//!                                          stats[row] merged with the tile's  [lm_loss_stats_f32]
//!         read the stats (16 bytes a row) as RowStats
//! host    (vocabulary parallel: every rank's RowStats merged, `model::parallel`) lse, logp,
//!         entropy, the loss terms and coef[row] = d loss / d logp_row, in f64 (`finish_rows`)
//! pass 2  for each row chunk with a non-zero coef, each vocabulary chunk:
//!             logits = h W^T again                                  [GEMM, recomputed]
//!             g = coef (onehot - exp(logits - lse)) in bf16         [lm_loss_dlogits_bf16]
//!             dh_acc (f32) (+)= g W_chunk                           [GEMM, K = vocab chunk]
//!             d_weight[chunk] += g^T h_rows (f32)                   [GEMM, K = row chunk]
//!         d_hidden[rows] += dh_acc (rounded to bf16 once)
//! ```
//!
//! Never allocated: `[T, V]` anything. The extra memory is [`LossTiles::scratch_bytes`]: at
//! T = 32k, V = 152k, d = 3584 with the default tiles about 0.52 GB (fp32 logits tile 256 MiB,
//! its bf16 gradient 128 MiB, the f32 hidden-gradient accumulator 112 MiB, 28 bytes a row).
//!
//! Gradient dtypes: `d_hidden` is an activation gradient (bf16, `+=`); `d_weight` a parameter
//! gradient (f32, `+=`; the embedding's when the head is tied). One host round trip per call
//! (the stats), between the passes.

use super::backend::{pod_vec, CudaBackend};
use super::gemm::{Pinning, RowMajorGemm};
pub use super::loss_tiles::LossTiles;
use super::tensor::{CudaTensor, DeviceDType};
use super::{as_i32, grid_stride_config, CudaDevice};
use crate::backend::loss::{check_rows, finish_rows, LossOutput, LossRows, Objective, RowStats};
use anyhow::{ensure, Result};
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{LaunchConfig, PushKernelArg};

/// Checks the loss's bf16 `hidden [T, d]` against the LM head `[V, d]`; returns `(T, V, d)`.
fn check_lm_head(hidden: &CudaTensor, weight: &CudaTensor) -> Result<(usize, usize, usize)> {
    for (what, t) in [("hidden", hidden), ("LM head", weight)] {
        ensure!(
            t.dtype() == DeviceDType::Bf16,
            "loss: {what} is {:?}, expected Bf16",
            t.dtype()
        );
    }
    ensure!(
        weight.shape().len() == 2,
        "loss: LM head {:?}",
        weight.shape()
    );
    let (vocab, d) = (weight.shape()[0], weight.shape()[1]);
    ensure!(
        d > 0 && vocab > 0 && !hidden.is_empty() && hidden.len().is_multiple_of(d),
        "loss: hidden {:?} against the LM head {:?}",
        hidden.shape(),
        weight.shape()
    );
    Ok((hidden.len() / d, vocab, d))
}

fn check_tiles(tiles: LossTiles) -> Result<()> {
    ensure!(
        tiles.rows > 0 && tiles.rows <= 65535 && tiles.vocab > 0,
        "loss: tiles {tiles:?}"
    );
    Ok(())
}

/// Byte offset of element `i` of a tensor of `dtype`.
fn at(t: &CudaTensor, i: usize) -> CUdeviceptr {
    t.ptr() + (i * t.dtype().size()) as u64
}

impl CudaDevice {
    /// `lm_loss_stats_f32` over one logits tile of `rows x cols` at vocabulary offset `v0`;
    /// `stats` and `targets` point at the tile's first row.
    #[allow(clippy::too_many_arguments)]
    fn lm_loss_stats(
        &self,
        stats: CUdeviceptr,
        logits: &CudaTensor,
        targets: CUdeviceptr,
        rows: usize,
        cols: usize,
        v0: usize,
        first_tile: bool,
    ) -> Result<()> {
        let (rows_i, cols_i, v0_i) = (
            as_i32("rows", rows)?,
            as_i32("cols", cols)?,
            as_i32("v0", v0)?,
        );
        let first = first_tile as i32;
        let f = self.function("dapo_loss", "lm_loss_stats_f32")?;
        let z = logits.ptr();
        let mut launch = self.stream.launch_builder(&f);
        launch
            .arg(&stats)
            .arg(&z)
            .arg(&targets)
            .arg(&rows_i)
            .arg(&cols_i)
            .arg(&v0_i)
            .arg(&first);
        let config = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: argument order and types match the kernel; the caller sized every buffer.
        unsafe { launch.launch(config) }?;
        Ok(())
    }

    /// `lm_loss_dlogits_bf16`: `g [rows, cols]` from the logits tile; `lse`, `coef`, `targets`
    /// point at the tile's first row.
    #[allow(clippy::too_many_arguments)]
    fn lm_loss_dlogits(
        &self,
        g: &CudaTensor,
        logits: &CudaTensor,
        lse: CUdeviceptr,
        coef: CUdeviceptr,
        targets: CUdeviceptr,
        rows: usize,
        cols: usize,
        v0: usize,
    ) -> Result<()> {
        let (rows_i, cols_i, v0_i) = (
            as_i32("rows", rows)?,
            as_i32("cols", cols)?,
            as_i32("v0", v0)?,
        );
        let f = self.function("dapo_loss", "lm_loss_dlogits_bf16")?;
        let (gp, z) = (g.ptr(), logits.ptr());
        let mut launch = self.stream.launch_builder(&f);
        launch
            .arg(&gp)
            .arg(&z)
            .arg(&lse)
            .arg(&coef)
            .arg(&targets)
            .arg(&rows_i)
            .arg(&cols_i)
            .arg(&v0_i);
        let per_block = 256 * 4; // LossGradConfig::threads * per_thread
        let config = LaunchConfig {
            grid_dim: (cols.div_ceil(per_block) as u32, rows as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: argument order and types match the kernel; the caller sized every buffer.
        unsafe { launch.launch(config) }?;
        Ok(())
    }

    /// `dst[0..n] += src[0..n]` (bf16 += f32) at raw addresses.
    fn add_f32_into_bf16_at(&self, dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> Result<()> {
        let n_i = n as i64;
        let f = self.function("convert", "add_f32_into_bf16")?;
        let mut launch = self.stream.launch_builder(&f);
        launch.arg(&dst).arg(&src).arg(&n_i);
        // SAFETY: the caller guarantees n elements at both addresses.
        unsafe { launch.launch(grid_stride_config(self, n, 256)) }?;
        Ok(())
    }
}

impl CudaBackend {
    /// Pass 1 alone: each row's softmax statistics `(m, s, u, z_target)`, on the host. `hidden`
    /// `[T, d]` and `weight` `[V, d]` are checked by the caller.
    fn loss_row_stats(
        &self,
        hidden: &CudaTensor,
        weight: &CudaTensor,
        targets: &[u32],
        tiles: LossTiles,
    ) -> Result<Vec<f32>> {
        let (vocab, d) = (weight.shape()[0], weight.shape()[1]);
        let t = hidden.len() / d;
        let (tile_rows, tile_vocab) = (tiles.rows.min(t), tiles.vocab.min(vocab));
        let targets = self.upload_pod(targets, &[t], DeviceDType::U32)?;
        let stats = self.alloc(&[t, 4], DeviceDType::F32)?;
        let logits = self.alloc(&[tile_rows, tile_vocab], DeviceDType::F32)?;
        let chunks =
            |n: usize, step: usize| (0..n).step_by(step).map(move |s| (s, step.min(n - s)));
        for (r0, nr) in chunks(t, tile_rows) {
            for (v0, nv) in chunks(vocab, tile_vocab) {
                self.logits_tile(hidden, weight, d, r0, nr, v0, nv, &logits)?;
                self.device.lm_loss_stats(
                    at(&stats, r0 * 4),
                    &logits,
                    at(&targets, r0),
                    nr,
                    nv,
                    v0,
                    v0 == 0,
                )?;
            }
        }
        Ok(pod_vec(&self.read_bytes(&stats)?))
    }

    /// Pass 1 with explicit tiles (the trait's `lm_head_stats` uses [`LossTiles::DEFAULT`]):
    /// every row's [`RowStats`], read back to the host (16 bytes a row).
    pub fn lm_head_stats_tiled(
        &self,
        hidden: &CudaTensor,
        weight: &CudaTensor,
        targets: &[u32],
        tiles: LossTiles,
    ) -> Result<Vec<RowStats>> {
        let (t, _, _) = check_lm_head(hidden, weight)?;
        ensure!(
            targets.len() == t,
            "loss: {} targets for {t} rows",
            targets.len()
        );
        check_tiles(tiles)?;
        let stats = self.loss_row_stats(hidden, weight, targets, tiles)?;
        Ok(stats
            .chunks_exact(4)
            .map(|s| RowStats {
                max: s[0] as f64,
                sum_exp: s[1] as f64,
                sum_exp_centered: s[2] as f64,
                target_logit: s[3] as f64,
            })
            .collect())
    }

    /// Pass 2 with explicit tiles: recompute each tile, its gradient (from the rows' `lse` and
    /// `coef`, rounded to f32 for the device), and both gradient GEMMs.
    #[allow(clippy::too_many_arguments)]
    pub fn lm_head_loss_grad_tiled(
        &self,
        hidden: &CudaTensor,
        weight: &CudaTensor,
        targets: &[u32],
        lse: &[f64],
        coef: &[f64],
        d_hidden: &mut CudaTensor,
        d_weight: &mut CudaTensor,
        tiles: LossTiles,
    ) -> Result<()> {
        for (what, t, dtype) in [
            ("d_hidden", &*d_hidden, DeviceDType::Bf16),
            ("d_weight", &*d_weight, DeviceDType::F32),
        ] {
            ensure!(
                t.dtype() == dtype,
                "loss: {what} is {:?}, expected {dtype:?}",
                t.dtype()
            );
        }
        let (t, vocab, d) = check_lm_head(hidden, weight)?;
        ensure!(
            d_hidden.len() == hidden.len() && d_weight.len() == weight.len(),
            "loss: gradient buffers {:?} / {:?} do not match hidden [{t}, {d}] and LM head \
             [{vocab}, {d}]",
            d_hidden.shape(),
            d_weight.shape()
        );
        ensure!(
            targets.len() == t && lse.len() == t && coef.len() == t,
            "loss: {} targets, {} lse and {} coefficients for {t} rows",
            targets.len(),
            lse.len(),
            coef.len()
        );
        check_tiles(tiles)?;
        if coef.iter().all(|&c| c == 0.0) {
            return Ok(());
        }
        let lse: Vec<f32> = lse.iter().map(|&x| x as f32).collect();
        let coef: Vec<f32> = coef.iter().map(|&x| x as f32).collect();
        let (tile_rows, tile_vocab) = (tiles.rows.min(t), tiles.vocab.min(vocab));
        let chunks =
            |n: usize, step: usize| (0..n).step_by(step).map(move |s| (s, step.min(n - s)));
        let targets = self.upload_pod(targets, &[t], DeviceDType::U32)?;
        let logits = self.alloc(&[tile_rows, tile_vocab], DeviceDType::F32)?;
        let lse_dev = self.upload_pod(&lse, &[t], DeviceDType::F32)?;
        let coef_dev = self.upload_pod(&coef, &[t], DeviceDType::F32)?;
        let g = self.alloc(&[tile_rows, tile_vocab], DeviceDType::Bf16)?;
        let dh_acc = self.alloc(&[tile_rows, d], DeviceDType::F32)?;
        for (r0, nr) in chunks(t, tile_rows) {
            if coef[r0..r0 + nr].iter().all(|&c| c == 0.0) {
                continue;
            }
            for (v0, nv) in chunks(vocab, tile_vocab) {
                self.logits_tile(hidden, weight, d, r0, nr, v0, nv, &logits)?;
                self.device.lm_loss_dlogits(
                    &g,
                    &logits,
                    at(&lse_dev, r0),
                    at(&coef_dev, r0),
                    at(&targets, r0),
                    nr,
                    nv,
                    v0,
                )?;
                self.loss_grad_gemms(&g, hidden, weight, d_weight, &dh_acc, r0, nr, v0, nv, d)?;
            }
            self.device
                .add_f32_into_bf16_at(at(d_hidden, r0 * d), dh_acc.ptr(), nr * d)?;
        }
        Ok(())
    }

    /// Both gradient GEMMs of one tile: `dh_acc (+)= g W[v0..]` and `d_weight[v0..] += g^T h`.
    #[allow(clippy::too_many_arguments)]
    fn loss_grad_gemms(
        &self,
        g: &CudaTensor,
        hidden: &CudaTensor,
        weight: &CudaTensor,
        d_weight: &CudaTensor,
        dh_acc: &CudaTensor,
        r0: usize,
        nr: usize,
        v0: usize,
        nv: usize,
        d: usize,
    ) -> Result<()> {
        // SAFETY (both): the offsets and sizes lie inside the checked tensors.
        unsafe {
            // dh_acc[nr, d] (+)= g[nr, nv] W[v0.., nv x d]
            self.gemm.row_major(RowMajorGemm {
                m: nr,
                n: d,
                k: nv,
                a: g.ptr(),
                lda: nv,
                trans_a: false,
                b: at(weight, v0 * d),
                ldb: d,
                trans_b: false,
                out: dh_acc.ptr(),
                ldo: d,
                out_f32: true,
                alpha: 1.0,
                beta: if v0 == 0 { 0.0 } else { 1.0 },
                pin: Pinning::PerProblem,
            })?;
            // d_weight[v0.., nv x d] += g^T[nv, nr] h[r0.., nr x d]
            self.gemm.row_major(RowMajorGemm {
                m: nv,
                n: d,
                k: nr,
                a: g.ptr(),
                lda: nv,
                trans_a: true,
                b: at(hidden, r0 * d),
                ldb: d,
                trans_b: false,
                out: at(d_weight, v0 * d),
                ldo: d,
                out_f32: true,
                alpha: 1.0,
                beta: 1.0,
                pin: Pinning::PerProblem,
            })
        }
    }

    /// The loss's forward alone (pass 1 and the host half): every row's logprob of its target
    /// and entropy, the numbers [`Self::fused_lm_head_loss`] reports for the same rows.
    pub fn fused_lm_head_logprobs(
        &self,
        hidden: &CudaTensor,
        weight: &CudaTensor,
        targets: &[u32],
        tiles: LossTiles,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let (t, vocab, _) = check_lm_head(hidden, weight)?;
        let action_mask = vec![false; t];
        let rows = LossRows {
            targets,
            action_mask: &action_mask,
            ..Default::default()
        };
        check_rows(&rows, &Objective::MaskedCe, t, vocab)?;
        let stats = self.lm_head_stats_tiled(hidden, weight, targets, tiles)?;
        let (out, _, _) = finish_rows(&stats, &rows, &Objective::MaskedCe, 1.0);
        Ok((out.logprobs, out.entropy))
    }

    /// The fused loss with explicit tiles (pass 1, the host half, pass 2: what the trait's
    /// provided `lm_head_loss` composes with [`LossTiles::DEFAULT`]; tests use small tiles to
    /// exercise the merging).
    #[allow(clippy::too_many_arguments)]
    pub fn fused_lm_head_loss(
        &self,
        hidden: &CudaTensor,
        weight: &CudaTensor,
        rows: &LossRows<'_>,
        objective: &Objective,
        num_action_tokens: f64,
        d_hidden: &mut CudaTensor,
        d_weight: &mut CudaTensor,
        tiles: LossTiles,
    ) -> Result<LossOutput> {
        let (t, vocab, _) = check_lm_head(hidden, weight)?;
        check_rows(rows, objective, t, vocab)?;
        ensure!(
            num_action_tokens > 0.0,
            "loss: the global action-token count is {num_action_tokens}"
        );
        let stats = self.lm_head_stats_tiled(hidden, weight, rows.targets, tiles)?;
        let (out, lse, coef) = finish_rows(&stats, rows, objective, num_action_tokens);
        let targets = rows.targets;
        self.lm_head_loss_grad_tiled(
            hidden, weight, targets, &lse, &coef, d_hidden, d_weight, tiles,
        )?;
        Ok(out)
    }

    /// `logits[nr, nv] = hidden[r0.., nr x d] weight[v0.., nv x d]^T` in fp32.
    #[allow(clippy::too_many_arguments)]
    fn logits_tile(
        &self,
        hidden: &CudaTensor,
        weight: &CudaTensor,
        d: usize,
        r0: usize,
        nr: usize,
        v0: usize,
        nv: usize,
        logits: &CudaTensor,
    ) -> Result<()> {
        // SAFETY: rows r0..r0 + nr of hidden and v0..v0 + nv of weight exist (the callers walk
        // the checked sizes); the scratch holds nr x nv f32.
        unsafe {
            self.gemm.row_major(RowMajorGemm {
                m: nr,
                n: nv,
                k: d,
                a: at(hidden, r0 * d),
                lda: d,
                trans_a: false,
                b: at(weight, v0 * d),
                ldb: d,
                trans_b: true,
                out: logits.ptr(),
                ldo: nv,
                out_f32: true,
                alpha: 1.0,
                beta: 0.0,
                // The LM head's logits: the algorithm of the engine's full-vocabulary logits
                // (gemm.rs, the canonical order), so a tile's logits are bit for bit theirs.
                pin: Pinning::RowsAndCols,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::LossTiles;
    use crate::backend::loss::{finish_rows, lm_head_loss_cpu, LossRows, Objective, RowStats};

    /// The kernel's merge of two tiles' `(m, s, u)` (dapo_loss.cu), mirrored for the host test.
    fn merge(a: [f64; 3], b: [f64; 3]) -> [f64; 3] {
        let big = a[0].max(b[0]);
        let (a1, a2) = ((a[0] - big).exp(), (b[0] - big).exp());
        [
            big,
            a1 * a[1] + a2 * b[1],
            a1 * (a[2] + (a[0] - big) * a[1]) + a2 * (b[2] + (b[0] - big) * b[1]),
        ]
    }

    #[test]
    fn finalized_stats_give_the_reference_loss() {
        // A small problem: logits from the reference's own dot products, statistics merged tile
        // by tile as the kernel does, then the host half of the GPU loss.
        let (t, vocab, d) = (9, 23, 5);
        let val = |i: usize, k: f32| ((i * 7919 % 211) as f32 / 211.0 - 0.5) * k;
        let hidden: Vec<f32> = (0..t * d).map(|i| val(i, 4.0)).collect();
        let weight: Vec<f32> = (0..vocab * d).map(|i| val(i + 77, 2.0)).collect();
        let targets: Vec<u32> = (0..t as u32).map(|r| (r * 5 + 3) % vocab as u32).collect();
        let mask: Vec<bool> = (0..t).map(|r| r % 3 != 0).collect();
        let advantages: Vec<f32> = (0..t)
            .map(|r| if r % 2 == 0 { 1.0 } else { -0.7 })
            .collect();
        let old: Vec<f32> = (0..t).map(|r| -3.0 + 0.3 * (r % 4) as f32).collect();
        let rows = LossRows {
            targets: &targets,
            action_mask: &mask,
            advantages: &advantages,
            old_logprobs: &old,
            rollout_logprobs: &old,
        };
        let mut stats = Vec::with_capacity(t);
        for r in 0..t {
            let z: Vec<f64> = (0..vocab)
                .map(|j| {
                    (0..d)
                        .map(|k| hidden[r * d + k] * weight[j * d + k])
                        .sum::<f32>() as f64
                })
                .collect();
            let mut acc: Option<[f64; 3]> = None;
            for tile in z.chunks(7) {
                let m = tile.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let s = tile.iter().map(|x| (x - m).exp()).sum::<f64>();
                let u = tile.iter().map(|x| (x - m).exp() * (x - m)).sum::<f64>();
                acc = Some(acc.map_or([m, s, u], |a| merge(a, [m, s, u])));
            }
            let [m, s, u] = acc.unwrap();
            // As the device reports them: f32, widened on the host.
            stats.push(RowStats {
                max: m as f32 as f64,
                sum_exp: s as f32 as f64,
                sum_exp_centered: u as f32 as f64,
                target_logit: z[targets[r] as usize] as f32 as f64,
            });
        }
        for objective in [
            Objective::MaskedCe,
            Objective::Dapo {
                eps_low: 0.2,
                eps_high: 0.28,
                tis_cap: None,
            },
        ] {
            let (mut dh, mut dw) = (vec![0.0; t * d], vec![0.0; vocab * d]);
            let want = lm_head_loss_cpu(
                &hidden, &weight, d, &rows, &objective, 10.0, &mut dh, &mut dw,
            )
            .unwrap();
            let (got, lse, coef) = finish_rows(&stats, &rows, &objective, 10.0);
            assert!(
                (got.loss - want.loss).abs() < 1e-5,
                "{objective:?}: {} vs {}",
                got.loss,
                want.loss
            );
            assert_eq!(got.action_tokens, want.action_tokens);
            assert_eq!(
                (got.clipped_low, got.clipped_high),
                (want.clipped_low, want.clipped_high)
            );
            for r in 0..t {
                assert!(
                    (got.logprobs[r] - want.logprobs[r]).abs() < 1e-5,
                    "row {r} logprob"
                );
                assert!(
                    (got.entropy[r] - want.entropy[r]).abs() < 1e-5,
                    "row {r} entropy"
                );
                assert!(lse[r].is_finite());
                assert_eq!(
                    coef[r] == 0.0,
                    !mask[r] || got_clipped(&objective, &rows, r, got.logprobs[r])
                );
            }
        }
    }

    /// Whether DAPO's clipped branch (zero gradient) is taken at row `r`.
    fn got_clipped(objective: &Objective, rows: &LossRows<'_>, r: usize, logp: f32) -> bool {
        crate::backend::loss::token_term(objective, rows, r, logp as f64).d_term_d_logp == 0.0
    }

    #[test]
    fn default_tiles_fit_the_issue_budget() {
        // T = 32k, V = 152k (Qwen2.5's padded vocabulary), d = 3584 (7B): <= 1 GB extra.
        let bytes = LossTiles::DEFAULT.scratch_bytes(32_768, 152_064, 3584);
        assert!(bytes <= 1_000_000_000, "{bytes} bytes");
        assert!(
            bytes > 500_000_000,
            "{bytes} bytes: the formula lost a buffer"
        );
        // Small problems allocate only what they use.
        assert_eq!(
            LossTiles::DEFAULT.scratch_bytes(3, 5, 2),
            3 * 5 * 6 + 3 * 2 * 4 + 3 * 28
        );
    }
}
