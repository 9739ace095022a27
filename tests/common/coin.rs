//! A policy that resolves some episodes and not others, and tasks it resolves always, never or
//! only where it chose to act: rewards that are mixed within groups (so DAPO steps really run)
//! and non-dyadic (the turn penalty in thirds), from a model the real engine samples.
//!
//! The policy ([`write_coin_policy`], a branching bigram model): every reply is one tool call,
//!
//! ```text
//!   <tool_call>{"name":"bash","arguments":{"command": "echo ok>answer"}}</tool_call>  p_bash
//!   <tool_call>{"name":"submit"}</tool_call>                                         1 - p_bash
//! ```
//!
//! so an episode runs bash k times (geometric), then submits (or meets `--max-turns`). The
//! tasks ([`write_coin_tasks`]): `always-N` (its test passes as the repository is), `never-N` (its
//! test fails whatever is done), `coin-N` (passes once a file `answer` holds `ok`: resolved when
//! bash ran before the submit). With `--turn-threshold 0 --max-turns 3` the reward of an episode
//! of `turns` turns is `1[resolved] - turns / 3`.

use serde_json::json;
use std::path::{Path, PathBuf};
use swerve::tokenizer::Tokenizer;

/// The single token `piece` encodes to (plain text; panics if it is more than one token).
fn token(tokenizer: &Tokenizer, piece: &str) -> u32 {
    let ids = tokenizer.encode_plain(piece).unwrap();
    assert_eq!(ids.len(), 1, "{piece:?} is {ids:?}, not one token");
    ids[0]
}

/// The special token `text` is (`<tool_call>`, `<|im_end|>`).
fn special(tokenizer: &Tokenizer, text: &str) -> u32 {
    let ids = tokenizer.encode(text).unwrap();
    assert_eq!(ids.len(), 1, "{text:?} is {ids:?}");
    ids[0]
}

/// Writes the coin policy (Qwen2.5's vocabulary) into `dir`: bash with probability `p_bash`
/// at each reply, else submit.
pub fn write_coin_policy(dir: &Path, p_bash: f64) {
    write_command_policy(dir, p_bash, &["echo", " ok", ">a", "ns", "wer"]);
}

/// The coin policy whose bash command is `command`, given as the one-token pieces it is made
/// of (each must be one token, and none one of the policy's other tokens): `["sleep", " ",
/// "2"]` makes every bash turn take two seconds (slow episodes for rollout deadlines).
pub fn write_command_policy(dir: &Path, p_bash: f64, command: &[&str]) {
    let tokenizer = Tokenizer::qwen25().unwrap();
    let plain =
        |pieces: &[&str]| -> Vec<u32> { pieces.iter().map(|p| token(&tokenizer, p)).collect() };
    let (open, close, im_end) = (
        special(&tokenizer, "<tool_call>"),
        special(&tokenizer, "</tool_call>"),
        special(&tokenizer, "<|im_end|>"),
    );
    // The generation prompt ends with "\n"; then `{"name":"` and the branch.
    let mut head = vec![token(&tokenizer, "\n"), open];
    head.extend(plain(&["{\"", "name", "\":\""]));
    let mut bash_pieces = vec![
        "bash",
        "\",\"",
        "arguments",
        "\":{\"",
        "command",
        "\":",
        " \"",
    ];
    bash_pieces.extend(command);
    bash_pieces.push("\"}}");
    let bash: Vec<u32> = plain(&bash_pieces);
    let submit: Vec<u32> = plain(&["submit", "\"}"]);
    let mut successors: Vec<(u32, u32, f64)> = Vec::new();
    let mut chain = |path: &[u32]| {
        for pair in path.windows(2) {
            successors.push((pair[0], pair[1], 1.0));
        }
    };
    chain(&head);
    chain(&[&bash[..], &[close, im_end]].concat());
    chain(&[&submit[..], &[close]].concat());
    let branch = *head.last().unwrap();
    successors.push((branch, bash[0], p_bash));
    successors.push((branch, submit[0], 1.0 - p_bash));
    // Every other token has one successor: the chain never loops into another path.
    for &(t, n, p) in &successors {
        assert!(
            p < 1.0 || successors.iter().all(|&(t2, n2, _)| t2 != t || n2 == n),
            "token {t} has two successors"
        );
    }
    swerve::model::synthetic::write_branching_model(dir, &successors, 151_936).unwrap();
}

/// Writes `always-1..=always`, `never-1..=never` and `coin-1..=coins` as folder tasks under `dir`;
/// returns the task file.
pub fn write_coin_tasks(dir: &Path, always: usize, never: usize, coins: usize) -> PathBuf {
    let kinds = [
        ("always", always, "self.assertTrue(True)"),
        ("never", never, "self.fail('this task cannot be resolved')"),
        (
            "coin",
            coins,
            "self.assertEqual(open('answer').read().strip(), 'ok')",
        ),
    ];
    let mut lines = String::new();
    for (kind, count, check) in kinds {
        for n in 1..=count {
            let id = format!("{kind}-{n}");
            let task = dir.join(&id);
            std::fs::create_dir_all(task.join("repo")).unwrap();
            std::fs::write(task.join("repo/README.md"), format!("Task {id}.\n")).unwrap();
            std::fs::create_dir_all(task.join("tests/tests")).unwrap();
            std::fs::write(task.join("tests/tests/__init__.py"), "").unwrap();
            std::fs::write(
                task.join("tests/tests/test_task.py"),
                format!(
                    "import unittest\n\n\nclass TaskTest(unittest.TestCase):\n    def test_task(self):\n        {check}\n"
                ),
            )
            .unwrap();
            let line = json!({
                "id": id,
                "repo": format!("{id}/repo"),
                "tests": format!("{id}/tests"),
                "problem_statement": format!("Write ok into a file named answer ({kind})."),
                "test_command": "python3 -m unittest -v tests.test_task",
                "timeout_s": 60,
            });
            lines.push_str(&format!("{line}\n"));
        }
    }
    let path = dir.join("tasks.jsonl");
    std::fs::write(&path, lines).unwrap();
    path
}
