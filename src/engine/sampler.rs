//! Token sampling on the host, RL-correct (DESIGN.md decision 9; RL-SPEC.md "Sampling during
//! rollouts"): one row of logits in, one token and the logprob the trainer must see out.
//!
//! The contract:
//!
//! - **`temperature == 0`: greedy.** The argmax of the logits, ties to the lowest id; no draw from
//!   the rng. The reported logprob is [`log_softmax_at`]`(logits, token)`, the model's own
//!   distribution.
//! - **Otherwise** the sampled distribution is `softmax(logits / temperature)` restricted to the
//!   tokens kept by, in this order:
//!   1. `top_k`: the k most likely tokens (ties by id; k above the vocabulary means all);
//!   2. `top_p`: the smallest prefix of the descending-probability order (of the top_k-restricted
//!      distribution, renormalised) whose mass is >= `top_p`; at least one token;
//!   3. `min_p`: the tokens with `p >= min_p * p_max` (a ratio, so renormalising does not move it);
//!
//!   then renormalised. All three keep prefixes of the same order, so the most likely token always
//!   stays. Scores `z / temperature`, weights `exp(score - max)` and all sums are in f64.
//! - **Exactly one uniform draw** `u` in [0, 1) per sample (also when no token can be sampled), and
//!   an inverse CDF: the first kept token whose running weight sum exceeds `u * total`. The order
//!   walked is the vocabulary's index order when no filter is on (`top_k` off or >= vocabulary,
//!   `top_p >= 1`, `min_p <= 0`), and descending probability, ties by id, otherwise. Same seed,
//!   logits and parameters give the same token, always.
//! - **The reported `logprob`** is that of the sampled token under the distribution actually
//!   sampled from (after temperature and filters, renormalised). With the defaults it is bit for
//!   bit [`log_softmax_at`], which computes exactly what the reference backend's `token_logprobs`
//!   (src/backend/cpu.rs) computes, so rollout logprobs equal trainer logprobs on the CPU backend.
//! - **`top_logprobs`**: the n most likely tokens under that same distribution, descending, ties
//!   by id; tokens filtered out or of probability zero are not listed.
//! - **Non-finite logits**: NaN counts as `-inf` (never sampled, logprob `-inf`). If some logits
//!   are `+inf`, the distribution is their limit: uniform over the `+inf` tokens. If none is above
//!   `-inf` (or the row is empty), the sample is token 0 with logprob `-inf`. Nothing panics. Only
//!   in these cases can [`log_softmax_at`] differ from `token_logprobs`, which gives NaN there.
//!
//! Cost for a 152k vocabulary: with no filter, a max pass, an `exp` pass for the sum (recording
//! the running sum every 1024 tokens) and an inverse-CDF pass over the one 1024-token chunk where
//! the running sum crosses the draw. With filters, `top_k` keeps a sorted insertion list when
//! k <= 256 and otherwise selects with `select_nth_unstable_by` over the (score, id) candidates;
//! `top_p` first tries the 64 most likely tokens, found in the pass that sums the mass, then sorts
//! a growing head (512, 4096, ... candidates) until the mass is reached; only the kept set is
//! ever sorted.
//!
//! `sample` expects parameters that passed [`SamplingParams::validate`] and never panics on others:
//! a NaN or negative temperature is greedy, `top_k = Some(0)` keeps one token, `top_p` <= 0 keeps
//! one token and NaN turns it off, `min_p` > 1 keeps one token and NaN turns it off, and
//! `top_logprobs` is capped at [`MAX_TOP_LOGPROBS`].

use crate::backend::cpu_sampling::{by_score_desc, greedy, sample_unfiltered, top_n, Scores};
pub use crate::backend::cpu_sampling::{log_softmax_at, sample_unfiltered_at, Sample};
use std::cmp::Ordering;
use std::fmt;

/// The most `top_logprobs` a request may ask for (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// How one request samples. The defaults are the RL-correct ones: temperature 1, no filters.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// Divides the logits before the softmax; 0 = greedy. Default 1.
    pub temperature: f32,
    /// Nucleus sampling: keep the smallest most-likely prefix with at least this mass, in (0, 1];
    /// 1 = off (the default).
    pub top_p: f32,
    /// Keep only the k most likely tokens (k >= 1, clamped to the vocabulary); `None` = off (the
    /// default).
    pub top_k: Option<usize>,
    /// Keep only tokens with `p >= min_p * p_max`, in [0, 1]; 0 = off (the default).
    pub min_p: f32,
    /// Seed of the request's [`SampleRng`]; `None` lets the engine pick one. Not read by
    /// [`sample`], which takes the rng itself.
    pub seed: Option<u64>,
    /// How many most-likely tokens to report with each sample, 0 (the default) to
    /// [`MAX_TOP_LOGPROBS`].
    pub top_logprobs: usize,
}

impl Default for SamplingParams {
    /// Temperature 1, top_p 1, top_k off, min_p 0, no seed, no top logprobs.
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_p: 1.0,
            top_k: None,
            min_p: 0.0,
            seed: None,
            top_logprobs: 0,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding: temperature 0, everything else at its default.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            ..Self::default()
        }
    }

    /// Checks every field for a logits row of `vocab` entries; the error names the first field
    /// out of range, its value and the range allowed.
    pub fn validate(&self, vocab: usize) -> Result<(), SamplingError> {
        if vocab == 0 {
            return Err(SamplingError::EmptyVocab);
        }
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(SamplingError::Temperature(self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(SamplingError::TopP(self.top_p));
        }
        if self.top_k == Some(0) {
            return Err(SamplingError::TopK(0));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(SamplingError::MinP(self.min_p));
        }
        if self.top_logprobs > MAX_TOP_LOGPROBS {
            return Err(SamplingError::TopLogprobs(self.top_logprobs));
        }
        Ok(())
    }

    /// True when [`sample`] takes the argmax: a temperature not above 0 (NaN included).
    pub fn is_greedy(&self) -> bool {
        !matches!(self.temperature.partial_cmp(&0.0), Some(Ordering::Greater))
    }

    /// True when the sampled distribution is exactly the model's (temperature 1, top_p 1, top_k
    /// off, min_p 0), so the reported logprobs are the trainer's: the RL setting.
    pub fn is_unfiltered(&self) -> bool {
        self.temperature == 1.0 && self.top_p == 1.0 && self.top_k.is_none() && self.min_p == 0.0
    }
}

/// A [`SamplingParams`] field out of range (or an empty vocabulary), with the value given.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SamplingError {
    /// `temperature` is NaN, infinite or negative.
    Temperature(f32),
    /// `top_p` is outside (0, 1] (or NaN).
    TopP(f32),
    /// `top_k` is 0.
    TopK(usize),
    /// `min_p` is outside [0, 1] (or NaN).
    MinP(f32),
    /// `top_logprobs` is above [`MAX_TOP_LOGPROBS`].
    TopLogprobs(usize),
    /// The logits row has no entries: nothing can be sampled.
    EmptyVocab,
}

impl fmt::Display for SamplingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Temperature(v) => write!(f, "temperature = {v}: must be finite and >= 0"),
            Self::TopP(v) => write!(f, "top_p = {v}: must be in (0, 1]"),
            Self::TopK(v) => write!(
                f,
                "top_k = {v}: must be >= 1 (values above the vocabulary size keep every token)"
            ),
            Self::MinP(v) => write!(f, "min_p = {v}: must be in [0, 1]"),
            Self::TopLogprobs(v) => {
                write!(f, "top_logprobs = {v}: must be in [0, {MAX_TOP_LOGPROBS}]")
            }
            Self::EmptyVocab => write!(f, "vocabulary size = 0: must be >= 1 to sample"),
        }
    }
}

impl std::error::Error for SamplingError {}

/// The sampler's deterministic PRNG: xoshiro256** with its state seeded through SplitMix64; one
/// per request, drawn from once per sampled token.
pub type SampleRng = crate::rng::Xoshiro256StarStar;

/// Samples one token from one row of logits; see the module doc for the contract. Draws exactly
/// once from `rng` unless the temperature is 0 (greedy), which does not draw.
pub fn sample(logits: &[f32], params: &SamplingParams, rng: &mut SampleRng) -> Sample {
    let n_top = params.top_logprobs.min(MAX_TOP_LOGPROBS);
    if !matches!(
        params.temperature.partial_cmp(&0.0),
        Some(Ordering::Greater)
    ) {
        return greedy(logits, n_top);
    }
    let u = rng.next_f64();
    let Some(scores) = Scores::new(logits, params.temperature as f64) else {
        return Sample::nothing();
    };
    let top_k = params.top_k.filter(|&k| k < logits.len());
    let top_p_on = params.top_p < 1.0;
    let min_p_on = params.min_p > 0.0;
    if top_k.is_none() && !top_p_on && !min_p_on {
        return sample_unfiltered(logits, &scores, u, n_top);
    }
    let kept = kept_tokens(logits, &scores, top_k, params.top_p, params.min_p);
    let total: f64 = kept.iter().map(|&(s, _)| scores.weight(s)).sum();
    let target = u * total;
    let mut cum = 0.0;
    // If rounding lets the running sum stay at or below the target, `chosen` ends at the last
    // kept token of nonzero weight (there is one: kept[0]'s weight is exp(0) = 1).
    let mut chosen = 0;
    for (i, &(s, _)) in kept.iter().enumerate() {
        let w = scores.weight(s);
        if w > 0.0 {
            chosen = i;
            cum += w;
            if cum > target {
                break;
            }
        }
    }
    let ln_total = total.ln();
    let logprob = |s: f64| (s - scores.max - ln_total) as f32;
    Sample {
        token: kept[chosen].1,
        logprob: logprob(kept[chosen].0),
        top_logprobs: kept
            .iter()
            .take(n_top)
            .map(|&(s, id)| (id, logprob(s)))
            .collect(),
    }
}

/// Up to this `top_k`, one insertion pass ([`top_n`]) beats collecting and selecting.
const SMALL_TOP_K: usize = 256;

/// How many of the most likely tokens `top_p` first tries, in the pass that sums the mass; most
/// real distributions reach it there, with no allocation.
const TOP_P_HEAD: usize = 64;

/// The (score, id) pairs top_k, then top_p, then min_p keep, in [`by_score_desc`] order; never
/// empty when `scores` exists (the most likely token always stays).
fn kept_tokens(
    logits: &[f32],
    scores: &Scores,
    top_k: Option<usize>,
    top_p: f32,
    min_p: f32,
) -> Vec<(f64, u32)> {
    // min_p keeps p >= min_p * p_max, i.e. exp(score - max) >= min_p; capped at 1, the weight of
    // the most likely token. NaN or <= 0: off. On a sorted list it keeps a prefix.
    let min_weight = if min_p > 0.0 {
        (min_p as f64).min(1.0)
    } else {
        0.0
    };
    let min_p_prefix = |sorted: &[(f64, u32)]| {
        sorted
            .partition_point(|&(s, _)| scores.weight(s) >= min_weight)
            .max(1)
    };
    // top_p keeps the shortest prefix of a sorted list with weight >= `need`; None: all fall short.
    let top_p_prefix = |sorted: &[(f64, u32)], need: f64| {
        let mut cum = 0.0;
        sorted
            .iter()
            .position(|&(s, _)| {
                cum += scores.weight(s);
                cum >= need
            })
            .map(|i| i + 1)
    };
    let finite = || scores.iter(logits).filter(|&(s, _)| s > f64::NEG_INFINITY);
    let top_p_on = top_p < 1.0; // NaN: off
                                // `mass`: the total weight top_p measures against, after top_k and before min_p.
    let (mut kept, mass, sorted) = match top_k {
        Some(k) => {
            let k = k.max(1);
            let mut kept = if k <= SMALL_TOP_K {
                top_n(finite(), k)
            } else {
                let mut all: Vec<(f64, u32)> = finite().collect();
                if k < all.len() {
                    all.select_nth_unstable_by(k - 1, by_score_desc);
                    all.truncate(k);
                }
                all.sort_unstable_by(by_score_desc);
                all
            };
            let mass: f64 = kept.iter().map(|&(s, _)| scores.weight(s)).sum();
            kept.truncate(min_p_prefix(&kept));
            (kept, mass, true)
        }
        None => {
            let mut mass = 0.0;
            if top_p_on {
                let weighed = finite().inspect(|&(s, _)| mass += scores.weight(s));
                let mut head = top_n(weighed, TOP_P_HEAD);
                if let Some(n) = top_p_prefix(&head, top_p as f64 * mass) {
                    head.truncate(n.min(min_p_prefix(&head)));
                    return head;
                }
            }
            let kept = finite()
                .filter(|&(s, _)| scores.weight(s) >= min_weight)
                .collect();
            (kept, mass, false)
        }
    };
    if top_p_on {
        let need = top_p as f64 * mass;
        // Sort a growing head until it holds the mass.
        let mut head = if sorted {
            kept.len()
        } else {
            kept.len().min(TOP_P_HEAD * 8)
        };
        loop {
            if head < kept.len() {
                kept.select_nth_unstable_by(head - 1, by_score_desc);
            }
            if !sorted {
                kept[..head].sort_unstable_by(by_score_desc);
            }
            if let Some(n) = top_p_prefix(&kept[..head], need) {
                kept.truncate(n);
                return kept;
            }
            if head == kept.len() {
                // Rounding kept the full mass just below `need`: everything stays.
                return kept;
            }
            head = (head * 8).min(kept.len());
        }
    }
    if !sorted {
        kept.sort_unstable_by(by_score_desc);
    }
    kept
}

#[cfg(test)]
#[path = "sampler_tests.rs"]
mod tests;
