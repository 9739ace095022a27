//! Training data (RL-SPEC.md "Data formats"): trajectory lines, RFT's chat form, DAPO's group
//! advantages, the shift to row form the loss reads, and packing into micro-batches.
//!
//! Trajectory lines: `{"group", "tokens", "action_mask", "logprobs"?, "reward", "turns"?}`.
//! RFT also takes `{"messages": [...], "tools": [...]}`, rendered with the model's chat template
//! (assistant turns are the actions; `"loss": false` masks one); a line with both forms (a
//! rollout's) is read by its `tokens`. A line that does not parse, a
//! mask of the wrong length, a token id outside the vocabulary, or a sequence longer than the
//! maximum is an error naming `file:line`, never a skip.
//!
//! Row form: row `r` of a sequence predicts token `r + 1`, so the token-aligned mask and
//! logprobs shift by one; the last row predicts nothing.
//!
//! ```text
//! tokens        t0  t1  t2  t3  t4
//! action_mask    0   0   1   1   0        (token form: t2, t3 were generated)
//! row targets   t1  t2  t3  t4   -
//! row actions    0   1   1   0   0        (row r is an action row when token r + 1 is)
//! ```

use crate::chat::{ChatTemplate, Conversation};
use crate::jsonl;
use crate::tokenizer::Tokenizer;
use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;
use std::path::Path;

/// One line of a data file.
#[derive(Clone, Debug, PartialEq)]
pub struct Trajectory {
    /// `file:line`, for errors.
    pub location: String,
    pub group: Option<String>,
    pub tokens: Vec<u32>,
    /// Token form: 1 where the policy generated the token.
    pub action_mask: Vec<bool>,
    /// Token form: the sampler's logprob of each action token (absent in chat form).
    pub rollout_logprobs: Option<Vec<Option<f32>>>,
    pub reward: Option<f64>,
}

impl Trajectory {
    pub fn num_action_tokens(&self) -> usize {
        self.action_mask[1..].iter().filter(|&&a| a).count()
    }
}

fn token_ids(value: &Value, key: &str, vocab_size: usize) -> Result<Vec<u32>> {
    let array = value
        .get(key)
        .and_then(Value::as_array)
        .ok_or_else(|| anyhow!("expected a `{key}` array"))?;
    array
        .iter()
        .enumerate()
        .map(|(i, id)| {
            id.as_u64()
                .filter(|&id| (id as usize) < vocab_size)
                .map(|id| id as u32)
                .ok_or_else(|| {
                    anyhow!("{key}[{i}] = {id} is not a token id below the vocabulary size {vocab_size}")
                })
        })
        .collect()
}

fn parse_trajectory(value: &Value, vocab_size: usize) -> Result<Trajectory> {
    let tokens = token_ids(value, "tokens", vocab_size)?;
    let mask = value
        .get("action_mask")
        .and_then(Value::as_array)
        .ok_or_else(|| anyhow!("expected an `action_mask` array"))?;
    if mask.len() != tokens.len() {
        bail!(
            "action_mask has {} entries for {} tokens",
            mask.len(),
            tokens.len()
        );
    }
    let action_mask = mask
        .iter()
        .enumerate()
        .map(|(i, m)| match m.as_u64() {
            Some(0) => Ok(false),
            Some(1) => Ok(true),
            _ => bail!("action_mask[{i}] = {m} is not 0 or 1"),
        })
        .collect::<Result<Vec<bool>>>()?;
    let rollout_logprobs = match value.get("logprobs") {
        None | Some(Value::Null) => None,
        Some(Value::Array(lps)) => {
            if lps.len() != tokens.len() {
                bail!(
                    "logprobs has {} entries for {} tokens",
                    lps.len(),
                    tokens.len()
                );
            }
            let parsed = lps
                .iter()
                .enumerate()
                .map(|(i, lp)| match lp {
                    Value::Null if !action_mask[i] => Ok(None),
                    Value::Null => bail!("logprobs[{i}] is null on an action token"),
                    other => other
                        .as_f64()
                        .filter(|v| v.is_finite() && *v <= 0.0)
                        .map(|v| Some(v as f32))
                        .ok_or_else(|| anyhow!("logprobs[{i}] = {other} is not a logprob")),
                })
                .collect::<Result<Vec<_>>>()?;
            Some(parsed)
        }
        Some(other) => bail!("`logprobs` must be an array, found {other}"),
    };
    let group = match value.get("group") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => Some(other.to_string()),
    };
    let reward = match value.get("reward") {
        None | Some(Value::Null) => None,
        Some(r) => Some(
            r.as_f64()
                .filter(|r| r.is_finite())
                .ok_or_else(|| anyhow!("`reward` = {r} is not a finite number"))?,
        ),
    };
    Ok(Trajectory {
        location: String::new(),
        group,
        tokens,
        action_mask,
        rollout_logprobs,
        reward,
    })
}

/// Reads a data file. Chat-form lines (`messages`) are allowed when `allow_chat` (RFT) and are
/// rendered with the tokenizer of `model_dir`.
pub fn read_trajectories(
    path: &Path,
    model_dir: &Path,
    vocab_size: usize,
    max_seq_len: usize,
    allow_chat: bool,
) -> Result<Vec<Trajectory>> {
    let mut chat: Option<(Tokenizer, ChatTemplate)> = None;
    let mut out = Vec::new();
    for (line_no, value) in jsonl::read_objects(path)? {
        let at = jsonl::at(path, line_no);
        // Token ids are the truth where a line has them (rollouts carry both forms); the chat
        // form is rendered only for lines without `tokens`.
        let mut trajectory = if value.get("messages").is_some() && value.get("tokens").is_none() {
            if !allow_chat {
                bail!(
                    "{at}: chat-form lines (`messages`) are for rft; dapo needs token trajectories"
                );
            }
            if chat.is_none() {
                let tokenizer = Tokenizer::for_model_dir(model_dir)?;
                let template = ChatTemplate::for_tokenizer(&tokenizer)?;
                chat = Some((tokenizer, template));
            }
            let (tokenizer, template) = chat.as_ref().expect("just set");
            let masked = Conversation::from_json(&value)
                .and_then(|c| template.tokenize(tokenizer, &c))
                .with_context(|| at.clone())?;
            if let Some(&bad) = masked.tokens.iter().find(|&&id| id as usize >= vocab_size) {
                bail!("{at}: token id {bad} is outside the model's vocabulary of {vocab_size}");
            }
            Trajectory {
                location: String::new(),
                group: None,
                action_mask: masked.action_mask.iter().map(|&m| m == 1).collect(),
                tokens: masked.tokens,
                rollout_logprobs: None,
                reward: None,
            }
        } else {
            parse_trajectory(&value, vocab_size).map_err(|e| anyhow!("{at}: {e:#}"))?
        };
        if trajectory.tokens.len() > max_seq_len {
            bail!(
                "{at}: {} tokens exceed the maximum sequence length {max_seq_len}",
                trajectory.tokens.len()
            );
        }
        if trajectory.tokens.len() < 2 {
            bail!("{at}: a trajectory needs at least 2 tokens");
        }
        trajectory.location = at;
        out.push(trajectory);
    }
    if out.is_empty() {
        bail!("{}: no trajectories", path.display());
    }
    Ok(out)
}

/// DAPO advantages (RL-SPEC): per group of `G` trajectories, `A_i = (R_i - mean) / (std + 1e-6)`
/// with the sample standard deviation (divide by `G - 1`; a group of one gets 0).
pub fn group_advantages(trajectories: &[Trajectory]) -> Result<Vec<f64>> {
    let mut groups: Vec<(&str, Vec<usize>)> = Vec::new();
    for (i, t) in trajectories.iter().enumerate() {
        let group = t
            .group
            .as_deref()
            .ok_or_else(|| anyhow!("{}: dapo needs a `group`", t.location))?;
        if t.reward.is_none() {
            bail!("{}: dapo needs a `reward`", t.location);
        }
        match groups.iter_mut().find(|(g, _)| *g == group) {
            Some((_, members)) => members.push(i),
            None => groups.push((group, vec![i])),
        }
    }
    let mut advantages = vec![0.0; trajectories.len()];
    for (_, members) in groups {
        let rewards: Vec<f64> = members
            .iter()
            .map(|&i| trajectories[i].reward.expect("checked"))
            .collect();
        let n = rewards.len() as f64;
        let mean = rewards.iter().sum::<f64>() / n;
        if rewards.len() < 2 {
            continue;
        }
        let var = rewards.iter().map(|r| (r - mean) * (r - mean)).sum::<f64>() / (n - 1.0);
        for (&i, r) in members.iter().zip(&rewards) {
            advantages[i] = (r - mean) / (var.sqrt() + 1e-6);
        }
    }
    Ok(advantages)
}

/// One trajectory in row form (see the module doc), ready for the loss.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainSequence {
    pub location: String,
    pub tokens: Vec<u32>,
    pub targets: Vec<u32>,
    pub action_mask: Vec<bool>,
    pub advantage: f32,
    /// The sampler's logprob per row (0 off the mask or when the data has none).
    pub rollout_logprobs: Vec<f32>,
    pub has_rollout_logprobs: bool,
}

impl TrainSequence {
    pub fn from_trajectory(t: &Trajectory, advantage: f64) -> Self {
        let n = t.tokens.len();
        let mut targets = t.tokens[1..].to_vec();
        targets.push(0);
        let mut action_mask = t.action_mask[1..].to_vec();
        action_mask.push(false);
        let mut rollout_logprobs: Vec<f32> = match &t.rollout_logprobs {
            Some(lps) => lps[1..].iter().map(|lp| lp.unwrap_or(0.0)).collect(),
            None => vec![0.0; n - 1],
        };
        rollout_logprobs.push(0.0);
        Self {
            location: t.location.clone(),
            tokens: t.tokens.clone(),
            targets,
            action_mask,
            advantage: advantage as f32,
            rollout_logprobs,
            has_rollout_logprobs: t.rollout_logprobs.is_some(),
        }
    }

    pub fn num_action_tokens(&self) -> usize {
        self.action_mask.iter().filter(|&&a| a).count()
    }
}

/// Splits sequences of `lengths`, in order, into micro-batches of at most `micro_batch_tokens`
/// tokens each; a sequence longer than that runs alone (never truncated).
///
/// ```text
/// lengths 300 500 200 900 100, budget 1000  ->  [300 500 200] [900 100]
/// lengths 10 1500 10,           budget 1000  ->  [10] [1500] [10]
/// ```
pub fn pack_micro_batches(
    lengths: &[usize],
    micro_batch_tokens: usize,
) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut tokens) = (0, 0);
    for (i, &len) in lengths.iter().enumerate() {
        if i > start && tokens + len > micro_batch_tokens {
            out.push(start..i);
            start = i;
            tokens = 0;
        }
        tokens += len;
    }
    if start < lengths.len() {
        out.push(start..lengths.len());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_fills_micro_batches_in_order_and_never_splits_a_sequence() {
        assert_eq!(
            pack_micro_batches(&[300, 500, 200, 900, 100], 1000),
            vec![0..3, 3..5]
        );
        assert_eq!(pack_micro_batches(&[1500, 10, 10], 1000), vec![0..1, 1..3]);
        assert_eq!(
            pack_micro_batches(&[10, 1500, 10], 1000),
            vec![0..1, 1..2, 2..3]
        );
        assert!(pack_micro_batches(&[], 1000).is_empty());
    }

    #[test]
    fn row_form_shifts_mask_and_logprobs_by_one() {
        let t = Trajectory {
            location: "f:1".into(),
            group: None,
            tokens: vec![5, 6, 7, 8, 9],
            action_mask: vec![false, false, true, true, false],
            rollout_logprobs: Some(vec![None, None, Some(-0.5), Some(-1.5), None]),
            reward: None,
        };
        let s = TrainSequence::from_trajectory(&t, 2.0);
        assert_eq!(s.targets, vec![6, 7, 8, 9, 0]);
        assert_eq!(s.action_mask, vec![false, true, true, false, false]);
        assert_eq!(s.rollout_logprobs, vec![0.0, -0.5, -1.5, 0.0, 0.0]);
        assert_eq!(s.num_action_tokens(), 2);
        assert_eq!(t.num_action_tokens(), 2);
    }

    #[test]
    fn advantages_use_the_sample_std_per_group() {
        let t = |group: &str, reward: f64| Trajectory {
            location: "f:1".into(),
            group: Some(group.into()),
            tokens: vec![1, 2],
            action_mask: vec![false, true],
            rollout_logprobs: None,
            reward: Some(reward),
        };
        let data = [
            t("a", 1.0),
            t("a", 0.0),
            t("b", 0.5),
            t("b", 0.5),
            t("c", 1.0),
        ];
        let a = group_advantages(&data).unwrap();
        // Group a: mean 0.5, sample std sqrt(0.5).
        let std = 0.5f64.sqrt();
        assert!((a[0] - 0.5 / (std + 1e-6)).abs() < 1e-12);
        assert!((a[1] + 0.5 / (std + 1e-6)).abs() < 1e-12);
        // Equal rewards and a group of one: 0 (dropped by the trainer).
        assert_eq!(&a[2..], &[0.0, 0.0, 0.0]);
    }
}
