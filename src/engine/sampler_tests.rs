//! Unit tests of the host sampler (`sampler.rs`): kept sets, frequencies, logprobs, draws.

use super::*;
use crate::backend::cpu::{CpuBackend, CpuTensor};
use crate::backend::{Backend, RowDraw};
use std::collections::BTreeMap;

/// The trainer's logprob of token `t`: the reference backend's `token_logprobs`, the code the
/// scoring path runs.
fn trainer_logprob(row: &[f32], t: usize) -> f32 {
    let logits = CpuTensor::new(vec![1, row.len()], row.to_vec());
    CpuBackend::new()
        .token_logprobs(&logits, &[t as u32])
        .unwrap()[0]
}

/// `softmax(logits / temperature)` restricted to `kept` (all when `None`), in f64.
fn probs(logits: &[f32], temperature: f64, kept: Option<&[u32]>) -> Vec<f64> {
    let keep = |i: usize| kept.is_none_or(|k| k.contains(&(i as u32)));
    let max = logits
        .iter()
        .fold(f64::NEG_INFINITY, |m, &z| m.max(z as f64));
    let w: Vec<f64> = (0..logits.len())
        .map(|i| match keep(i) {
            true => ((logits[i] as f64 - max) / temperature).exp(),
            false => 0.0,
        })
        .collect();
    let total: f64 = w.iter().sum();
    w.iter().map(|x| x / total).collect()
}

fn random_row(rng: &mut SampleRng, n: usize, scale: f64) -> Vec<f32> {
    (0..n)
        .map(|_| ((rng.next_f64() * 2.0 - 1.0) * scale) as f32)
        .collect()
}

fn params(temperature: f32, top_k: Option<usize>, top_p: f32, min_p: f32) -> SamplingParams {
    SamplingParams {
        temperature,
        top_k,
        top_p,
        min_p,
        ..SamplingParams::default()
    }
}

/// Samples `draws` times; per token: count, and the logprob (checked to be always the same).
fn draw(logits: &[f32], p: &SamplingParams, seed: u64, draws: usize) -> BTreeMap<u32, (u64, f32)> {
    let mut rng = SampleRng::from_seed(seed);
    let mut seen: BTreeMap<u32, (u64, f32)> = BTreeMap::new();
    for _ in 0..draws {
        let s = sample(logits, p, &mut rng);
        let e = seen.entry(s.token).or_insert((0, s.logprob));
        assert_eq!(e.1.to_bits(), s.logprob.to_bits(), "token {}", s.token);
        e.0 += 1;
    }
    seen
}

/// Pearson's chi-square of the counts against `p`; a token of probability 0 must never occur.
fn chi_square(seen: &BTreeMap<u32, (u64, f32)>, p: &[f64], draws: usize) -> f64 {
    let mut chi = 0.0;
    for (i, &pi) in p.iter().enumerate() {
        let count = seen.get(&(i as u32)).map_or(0, |e| e.0) as f64;
        if pi == 0.0 {
            assert_eq!(count, 0.0, "token {i} has probability 0");
        } else {
            let expect = pi * draws as f64;
            chi += (count - expect).powi(2) / expect;
        }
    }
    chi
}

// Probabilities 0.05, 0.4, 0.1, 0.3, 0.15 by id; descending: 1, 3, 4, 2, 0.
const P5: [f64; 5] = [0.05, 0.4, 0.1, 0.3, 0.15];
fn logits5() -> Vec<f32> {
    P5.iter().map(|p| p.ln() as f32).collect()
}

/// Samples until every kept token shows up; checks the kept set, that each logprob is that of
/// the renormalised distribution (1e-6) and that they sum to 1 over the set.
fn check_kept(p: &SamplingParams, expect: &[u32]) {
    let logits = logits5();
    let seen = draw(&logits, p, 7, 20_000);
    let mut want = expect.to_vec();
    want.sort_unstable();
    assert_eq!(seen.keys().copied().collect::<Vec<_>>(), want, "{p:?}");
    let renorm = probs(&logits, p.temperature as f64, Some(expect));
    let mut total = 0.0;
    for (&t, &(_, lp)) in &seen {
        assert!(
            (lp as f64 - renorm[t as usize].ln()).abs() < 1e-6,
            "{p:?} token {t}"
        );
        total += (lp as f64).exp();
    }
    assert!((total - 1.0).abs() < 1e-6, "{p:?}: kept mass {total}");
}

#[test]
fn cpu_sample_rows_is_sample_with_its_draw() {
    // `Backend::sample_rows` on the CPU (what the engine runs for unfiltered rows) and `sample`
    // must agree exactly, so the engine gives the same tokens whichever path a row takes.
    let backend = CpuBackend::new();
    let sample_row = |row: &[f32], temperature: f32, uniform: f64| {
        let logits = CpuTensor::new(vec![1, row.len()], row.to_vec());
        let draw = RowDraw {
            temperature,
            uniform,
        };
        backend.sample_rows(&logits, &[draw]).unwrap()[0]
    };
    let mut rng = SampleRng::from_seed(99);
    for (n, &temperature) in [1usize, 2, 1000, 40_000]
        .iter()
        .zip(&[1.0f32, 0.0, 0.6, 1.7])
    {
        let row = random_row(&mut rng, *n, 8.0);
        for seed in 0..20 {
            let p = params(temperature, None, 1.0, 0.0);
            let (mut a, mut b) = (SampleRng::from_seed(seed), SampleRng::from_seed(seed));
            let expect = sample(&row, &p, &mut a);
            let u = if temperature > 0.0 { b.next_f64() } else { 0.0 };
            assert_eq!(
                sample_row(&row, temperature, u),
                (expect.token, expect.logprob),
                "n {n}, T {temperature}, seed {seed}"
            );
            assert_eq!(a, b, "one draw each, none when greedy");
        }
    }
    let nothing = sample_row(&[f32::NAN, f32::NEG_INFINITY], 1.0, 0.3);
    assert_eq!(nothing, (0, f32::NEG_INFINITY));
}

#[test]
fn greedy_picks_argmax_ties_to_lowest_id_without_drawing() {
    let logits = [0.5, 3.0, -1.0, 3.0, f32::NAN, 2.0];
    let mut rng = SampleRng::from_seed(1);
    let before = rng.clone();
    let mut p = SamplingParams::greedy();
    p.top_logprobs = 3;
    let s = sample(&logits, &p, &mut rng);
    assert_eq!(s.token, 1);
    assert_eq!(rng, before, "greedy must not draw");
    assert_eq!(s.logprob.to_bits(), log_softmax_at(&logits, 1).to_bits());
    let top: Vec<u32> = s.top_logprobs.iter().map(|t| t.0).collect();
    assert_eq!(top, [1, 3, 5]);
    assert_eq!(s.top_logprobs[2].1, log_softmax_at(&logits, 5));
}

#[test]
fn top_k_one_equals_greedy() {
    let mut rng = SampleRng::from_seed(2);
    for _ in 0..50 {
        let mut logits = random_row(&mut rng, 300, 5.0);
        logits[17] = 6.0;
        logits[250] = 6.0; // a tie: the lower id wins
        let s = sample(&logits, &params(1.0, Some(1), 1.0, 0.0), &mut rng);
        let g = sample(&logits, &SamplingParams::greedy(), &mut rng);
        assert_eq!((s.token, g.token), (17, 17));
        assert_eq!(s.logprob, 0.0, "the only kept token has probability 1");
    }
}

#[test]
fn same_seed_same_tokens_different_seeds_differ() {
    let logits = random_row(&mut SampleRng::from_seed(3), 1000, 3.0);
    for p in [SamplingParams::default(), params(0.7, Some(50), 0.9, 0.01)] {
        let run = |seed| {
            let mut rng = SampleRng::from_seed(seed);
            (0..1000)
                .map(|_| sample(&logits, &p, &mut rng).token)
                .collect::<Vec<_>>()
        };
        assert_eq!(run(42), run(42));
        assert_ne!(run(42), run(43));
    }
}

#[test]
fn exactly_one_draw_per_sample() {
    let logits = logits5();
    for p in [SamplingParams::default(), params(0.5, Some(2), 0.5, 0.1)] {
        for row in [&logits[..], &[f32::NAN; 3], &[]] {
            let mut rng = SampleRng::from_seed(4);
            let mut expect = rng.clone();
            sample(row, &p, &mut rng);
            expect.next_u64();
            assert_eq!(rng, expect);
        }
    }
}

#[test]
fn frequencies_match_softmax_at_temperatures() {
    // df <= 5: P(chi-square > 25) < 2e-4. Seeded, so deterministic.
    let logits = [1.0, 2.0, 0.5, -1.0, 2.0, 0.0];
    let draws = 200_000;
    for t in [1.0, 0.5, 2.0] {
        let seen = draw(&logits, &params(t, None, 1.0, 0.0), 11, draws);
        let chi = chi_square(&seen, &probs(&logits, t as f64, None), draws);
        assert!(chi < 25.0, "temperature {t}: chi-square {chi}");
    }
    // The filtered (descending-order) path too: top_k 4 drops ids 3 and 5.
    let seen = draw(&logits, &params(0.5, Some(4), 1.0, 0.0), 12, draws);
    let p = probs(&logits, 0.5, Some(&[0, 1, 2, 4]));
    let chi = chi_square(&seen, &p, draws);
    assert!(chi < 25.0, "top_k 4: chi-square {chi}");
}

#[test]
fn filters_keep_exactly_the_documented_sets() {
    check_kept(&params(1.0, Some(2), 1.0, 0.0), &[1, 3]);
    check_kept(&params(1.0, Some(4), 1.0, 0.0), &[1, 3, 4, 2]);
    check_kept(&params(1.0, None, 0.3, 0.0), &[1]);
    check_kept(&params(1.0, None, 0.6, 0.0), &[1, 3]); // 0.4 + 0.3 >= 0.6
    check_kept(&params(1.0, None, 0.72, 0.0), &[1, 3, 4]); // 0.7 < 0.72 <= 0.85
    check_kept(&params(1.0, None, 0.8, 0.0), &[1, 3, 4]);
    // top_p measures the top_k-renormalised mass: 0.4/0.85 + 0.3/0.85 = 0.82 >= 0.8.
    check_kept(&params(1.0, Some(3), 0.8, 0.0), &[1, 3]);
    check_kept(&params(1.0, None, 0.0001, 0.0), &[1]);
    check_kept(&params(1.0, None, 1.0, 0.3), &[1, 3, 4]); // p >= 0.12
    check_kept(&params(1.0, None, 1.0, 0.5), &[1, 3]); // p >= 0.2
    check_kept(&params(1.0, None, 1.0, 1.0), &[1]);
    check_kept(&params(1.0, None, 0.9, 0.3), &[1, 3, 4]); // top_p keeps 4, min_p 3
    check_kept(&params(1.0, Some(2), 1.0, 0.3), &[1, 3]);
    // min_p is a ratio at any temperature: at 2, p / p_max = sqrt(P5 / 0.4), and id 2's is
    // 0.5, id 0's 0.35.
    check_kept(&params(2.0, None, 1.0, 0.45), &[1, 3, 4, 2]);
    check_kept(&params(1.0, Some(1000), 1.0, 0.0), &[0, 1, 2, 3, 4]);
}

#[test]
fn kept_tokens_match_a_full_sort_on_a_large_vocabulary() {
    let mut rng = SampleRng::from_seed(5);
    let flat = random_row(&mut rng, 152_064, 4.0);
    let mut peaked = flat.clone();
    for i in 0..10 {
        peaked[i * 9000 + 5] = 12.0 + i as f32 * 0.1; // top_p's first pass finds these
    }
    let cases = [
        (None, 0.9, 0.0),
        (None, 0.5, 0.0),
        (None, 0.999, 0.0),
        (Some(40_000), 0.7, 0.0),
        (Some(20), 0.95, 0.0),
        (Some(300), 0.95, 0.0),
        (Some(256), 0.9, 0.01),
        (None, 0.95, 0.05),
        (Some(5000), 1.0, 0.2),
        (None, 1.0, 0.5),
    ];
    for (t, logits) in [(1.0, &flat), (0.3, &flat), (1.0, &peaked), (2.0, &peaked)] {
        let scores = Scores::new(logits, t).unwrap();
        let mut all: Vec<(f64, u32)> = scores.iter(logits).collect();
        all.sort_unstable_by(by_score_desc);
        for (top_k, top_p, min_p) in cases {
            let mut want = all.clone();
            want.truncate(top_k.unwrap_or(usize::MAX).min(want.len()));
            let mass: f64 = want.iter().map(|&(s, _)| scores.weight(s)).sum();
            let mut cum = 0.0;
            let n_p = want
                .iter()
                .position(|&(s, _)| {
                    cum += scores.weight(s);
                    cum >= top_p as f64 * mass
                })
                .map_or(want.len(), |i| i + 1);
            want.truncate(n_p);
            want.retain(|&(s, _)| scores.weight(s) >= min_p as f64);
            let got = kept_tokens(logits, &scores, top_k, top_p, min_p);
            assert_eq!(
                got, want,
                "t {t} top_k {top_k:?} top_p {top_p} min_p {min_p}"
            );
            assert!(got.len() > 1 && got.len() < logits.len());
        }
    }
}

#[test]
fn default_logprob_is_the_trainers_bitwise() {
    let mut rng = SampleRng::from_seed(6);
    for (n, scale) in [(1, 1.0), (2, 3.0), (7, 10.0), (1000, 20.0), (152_064, 8.0)] {
        for _ in 0..20 {
            let mut row = random_row(&mut rng, n, scale);
            if n > 2 {
                row[n / 2] = f32::NEG_INFINITY;
            }
            let s = sample(&row, &SamplingParams::default(), &mut rng);
            let t = s.token as usize;
            assert_eq!(s.logprob.to_bits(), trainer_logprob(&row, t).to_bits());
            for t in [0, n - 1, n / 3, t] {
                let want = trainer_logprob(&row, t).to_bits();
                assert_eq!(
                    log_softmax_at(&row, t as u32).to_bits(),
                    want,
                    "n {n} t {t}"
                );
            }
        }
    }
}

#[test]
fn temperature_logprob_is_the_scaled_softmax() {
    let logits = random_row(&mut SampleRng::from_seed(8), 500, 6.0);
    for t in [0.3f32, 0.5, 2.0] {
        let p = probs(&logits, t as f64, None);
        for (&token, &(_, lp)) in &draw(&logits, &params(t, None, 1.0, 0.0), 9, 200) {
            assert!((lp as f64 - p[token as usize].ln()).abs() < 1e-6, "t {t}");
        }
    }
}

#[test]
fn top_logprobs_are_the_sampled_distributions_best() {
    let logits = [0.0, 2.0, 1.0, 2.0, -1.0, 0.5];
    let mut rng = SampleRng::from_seed(10);
    let mut p = SamplingParams {
        top_logprobs: 4,
        ..SamplingParams::default()
    };
    let s = sample(&logits, &p, &mut rng);
    let want: Vec<(u32, f32)> = [1, 3, 2, 5]
        .iter()
        .map(|&t| (t, log_softmax_at(&logits, t)))
        .collect();
    assert_eq!(s.top_logprobs, want);
    // Filtered: only kept tokens, renormalised; the sampled token's logprob is among them.
    p.top_k = Some(3);
    p.temperature = 0.5;
    let s = sample(&logits, &p, &mut rng);
    let renorm = probs(&logits, 0.5, Some(&[1, 2, 3]));
    let ids: Vec<u32> = s.top_logprobs.iter().map(|t| t.0).collect();
    assert_eq!(ids, [1, 3, 2]);
    for &(t, lp) in &s.top_logprobs {
        assert!((lp as f64 - renorm[t as usize].ln()).abs() < 1e-6);
    }
    assert!(s.top_logprobs.contains(&(s.token, s.logprob)));
    // Capped at MAX_TOP_LOGPROBS, never more than the vocabulary.
    p.top_logprobs = 500;
    p.top_k = None;
    let big = random_row(&mut rng, 100, 1.0);
    assert_eq!(
        sample(&big, &p, &mut rng).top_logprobs.len(),
        MAX_TOP_LOGPROBS
    );
    assert_eq!(sample(&logits, &p, &mut rng).top_logprobs.len(), 6);
}

#[test]
fn validate_names_the_field_and_value() {
    let ok = [
        SamplingParams::default(),
        SamplingParams::greedy(),
        params(0.7, Some(1_000_000), 0.95, 0.05),
    ];
    for p in ok {
        assert_eq!(p.validate(10), Ok(()));
    }
    let d = SamplingParams::default;
    let bad = [
        (params(-0.5, None, 1.0, 0.0), "temperature = -0.5"),
        (params(f32::NAN, None, 1.0, 0.0), "temperature = NaN"),
        (params(f32::INFINITY, None, 1.0, 0.0), "temperature = inf"),
        (params(1.0, None, 0.0, 0.0), "top_p = 0"),
        (params(1.0, None, 1.5, 0.0), "top_p = 1.5"),
        (params(1.0, None, f32::NAN, 0.0), "top_p = NaN"),
        (params(1.0, Some(0), 1.0, 0.0), "top_k = 0"),
        (params(1.0, None, 1.0, 1.5), "min_p = 1.5"),
        (params(1.0, None, 1.0, -0.1), "min_p = -0.1"),
        (
            SamplingParams {
                top_logprobs: 21,
                ..d()
            },
            "top_logprobs = 21",
        ),
    ];
    for (p, msg) in bad {
        let err = p.validate(10).unwrap_err().to_string();
        assert!(err.starts_with(msg), "{err:?} should start with {msg:?}");
        assert!(err.contains("must be"), "{err:?} should give the range");
    }
    assert_eq!(d().validate(0), Err(SamplingError::EmptyVocab));
}

#[test]
fn is_unfiltered_only_for_the_rl_defaults() {
    assert!(SamplingParams::default().is_unfiltered());
    assert!(!SamplingParams::greedy().is_unfiltered());
    assert!(!params(1.0, Some(5), 1.0, 0.0).is_unfiltered());
    assert!(!params(1.0, None, 0.9, 0.0).is_unfiltered());
    assert!(!params(1.0, None, 1.0, 0.1).is_unfiltered());
}

#[test]
fn nan_and_infinite_logits_do_not_panic() {
    let all = [
        SamplingParams::default(),
        SamplingParams::greedy(),
        params(0.8, Some(2), 0.9, 0.1),
    ];
    for p in &all {
        let mut rng = SampleRng::from_seed(13);
        // NaN is never sampled.
        let row = [f32::NAN, 1.0, f32::NAN, 0.5, f32::NEG_INFINITY];
        for _ in 0..500 {
            let s = sample(&row, p, &mut rng);
            assert!(s.token == 1 || s.token == 3, "{p:?}: {s:?}");
            assert!(s.logprob.is_finite() && s.logprob <= 0.0);
        }
        // Nothing above -inf: token 0, logprob -inf.
        for row in [&[f32::NAN; 4][..], &[f32::NEG_INFINITY; 3], &[]] {
            let s = sample(row, p, &mut rng);
            assert_eq!((s.token, s.logprob), (0, f32::NEG_INFINITY), "{p:?}");
            assert!(s.top_logprobs.is_empty());
        }
        // +inf: uniform over the +inf tokens.
        let row = [1.0, f32::INFINITY, f32::NAN, f32::INFINITY];
        let s = sample(&row, p, &mut rng);
        assert!(s.token == 1 || s.token == 3, "{p:?}: {s:?}");
        assert_eq!(s.logprob, -(2f32.ln()), "{p:?}");
    }
    let row = [f32::NAN, 1.0];
    assert_eq!(log_softmax_at(&row, 0), f32::NEG_INFINITY);
    assert_eq!(log_softmax_at(&row, 1), 0.0);
    assert_eq!(log_softmax_at(&row, 2), f32::NEG_INFINITY);
    assert_eq!(log_softmax_at(&[f32::NAN], 0), f32::NEG_INFINITY);
    // Out-of-range parameters sample sanely too.
    let mut rng = SampleRng::from_seed(14);
    for p in [
        params(-1.0, None, 1.0, 0.0),
        params(f32::NAN, Some(0), -1.0, 7.0),
    ] {
        assert_eq!(sample(&logits5(), &p, &mut rng).token, 1);
    }
    assert_eq!(
        sample(&logits5(), &params(1.0, Some(0), -1.0, 7.0), &mut rng).token,
        1
    );
}
