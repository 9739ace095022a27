//! The LM-head loss of RFT and DAPO (RL-SPEC.md), fused with the LM head: the CPU reference that
//! `kernels/dapo_loss.cu` is checked against.
//!
//! Rows: row `r` of a packed batch predicts `targets[r]`, the next token of its sequence; an
//! action row (`action_mask[r]`) is one whose target the policy generated. Per action row, with
//! `logp = log_softmax(h_r W^T)[targets[r]]`:
//!
//! ```text
//! masked CE (RFT)  term = logp                                   d term / d logp = 1
//! DAPO             rho  = exp(logp - old_logp)
//!                  term = w * min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A)
//!                                                                d term / d logp = w rho A when
//!                                                                the unclipped term is the min, else 0
//!                  w    = min(exp(old_logp - rollout_logp), tis_cap) with TIS, else 1
//! loss = -(1 / N_act) * sum over action rows of term
//! ```
//!
//! `N_act` is the whole optimizer batch's action-token count, passed in: a micro-batch's losses
//! and gradients then simply add up to the batch's (never a per-micro-batch mean).
//!
//! The `[T, V]` logits are never stored: the reference walks tiles of `ROW_CHUNK x VOCAB_CHUNK`
//! logits, in three steps every backend shares:
//!
//! ```text
//! pass 1   per row, over the LM head's rows: RowStats (m, s, u, z_target)    [lm_head_stats]
//!          (vocabulary parallel: each rank's shard, merged in rank order)      [merge_shards]
//! host     logprob, entropy, the terms; per row lse and coef = d loss / d logp [finish_rows]
//! pass 2   per tile, G = coef (onehot - softmax); d_hidden += G W, d_weight += G^T H
//!                                                                               [lm_head_loss_grad]
//! ```
//!
//! The reference's pass 1 finds each row's max (and target logit) in one sweep and
//! `s = sum exp(z - m)`, `u = sum exp(z - m) (z - m)` in a second, in vocabulary order: the sums
//! the scoring path and the sampler take, so its logprobs equal theirs bit for bit (the CUDA
//! kernel keeps an online, rescaled `(m, s, u)` in one sweep instead, and merges tiles).

use super::cpu::dot;
use anyhow::{bail, ensure, Result};

/// Rows of logits in one tile.
pub const ROW_CHUNK: usize = 16;
/// Vocabulary entries in one tile.
pub const VOCAB_CHUNK: usize = 512;

/// What the loss optimises.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Objective {
    /// RFT: masked cross-entropy on the action tokens.
    MaskedCe,
    /// DAPO's clipped token-level objective, optionally with truncated importance sampling.
    Dapo {
        eps_low: f32,
        eps_high: f32,
        /// `C` of the TIS factor `min(exp(old_logp - rollout_logp), C)`; `None`: no TIS.
        tis_cap: Option<f32>,
    },
}

/// Per-row inputs of one micro-batch (all `T` long; DAPO fields may be empty for masked CE and
/// `rollout_logprobs` is read only with TIS).
#[derive(Clone, Copy, Debug, Default)]
pub struct LossRows<'a> {
    pub targets: &'a [u32],
    pub action_mask: &'a [bool],
    pub advantages: &'a [f32],
    pub old_logprobs: &'a [f32],
    pub rollout_logprobs: &'a [f32],
}

/// What one call computed. `loss` is already divided by the global `N_act`, so the calls of one
/// optimizer step add up.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LossOutput {
    pub loss: f64,
    /// Action rows in this call.
    pub action_tokens: usize,
    /// `log p(targets[r])` for every row.
    pub logprobs: Vec<f32>,
    /// The policy's entropy at every row.
    pub entropy: Vec<f32>,
    /// Action rows with `A < 0` and `rho < 1 - eps_low` (the clipped term is the min).
    pub clipped_low: usize,
    /// Action rows with `A > 0` and `rho > 1 + eps_high`.
    pub clipped_high: usize,
    /// Sum over action rows of `|rho - 1|` (DAPO) for the mean-ratio metric.
    pub ratio_deviation_sum: f64,
}

impl LossOutput {
    /// Adds one action row's term to the report (the loss divided by the global `N_act`, the
    /// counts); returns the row's `d loss / d logp`.
    pub fn add_action_row(&mut self, term: &TokenTerm, num_action_tokens: f64) -> f64 {
        self.loss -= term.term / num_action_tokens;
        self.action_tokens += 1;
        self.clipped_low += term.clipped_low as usize;
        self.clipped_high += term.clipped_high as usize;
        self.ratio_deviation_sum += (term.ratio - 1.0).abs();
        -term.d_term_d_logp / num_action_tokens
    }
}

/// One action row's contribution: the term inside the sum and `d term / d logp`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TokenTerm {
    pub term: f64,
    pub d_term_d_logp: f64,
    pub ratio: f64,
    pub clipped_low: bool,
    pub clipped_high: bool,
}

/// The objective's term for one action row (see the module doc).
pub fn token_term(objective: &Objective, rows: &LossRows<'_>, r: usize, logp: f64) -> TokenTerm {
    match *objective {
        Objective::MaskedCe => TokenTerm {
            term: logp,
            d_term_d_logp: 1.0,
            ratio: 1.0,
            clipped_low: false,
            clipped_high: false,
        },
        Objective::Dapo {
            eps_low,
            eps_high,
            tis_cap,
        } => {
            let advantage = rows.advantages[r] as f64;
            let old = rows.old_logprobs[r] as f64;
            // The policy's logprob in the precision old logprobs are stored in (f32): the same
            // computation on the same weights then gives a ratio of exactly 1.
            let ratio = (logp as f32 as f64 - old).exp();
            let clipped_ratio = ratio.clamp(1.0 - eps_low as f64, 1.0 + eps_high as f64);
            let weight = match tis_cap {
                Some(cap) => (old - rows.rollout_logprobs[r] as f64)
                    .exp()
                    .min(cap as f64),
                None => 1.0,
            };
            let unclipped = ratio * advantage;
            let clipped = clipped_ratio * advantage;
            let takes_unclipped = unclipped <= clipped;
            TokenTerm {
                term: weight * unclipped.min(clipped),
                d_term_d_logp: if takes_unclipped {
                    weight * unclipped
                } else {
                    0.0
                },
                ratio,
                clipped_low: advantage < 0.0 && ratio < 1.0 - eps_low as f64,
                clipped_high: advantage > 0.0 && ratio > 1.0 + eps_high as f64,
            }
        }
    }
}

/// Checks the rows against `t` rows and a vocabulary of `vocab` (shared by every backend's loss).
pub fn check_rows(
    rows: &LossRows<'_>,
    objective: &Objective,
    t: usize,
    vocab: usize,
) -> Result<()> {
    ensure!(
        rows.targets.len() == t && rows.action_mask.len() == t,
        "loss: {} targets and {} mask entries for {t} rows",
        rows.targets.len(),
        rows.action_mask.len()
    );
    if let Some(&bad) = rows.targets.iter().find(|&&id| id as usize >= vocab) {
        bail!("loss: target id {bad} is outside the vocabulary of {vocab}");
    }
    if let Objective::Dapo { tis_cap, .. } = objective {
        ensure!(
            rows.advantages.len() == t && rows.old_logprobs.len() == t,
            "loss: DAPO needs advantages and old logprobs for all {t} rows"
        );
        if tis_cap.is_some() {
            ensure!(
                rows.rollout_logprobs.len() == t,
                "loss: TIS needs rollout logprobs for all {t} rows"
            );
        }
    }
    Ok(())
}

/// Logits of rows `rows` against vocabulary entries `vocab`, into `tile` (`rows x vocab`).
fn logits_tile(
    hidden: &[f32],
    weight: &[f32],
    d: usize,
    rows: std::ops::Range<usize>,
    vocab: std::ops::Range<usize>,
    tile: &mut Vec<f32>,
) {
    tile.clear();
    for r in rows {
        let h = &hidden[r * d..(r + 1) * d];
        tile.extend(vocab.clone().map(|j| dot(h, &weight[j * d..(j + 1) * d])));
    }
}

/// Pass 1's statistics of one row over a block of vocabulary columns (the whole vocabulary, or
/// one tensor-parallel rank's shard): its max logit `m`, `s = sum exp(z - m)`,
/// `u = sum exp(z - m) (z - m)` (centred, so the entropy never cancels two large numbers) and
/// its target's logit (0 when the target is not in the block). Every backend's pass 1 returns
/// these; ranks merge theirs with [`RowStats::merge_shards`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowStats {
    pub max: f64,
    pub sum_exp: f64,
    pub sum_exp_centered: f64,
    pub target_logit: f64,
}

impl RowStats {
    /// A row known by its target's score `x` and its f32 `(max, sum_exp)` (the device's
    /// sampler and `token_logprobs`, widened as the fused loss's statistics are).
    pub fn from_f32(x: f32, max: f32, sum_exp: f32) -> RowStats {
        RowStats {
            max: max as f64,
            sum_exp: sum_exp as f64,
            sum_exp_centered: 0.0,
            target_logit: x as f64,
        }
    }

    pub fn lse(&self) -> f64 {
        self.max + self.sum_exp.ln()
    }

    /// `log p(target)`, rounded as the CPU backend's `token_logprobs` and the sampler round it
    /// (`z - max - ln s`), so the trainer's logprobs equal the server's bit for bit.
    pub fn logprob(&self) -> f64 {
        self.target_logit - self.max - self.sum_exp.ln()
    }

    pub fn entropy(&self) -> f64 {
        self.sum_exp.ln() - self.sum_exp_centered / self.sum_exp
    }

    /// One row's statistics over the whole vocabulary from every rank's shard (`shards[rank]`,
    /// in rank order), the target's logit from `target_rank`'s: with `M = max m_k`,
    /// `s = sum s_k exp(m_k - M)` and `u = sum exp(m_k - M) (u_k + (m_k - M) s_k)` (the kernel's
    /// tile merge). One shard is returned unchanged, bit for bit.
    pub fn merge_shards(shards: &[RowStats], target_rank: usize) -> RowStats {
        let max = shards
            .iter()
            .map(|s| s.max)
            .fold(f64::NEG_INFINITY, f64::max);
        let (mut sum_exp, mut sum_exp_centered) = (0.0, 0.0);
        for s in shards {
            let (shift, scale) = (s.max - max, (s.max - max).exp());
            sum_exp += scale * s.sum_exp;
            sum_exp_centered += scale * (s.sum_exp_centered + shift * s.sum_exp);
        }
        RowStats {
            max,
            sum_exp,
            sum_exp_centered,
            target_logit: shards[target_rank].target_logit,
        }
    }
}

/// Between the passes, on the host: from each row's statistics over the whole vocabulary, the
/// loss report (logprob, entropy, the objective's terms with [`token_term`], clip counts) and
/// each row's `(lse, coef)` for pass 2, `coef = d loss / d logp` (0 outside the loss).
pub fn finish_rows(
    stats: &[RowStats],
    rows: &LossRows<'_>,
    objective: &Objective,
    num_action_tokens: f64,
) -> (LossOutput, Vec<f64>, Vec<f64>) {
    let t = stats.len();
    let mut out = LossOutput {
        logprobs: Vec::with_capacity(t),
        entropy: Vec::with_capacity(t),
        ..Default::default()
    };
    let mut lse = Vec::with_capacity(t);
    let mut coef = vec![0.0; t];
    for (r, row) in stats.iter().enumerate() {
        let logp = row.logprob();
        out.logprobs.push(logp as f32);
        out.entropy.push(row.entropy() as f32);
        lse.push(row.lse());
        if rows.action_mask.get(r) == Some(&true) {
            let term = token_term(objective, rows, r, logp);
            coef[r] = out.add_action_row(&term, num_action_tokens);
        }
    }
    (out, lse, coef)
}

/// Pass 1 over rows `rows`, tile by tile: one sweep for each row's max (and target logit), a
/// second for the sums with that max. Two sweeps rather than an online rescaled logsumexp: the
/// sums are then the very sums the scoring path and the sampler take over a whole row of logits
/// (the same `dot` as the backend's `linear`), so every logprob matches theirs exactly.
fn row_stats(
    hidden: &[f32],
    weight: &[f32],
    d: usize,
    rows: std::ops::Range<usize>,
    targets: &[u32],
    tile: &mut Vec<f32>,
) -> Vec<RowStats> {
    let vocab = weight.len() / d;
    let mut stats = vec![
        RowStats {
            max: f64::NEG_INFINITY,
            sum_exp: 0.0,
            sum_exp_centered: 0.0,
            target_logit: 0.0,
        };
        rows.len()
    ];
    for v0 in (0..vocab).step_by(VOCAB_CHUNK) {
        let v1 = (v0 + VOCAB_CHUNK).min(vocab);
        logits_tile(hidden, weight, d, rows.clone(), v0..v1, tile);
        for (i, row) in tile.chunks_exact(v1 - v0).enumerate() {
            let chunk_max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
            stats[i].max = stats[i].max.max(chunk_max);
            let target = targets[rows.start + i] as usize;
            if (v0..v1).contains(&target) {
                stats[i].target_logit = row[target - v0] as f64;
            }
        }
    }
    for v0 in (0..vocab).step_by(VOCAB_CHUNK) {
        let v1 = (v0 + VOCAB_CHUNK).min(vocab);
        logits_tile(hidden, weight, d, rows.clone(), v0..v1, tile);
        for (i, row) in tile.chunks_exact(v1 - v0).enumerate() {
            let row_stats = &mut stats[i];
            for &z in row {
                let centred = z as f64 - row_stats.max;
                let e = centred.exp();
                row_stats.sum_exp += e;
                row_stats.sum_exp_centered += e * centred;
            }
        }
    }
    stats
}

/// `(T, V)` of `hidden: [T, d]` against the LM head `weight: [V, d]`.
pub fn lm_head_rows(hidden: &[f32], weight: &[f32], d: usize) -> Result<(usize, usize)> {
    ensure!(
        d > 0 && hidden.len().is_multiple_of(d) && weight.len().is_multiple_of(d),
        "loss: hidden of {} and LM head of {} values for width {d}",
        hidden.len(),
        weight.len()
    );
    Ok((hidden.len() / d, weight.len() / d))
}

/// Pass 1 on host slices: every row's [`RowStats`] against `weight: [V, d]` (a whole LM head or
/// one rank's shard; `targets` are indices into it, [`super::OTHER_SHARD`] or any index past it
/// for a target another shard holds).
pub fn lm_head_stats_cpu(
    hidden: &[f32],
    weight: &[f32],
    d: usize,
    targets: &[u32],
) -> Result<Vec<RowStats>> {
    let (t, _) = lm_head_rows(hidden, weight, d)?;
    ensure!(
        targets.len() == t,
        "loss: {} targets for {t} rows",
        targets.len()
    );
    let mut stats = Vec::with_capacity(t);
    let mut tile = Vec::with_capacity(ROW_CHUNK * VOCAB_CHUNK);
    for r0 in (0..t).step_by(ROW_CHUNK) {
        let r1 = (r0 + ROW_CHUNK).min(t);
        stats.extend(row_stats(hidden, weight, d, r0..r1, targets, &mut tile));
    }
    Ok(stats)
}

/// Pass 2 on host slices: with each row's whole-vocabulary `lse` and `coef = d loss / d logp`,
/// the logits' gradient `coef (onehot - softmax)` tile by tile, then `d_hidden += G W` and
/// `d_weight += G^T H` (rows with `coef` 0 are skipped).
#[allow(clippy::too_many_arguments)]
pub fn lm_head_loss_grad_cpu(
    hidden: &[f32],
    weight: &[f32],
    d: usize,
    targets: &[u32],
    lse: &[f64],
    coef: &[f64],
    d_hidden: &mut [f32],
    d_weight: &mut [f32],
) -> Result<()> {
    let (t, vocab) = lm_head_rows(hidden, weight, d)?;
    ensure!(
        d_hidden.len() == hidden.len() && d_weight.len() == weight.len(),
        "loss: gradient buffers do not match hidden [{t}, {d}] and LM head [{vocab}, {d}]"
    );
    ensure!(
        targets.len() == t && lse.len() == t && coef.len() == t,
        "loss: {} targets, {} lse and {} coefficients for {t} rows",
        targets.len(),
        lse.len(),
        coef.len()
    );
    let mut tile = Vec::with_capacity(ROW_CHUNK * VOCAB_CHUNK);
    let mut d_logits = Vec::with_capacity(ROW_CHUNK * VOCAB_CHUNK);
    for r0 in (0..t).step_by(ROW_CHUNK) {
        let r1 = (r0 + ROW_CHUNK).min(t);
        if coef[r0..r1].iter().all(|&c| c == 0.0) {
            continue;
        }
        for v0 in (0..vocab).step_by(VOCAB_CHUNK) {
            let v1 = (v0 + VOCAB_CHUNK).min(vocab);
            let width = v1 - v0;
            logits_tile(hidden, weight, d, r0..r1, v0..v1, &mut tile);
            d_logits.clear();
            for (i, row) in tile.chunks_exact(width).enumerate() {
                let (target, c, row_lse) = (targets[r0 + i] as usize, coef[r0 + i], lse[r0 + i]);
                d_logits.extend(row.iter().enumerate().map(|(j, &z)| {
                    let onehot = if v0 + j == target { 1.0 } else { 0.0 };
                    (c * (onehot - (z as f64 - row_lse).exp())) as f32
                }));
            }
            for (i, g_row) in d_logits.chunks_exact(width).enumerate() {
                if coef[r0 + i] == 0.0 {
                    continue;
                }
                let r = r0 + i;
                let h = &hidden[r * d..(r + 1) * d];
                let dh = &mut d_hidden[r * d..(r + 1) * d];
                for (j, &g) in g_row.iter().enumerate() {
                    let w = &weight[(v0 + j) * d..(v0 + j + 1) * d];
                    let dw = &mut d_weight[(v0 + j) * d..(v0 + j + 1) * d];
                    for k in 0..d {
                        dh[k] += g * w[k];
                        dw[k] += g * h[k];
                    }
                }
            }
        }
    }
    Ok(())
}

/// The loss's forward alone: `log p(targets[r])` and the entropy of every row, the numbers
/// [`lm_head_loss_cpu`] reports for the same rows, with no gradient.
pub fn lm_head_logprobs_cpu(
    hidden: &[f32],
    weight: &[f32],
    d: usize,
    targets: &[u32],
) -> Result<(Vec<f32>, Vec<f32>)> {
    let (t, vocab) = lm_head_rows(hidden, weight, d)?;
    let no_action = vec![false; targets.len()];
    let rows = LossRows {
        targets,
        action_mask: &no_action,
        ..Default::default()
    };
    check_rows(&rows, &Objective::MaskedCe, t, vocab)?;
    let stats = lm_head_stats_cpu(hidden, weight, d, targets)?;
    let (out, _, _) = finish_rows(&stats, &rows, &Objective::MaskedCe, 1.0);
    Ok((out.logprobs, out.entropy))
}

/// The fused loss on host slices (pass 1, the host half, pass 2): `hidden: [T, d]`,
/// `weight: [V, d]`; accumulates into `d_hidden: [T, d]` and `d_weight: [V, d]`.
#[allow(clippy::too_many_arguments)]
pub fn lm_head_loss_cpu(
    hidden: &[f32],
    weight: &[f32],
    d: usize,
    rows: &LossRows<'_>,
    objective: &Objective,
    num_action_tokens: f64,
    d_hidden: &mut [f32],
    d_weight: &mut [f32],
) -> Result<LossOutput> {
    let (t, vocab) = lm_head_rows(hidden, weight, d)?;
    check_rows(rows, objective, t, vocab)?;
    ensure!(
        num_action_tokens > 0.0,
        "loss: the global action-token count is {num_action_tokens}"
    );
    let stats = lm_head_stats_cpu(hidden, weight, d, rows.targets)?;
    let (out, lse, coef) = finish_rows(&stats, rows, objective, num_action_tokens);
    lm_head_loss_grad_cpu(
        hidden,
        weight,
        d,
        rows.targets,
        &lse,
        &coef,
        d_hidden,
        d_weight,
    )?;
    Ok(out)
}
