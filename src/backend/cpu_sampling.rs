//! Sampling one row of logits, the math of the reference backend's
//! [`Backend::sample_rows`](super::Backend::sample_rows) (no filters, the uniform draw given) and
//! the base of the engine's host sampler ([`crate::engine::sampler`], whose module doc states the
//! contract: greedy ties, the inverse CDF in index order, non-finite logits, the logprob reported).
//! The engine adds the filters (`top_k`, `top_p`, `min_p`) and the request's generator on top.
//!
//! Scores `z / temperature`, weights `exp(score - max)` and all sums are in f64; with no filter
//! the inverse CDF walks the vocabulary in index order, in chunks of `CDF_CHUNK` whose running
//! sums are kept, so a draw recomputes one chunk's weights rather than the vocabulary's.

use std::cmp::Ordering;

/// One sampled token.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// The token id.
    pub token: u32,
    /// Its log-probability under the distribution sampled from (the model's when greedy).
    pub logprob: f32,
    /// The most likely (token, logprob) pairs under that same distribution, descending, ties by
    /// id; as many as asked for, fewer when fewer tokens are kept.
    pub top_logprobs: Vec<(u32, f32)>,
}

impl Sample {
    /// What a row with no token above `-inf` samples.
    pub(crate) fn nothing() -> Self {
        Self {
            token: 0,
            logprob: f32::NEG_INFINITY,
            top_logprobs: Vec::new(),
        }
    }
}

/// [`sample`](crate::engine::sampler::sample) for a row without filters or top logprobs, with its
/// uniform draw `u` given: what [`Backend::sample_rows`](super::Backend::sample_rows) computes on
/// the reference backend. Greedy when `temperature` is not above 0 (`u` unused). Returns the token
/// and its logprob.
pub fn sample_unfiltered_at(logits: &[f32], temperature: f32, u: f64) -> (u32, f32) {
    let sampled = if !matches!(temperature.partial_cmp(&0.0), Some(Ordering::Greater)) {
        greedy(logits, 0)
    } else {
        match Scores::new(logits, temperature as f64) {
            Some(scores) => sample_unfiltered(logits, &scores, u, 0),
            None => Sample::nothing(),
        }
    };
    (sampled.token, sampled.logprob)
}

/// `log_softmax(logits)[token]`, exactly as the reference backend's `token_logprobs` computes it
/// (`cpu.rs`):
/// the max in f32, then in f64 and in index order `sum(exp(z - max))`, and
/// `(logits[token] - max - ln(sum)) as f32`; bit for bit the same on every row whose logits are
/// all finite or `-inf` (with at least one finite). NaN counts as `-inf`, `+inf` logits make the
/// distribution uniform over them, and an out-of-range token or a row with nothing above `-inf`
/// gives `-inf`.
pub fn log_softmax_at(logits: &[f32], token: u32) -> f32 {
    let Some(&z) = logits.get(token as usize) else {
        return f32::NEG_INFINITY;
    };
    let Some(scores) = Scores::new(logits, 1.0) else {
        return f32::NEG_INFINITY;
    };
    (scores.score(z) - scores.max - scores.sum_weights(logits).ln()) as f32
}

/// Greedy: the argmax (ties to the lowest id) and the model's own logprobs.
pub(crate) fn greedy(logits: &[f32], n_top: usize) -> Sample {
    let mut best: Option<(usize, f32)> = None;
    for (i, &z) in logits.iter().enumerate() {
        if z > f32::NEG_INFINITY && best.is_none_or(|(_, b)| z > b) {
            best = Some((i, z));
        }
    }
    let (Some((token, _)), Some(scores)) = (best, Scores::new(logits, 1.0)) else {
        return Sample::nothing();
    };
    let ln_sum = scores.sum_weights(logits).ln();
    let logprob = |s: f64| (s - scores.max - ln_sum) as f32;
    Sample {
        token: token as u32,
        logprob: logprob(scores.score(logits[token])),
        top_logprobs: top_n(scores.iter(logits), n_top)
            .into_iter()
            .map(|(s, id)| (id, logprob(s)))
            .collect(),
    }
}

/// Tokens per chunk of the unfiltered inverse CDF: the running sum is kept at each chunk's start,
/// so the draw recomputes the weights of one chunk rather than of the vocabulary.
const CDF_CHUNK: usize = 1024;

/// No filter: the inverse CDF walks the vocabulary in index order.
pub(crate) fn sample_unfiltered(logits: &[f32], scores: &Scores, u: f64, n_top: usize) -> Sample {
    // The sequential f64 sum in index order, as `sum_weights` and the reference compute it (the
    // same additions in the same order), plus its value at each chunk's start.
    let mut chunk_starts = Vec::with_capacity(logits.len().div_ceil(CDF_CHUNK));
    let mut sum = 0.0f64;
    for chunk in logits.chunks(CDF_CHUNK) {
        chunk_starts.push(sum);
        for &z in chunk {
            sum += scores.weight(scores.score(z));
        }
    }
    let target = u * sum;
    // The last chunk starting at or below the target: the running sum first exceeds it there.
    let c = chunk_starts
        .partition_point(|&start| start <= target)
        .saturating_sub(1);
    let mut cum = chunk_starts[c];
    let weight_at = |i: usize| scores.weight(scores.score(logits[i]));
    let chosen = (c * CDF_CHUNK..logits.len())
        .find(|&i| {
            cum += weight_at(i);
            cum > target
        })
        // Rounding made `u * sum == sum`: the limit u -> 1, the last token of nonzero weight.
        .or_else(|| (0..logits.len()).rev().find(|&i| weight_at(i) > 0.0))
        .unwrap_or(0);
    let ln_sum = sum.ln();
    let logprob = |s: f64| (s - scores.max - ln_sum) as f32;
    Sample {
        token: chosen as u32,
        logprob: logprob(scores.score(logits[chosen])),
        top_logprobs: top_n(scores.iter(logits), n_top)
            .into_iter()
            .map(|(s, id)| (id, logprob(s)))
            .collect(),
    }
}

/// How logits become sampling scores (f64): `z / temperature`, or the `+inf` limit.
#[derive(Clone, Copy, Debug)]
enum Scale {
    /// `z / temperature`, NaN mapped to `-inf`.
    Temperature(f64),
    /// Some logit is `+inf`: score 0 for the `+inf` tokens, `-inf` for the rest.
    PosInf,
}

/// The scores of one row and their maximum, so that a token's weight is `exp(score - max)`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Scores {
    scale: Scale,
    pub(crate) max: f64,
}

impl Scores {
    /// `None` when no logit is above `-inf` (NaN counts as `-inf`), or the row is empty.
    pub(crate) fn new(logits: &[f32], temperature: f64) -> Option<Self> {
        // f32::max ignores NaN, so `raw_max` is NaN-free; as in the reference, the max is taken
        // in f32, and dividing by a positive temperature keeps it the max of the scores.
        let raw_max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        if raw_max == f32::INFINITY {
            return Some(Self {
                scale: Scale::PosInf,
                max: 0.0,
            });
        }
        if raw_max == f32::NEG_INFINITY {
            return None;
        }
        let mut scores = Self {
            scale: Scale::Temperature(temperature),
            max: 0.0,
        };
        scores.max = scores.score(raw_max);
        Some(scores)
    }

    /// The sampling score of logit `z` (f64; never NaN).
    #[inline]
    pub(crate) fn score(&self, z: f32) -> f64 {
        match self.scale {
            Scale::Temperature(t) => {
                let s = z as f64 / t;
                if s.is_nan() {
                    f64::NEG_INFINITY
                } else {
                    s
                }
            }
            Scale::PosInf if z == f32::INFINITY => 0.0,
            Scale::PosInf => f64::NEG_INFINITY,
        }
    }

    /// The unnormalised probability of a score.
    #[inline]
    pub(crate) fn weight(&self, score: f64) -> f64 {
        (score - self.max).exp()
    }

    /// `sum(exp(score - max))` in index order, written as the reference writes it.
    pub(crate) fn sum_weights(&self, logits: &[f32]) -> f64 {
        logits
            .iter()
            .map(|&z| (self.score(z) - self.max).exp())
            .sum()
    }

    /// (score, id) of every token, in index order.
    pub(crate) fn iter<'a>(&'a self, logits: &'a [f32]) -> impl Iterator<Item = (f64, u32)> + 'a {
        logits
            .iter()
            .enumerate()
            .map(|(i, &z)| (self.score(z), i as u32))
    }
}

/// Descending score, ties by ascending id: the sampler's one order.
pub(crate) fn by_score_desc(a: &(f64, u32), b: &(f64, u32)) -> Ordering {
    b.0.partial_cmp(&a.0)
        .unwrap_or(Ordering::Equal)
        .then(a.1.cmp(&b.1))
}

/// The `n` best (score, id) pairs above `-inf` in [`by_score_desc`] order, in one pass.
pub(crate) fn top_n(items: impl Iterator<Item = (f64, u32)>, n: usize) -> Vec<(f64, u32)> {
    let mut top: Vec<(f64, u32)> = Vec::with_capacity(n + 1);
    if n == 0 {
        return top;
    }
    for item in items {
        if item.0 == f64::NEG_INFINITY
            || (top.len() == n && by_score_desc(&item, &top[n - 1]) != Ordering::Less)
        {
            continue;
        }
        let at = top.partition_point(|x| by_score_desc(x, &item) == Ordering::Less);
        top.insert(at, item);
        top.truncate(n);
    }
    top
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Xoshiro256StarStar;

    #[test]
    fn chunked_inverse_cdf_matches_a_full_scan() {
        let mut rng = Xoshiro256StarStar::from_seed(15);
        let mut row: Vec<f32> = (0..5000)
            .map(|_| ((rng.next_f64() * 2.0 - 1.0) * 30.0) as f32)
            .collect();
        row[4000..].fill(f32::NEG_INFINITY);
        row[17] = f32::NAN;
        let scores = Scores::new(&row, 1.0).unwrap();
        let w: Vec<f64> = scores.iter(&row).map(|(s, _)| scores.weight(s)).collect();
        let sum: f64 = w.iter().sum();
        let edges = [0.0, 1.0 - f64::EPSILON / 2.0, 1.0]; // 1.0 forces the rounding fallback
        let us: Vec<f64> = (0..3000).map(|_| rng.next_f64()).chain(edges).collect();
        for u in us {
            let mut cum = 0.0;
            let want = (0..row.len())
                .find(|&i| {
                    cum += w[i];
                    cum > u * sum
                })
                .unwrap_or(3999);
            assert_eq!(
                sample_unfiltered(&row, &scores, u, 0).token as usize,
                want,
                "u {u}"
            );
        }
    }
}
