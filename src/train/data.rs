//! Training data (RL-SPEC.md "Data formats"): trajectory lines, RFT's chat form, DAPO's group
//! advantages, the shift to row form the loss reads, and packing into micro-batches.
//!
//! Trajectory lines: `{"group", "tokens", "action_mask", "logprobs"?, "reward", "turns"?}`.
//! RFT also takes `{"messages": [...], "tools": [...]}`, rendered with the model's chat template
//! (assistant turns are the actions; `"loss": false` masks one); a line with both forms (a
//! rollout's) is read by its `tokens`. A line that does not parse, a
//! mask of the wrong length, a token id outside the vocabulary, or a sequence longer than the
//! maximum is an error naming `file:line`, never a skip. A file is read one line at a time into
//! [`PackedTrajectories`]: only the line being converted is ever a `serde_json::Value`.
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
use std::collections::HashMap;
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

/// Every trajectory of a data file, packed end to end: 4 bytes per token for the ids, 1 for the
/// action mask, 4 more only for trajectories that carry rollout logprobs (a `serde_json::Value`
/// per token would be about 50). Lines are converted one at a time as the file is read.
///
/// ```text
/// tokens          t t t t t | t t t | t t t t        every trajectory's ids, in file order
/// starts          0           5       8        12    n + 1 offsets into `tokens`
/// action          0 0 1 1 0 | 0 1 1 | 0 0 1 1        one byte per token (token form)
/// logprob_starts  Some(0)     None    Some(5)         where a trajectory's logprobs begin
/// logprobs        l l l l l |         l l l l        token form, 0 where the data has null
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PackedTrajectories {
    pub path: std::path::PathBuf,
    tokens: Vec<u32>,
    starts: Vec<usize>,
    action: Vec<u8>,
    logprobs: Vec<f32>,
    logprob_starts: Vec<Option<usize>>,
    /// Index into `group_names`.
    groups: Vec<Option<u32>>,
    group_names: Vec<String>,
    rewards: Vec<Option<f64>>,
    line_numbers: Vec<usize>,
}

impl PackedTrajectories {
    fn new(path: &Path) -> Self {
        Self {
            path: path.to_path_buf(),
            starts: vec![0],
            ..Self::default()
        }
    }

    fn push(&mut self, t: &Trajectory, line_no: usize, group_index: &mut HashMap<String, u32>) {
        self.tokens.extend_from_slice(&t.tokens);
        self.starts.push(self.tokens.len());
        self.action.extend(t.action_mask.iter().map(|&a| a as u8));
        self.logprob_starts
            .push(t.rollout_logprobs.as_ref().map(|lps| {
                let start = self.logprobs.len();
                self.logprobs.extend(lps.iter().map(|lp| lp.unwrap_or(0.0)));
                start
            }));
        self.groups.push(t.group.as_ref().map(|g| {
            let next = self.group_names.len() as u32;
            *group_index.entry(g.clone()).or_insert_with(|| {
                self.group_names.push(g.clone());
                next
            })
        }));
        self.rewards.push(t.reward);
        self.line_numbers.push(line_no);
    }

    /// Trajectories held.
    pub fn len(&self) -> usize {
        self.line_numbers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tokens over every trajectory.
    pub fn num_tokens(&self) -> usize {
        self.tokens.len()
    }

    pub fn tokens(&self, i: usize) -> &[u32] {
        &self.tokens[self.starts[i]..self.starts[i + 1]]
    }

    /// `file:line` of trajectory `i`.
    pub fn location(&self, i: usize) -> String {
        jsonl::at(&self.path, self.line_numbers[i])
    }

    pub fn has_rollout_logprobs(&self, i: usize) -> bool {
        self.logprob_starts[i].is_some()
    }

    /// Group and reward of every trajectory, for [`group_advantages`].
    pub fn group_rewards(&self) -> Vec<GroupReward<'_>> {
        (0..self.len())
            .map(|i| GroupReward {
                group: self.groups[i].map(|g| self.group_names[g as usize].as_str()),
                reward: self.rewards[i],
            })
            .collect()
    }

    /// Trajectory `i` in row form with `advantage`, for the loss.
    pub fn train_sequence(&self, i: usize, advantage: f64) -> TrainSequence {
        let tokens = self.tokens(i);
        let n = tokens.len();
        let action = &self.action[self.starts[i]..self.starts[i + 1]];
        let mut targets = tokens[1..].to_vec();
        targets.push(0);
        let mut action_mask: Vec<bool> = action[1..].iter().map(|&a| a == 1).collect();
        action_mask.push(false);
        let mut rollout_logprobs = match self.logprob_starts[i] {
            Some(start) => self.logprobs[start + 1..start + n].to_vec(),
            None => vec![0.0; n - 1],
        };
        rollout_logprobs.push(0.0);
        TrainSequence {
            location: self.location(i),
            tokens: tokens.to_vec(),
            targets,
            action_mask,
            advantage: advantage as f32,
            rollout_logprobs,
            has_rollout_logprobs: self.logprob_starts[i].is_some(),
        }
    }
}

/// A data file as the trainer holds it, and what its bytes hashed to (recorded in checkpoints, so
/// `--resume` with another file's data is refused).
pub struct DataFile {
    pub trajectories: PackedTrajectories,
    pub content: jsonl::ContentHash,
}

/// Reads a data file line by line into [`PackedTrajectories`]. Chat-form lines (`messages`) are
/// allowed when `allow_chat` (RFT) and are rendered with the tokenizer of `model_dir`.
pub fn read_trajectories(
    path: &Path,
    model_dir: &Path,
    vocab_size: usize,
    max_seq_len: usize,
    allow_chat: bool,
) -> Result<DataFile> {
    let mut chat: Option<(Tokenizer, ChatTemplate)> = None;
    let mut packed = PackedTrajectories::new(path);
    let mut group_index = HashMap::new();
    let mut lines = jsonl::ObjectLines::open(path)?;
    let mut infrastructure_errors = 0;
    while let Some((line_no, value)) = lines.next_object()? {
        let at = jsonl::at(path, line_no);
        // A rollout episode given up on an infrastructure failure keeps its tokens in the file
        // but is never trained on (as in the RL loop).
        if value.get("finish").and_then(Value::as_str) == Some("error") {
            infrastructure_errors += 1;
            continue;
        }
        // Token ids are the truth where a line has them (rollouts carry both forms); the chat
        // form is rendered only for lines without `tokens`.
        let trajectory = if value.get("messages").is_some() && value.get("tokens").is_none() {
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
        packed.push(&trajectory, line_no, &mut group_index);
    }
    if infrastructure_errors > 0 {
        eprintln!(
            "{}: {infrastructure_errors} episodes that ended in an infrastructure error (`\"finish\": \"error\"`) are left out",
            path.display()
        );
    }
    if packed.is_empty() {
        bail!("{}: no trajectories", path.display());
    }
    Ok(DataFile {
        trajectories: packed,
        content: lines.content_hash(),
    })
}

/// One trajectory's group and reward, as [`group_advantages`] reads them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GroupReward<'a> {
    pub group: Option<&'a str>,
    pub reward: Option<f64>,
}

/// DAPO advantages (RL-SPEC): per group of `G` trajectories, `A_i = (R_i - mean) / (std + 1e-6)`
/// with the sample standard deviation (divide by `G - 1`; a group of one gets 0). A group whose
/// rewards are all equal carries no signal: its advantages are exactly 0 (so it is dropped), for
/// any value; `(r - mean)` alone is not 0 when the mean of equal non-dyadic rewards rounds.
/// `location(i)` names trajectory `i` in errors.
pub fn group_advantages(
    trajectories: &[GroupReward<'_>],
    location: impl Fn(usize) -> String,
) -> Result<Vec<f64>> {
    let mut groups: Vec<(&str, Vec<usize>)> = Vec::new();
    let mut index: HashMap<&str, usize> = HashMap::new();
    for (i, t) in trajectories.iter().enumerate() {
        let group = t
            .group
            .ok_or_else(|| anyhow!("{}: dapo needs a `group`", location(i)))?;
        if t.reward.is_none() {
            bail!("{}: dapo needs a `reward`", location(i));
        }
        match index.get(group) {
            Some(&g) => groups[g].1.push(i),
            None => {
                index.insert(group, groups.len());
                groups.push((group, vec![i]));
            }
        }
    }
    let mut advantages = vec![0.0; trajectories.len()];
    for (_, members) in groups {
        let rewards: Vec<f64> = members
            .iter()
            .map(|&i| trajectories[i].reward.expect("checked"))
            .collect();
        if carries_no_signal(&rewards) {
            continue;
        }
        let n = rewards.len() as f64;
        let mean = rewards.iter().sum::<f64>() / n;
        let var = rewards.iter().map(|r| (r - mean) * (r - mean)).sum::<f64>() / (n - 1.0);
        for (&i, r) in members.iter().zip(&rewards) {
            advantages[i] = (r - mean) / (var.sqrt() + 1e-6);
        }
    }
    Ok(advantages)
}

/// Whether a group's rewards carry no signal: a single member, or every reward equal (compared
/// exactly, so a uniform group of non-dyadic rewards such as 1 - 1/30 is caught before any
/// arithmetic). [`group_advantages`] gives such a group advantage exactly 0: it drops whole.
pub fn carries_no_signal(rewards: &[f64]) -> bool {
    rewards.len() < 2 || rewards.iter().all(|&r| r == rewards[0])
}

/// Every group of `trajectories` and whether it [`carries_no_signal`].
pub fn group_signal<'a>(trajectories: &[GroupReward<'a>]) -> HashMap<&'a str, bool> {
    let mut rewards: HashMap<&str, Vec<f64>> = HashMap::new();
    for t in trajectories {
        rewards
            .entry(t.group.unwrap_or(""))
            .or_default()
            .push(t.reward.unwrap_or(0.0));
    }
    rewards
        .into_iter()
        .map(|(group, rewards)| (group, carries_no_signal(&rewards)))
        .collect()
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
    fn infrastructure_error_lines_are_left_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rollouts.jsonl");
        let lines = [
            r#"{"tokens": [1, 2, 3], "action_mask": [0, 1, 1], "group": "a", "reward": 1.0, "finish": "submitted"}"#,
            r#"{"tokens": [1, 2], "action_mask": [0, 0], "group": "a", "reward": 0.0, "finish": "error", "error": "docker run failed"}"#,
            r#"{"tokens": [1, 2, 4], "action_mask": [0, 1, 1], "group": "a", "reward": 0.0, "finish": "max_turns"}"#,
        ];
        std::fs::write(&path, lines.join("\n")).unwrap();
        let data = read_trajectories(&path, dir.path(), 10, 100, false).unwrap();
        assert_eq!(data.trajectories.len(), 2);
        std::fs::write(&path, lines[1]).unwrap();
        let err = format!(
            "{:#}",
            read_trajectories(&path, dir.path(), 10, 100, false)
                .err()
                .unwrap()
        );
        assert!(err.contains("no trajectories"), "{err}");
    }

    #[test]
    fn uniform_groups_get_exactly_zero_whatever_the_value() {
        // Ten rollouts resolved in 11 turns (reward 1 - 1/30 each): the mean of ten copies of a
        // non-dyadic value is not that value in floating point.
        let r = 1.0 - 1.0 / 30.0;
        assert_ne!((0..10).map(|_| r).sum::<f64>() / 10.0, r);
        for value in [r, 0.1, 1.0 / 3.0, -0.7, 0.0, 1.0] {
            let data: Vec<GroupReward<'_>> = (0..10)
                .map(|_| GroupReward {
                    group: Some("g"),
                    reward: Some(value),
                })
                .chain([
                    GroupReward {
                        group: Some("mixed"),
                        reward: Some(value),
                    },
                    GroupReward {
                        group: Some("mixed"),
                        reward: Some(value + 0.5),
                    },
                ])
                .collect();
            let a = group_advantages(&data, |i| format!("f:{i}")).unwrap();
            assert!(a[..10].iter().all(|&x| x == 0.0), "{value}: {a:?}");
            assert!(a[10] < 0.0 && a[11] > 0.0, "{a:?}");
        }
    }

    #[test]
    fn advantages_use_the_sample_std_per_group() {
        let t = |group: &'static str, reward: f64| GroupReward {
            group: Some(group),
            reward: Some(reward),
        };
        let data = [
            t("a", 1.0),
            t("b", 0.5),
            t("a", 0.0),
            t("b", 0.5),
            t("c", 1.0),
        ];
        let a = group_advantages(&data, |i| format!("f:{i}")).unwrap();
        // Group a: mean 0.5, sample std sqrt(0.5).
        let std = 0.5f64.sqrt();
        assert!((a[0] - 0.5 / (std + 1e-6)).abs() < 1e-12);
        assert!((a[2] + 0.5 / (std + 1e-6)).abs() < 1e-12);
        // Equal rewards and a group of one: 0 (dropped by the trainer).
        assert_eq!([a[1], a[3], a[4]], [0.0, 0.0, 0.0]);
        let missing = [
            t("a", 1.0),
            GroupReward {
                group: None,
                reward: Some(1.0),
            },
        ];
        let error = group_advantages(&missing, |i| format!("f:{}", i + 1)).unwrap_err();
        assert_eq!(error.to_string(), "f:2: dapo needs a `group`");
    }

    #[test]
    fn packed_trajectories_give_what_each_line_alone_gives() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.jsonl");
        let lines = [
            serde_json::json!({"group": "g1", "tokens": [5, 6, 7, 8], "action_mask": [0, 0, 1, 1],
                "logprobs": [null, null, -0.5, -1.5], "reward": 1.0}),
            serde_json::json!({"group": 7, "tokens": [1, 2, 3], "action_mask": [0, 1, 1], "reward": 0}),
            serde_json::json!({"group": "g1", "tokens": [9, 9], "action_mask": [1, 1],
                "logprobs": [-0.1, -0.2]}),
        ];
        let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
        std::fs::write(&path, &text).unwrap();
        let file = read_trajectories(&path, dir.path(), 10, 100, false).unwrap();
        let packed = &file.trajectories;
        assert_eq!(packed.len(), 3);
        assert_eq!(packed.num_tokens(), 9);
        assert_eq!(file.content, jsonl::hash_file(&path).unwrap());
        for (i, line) in lines.iter().enumerate() {
            let mut alone = parse_trajectory(line, 10).unwrap();
            alone.location = format!("{}:{}", path.display(), i + 1);
            let advantage = 0.25 * i as f64;
            assert_eq!(
                packed.train_sequence(i, advantage),
                TrainSequence::from_trajectory(&alone, advantage)
            );
            assert_eq!(packed.tokens(i), alone.tokens.as_slice());
            assert_eq!(
                packed.has_rollout_logprobs(i),
                alone.rollout_logprobs.is_some()
            );
        }
        let groups = packed.group_rewards();
        assert_eq!(
            groups[0],
            GroupReward {
                group: Some("g1"),
                reward: Some(1.0)
            }
        );
        assert_eq!(
            groups[1],
            GroupReward {
                group: Some("7"),
                reward: Some(0.0)
            }
        );
        assert_eq!(
            groups[2],
            GroupReward {
                group: Some("g1"),
                reward: None
            }
        );
    }
}
