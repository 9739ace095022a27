//! Agent rollouts end to end on the CPU through the local (bubblewrap) sandbox: the oracle
//! resolves every built-in task and noop none; a trajectory's chat form renders back to its
//! token form; malformed tool calls are masked format-error turns; grading ignores edits to the
//! tests; a model's rollouts (the real engine and sampler) carry logprobs that `score`
//! recomputes, and `rft` trains on them.

mod common;

use common::{bin_path, json_lines};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use swerve::agent::episode::{run_episode, Episode, EpisodeConfig, EpisodeContext, Finish};
use swerve::agent::policy::{Script, ScriptedPolicy};
use swerve::chat::{ChatTemplate, Conversation};
use swerve::env::local::{LocalConfig, LocalEnvironment};
use swerve::env::{builtin, load_tasks, Limits};
use swerve::tokenizer::Tokenizer;

fn train(args: &[&str]) -> Value {
    let out = Command::new(bin_path("swerve-train"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "swerve-train {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Value::Null
}

fn summary(out: &Path, name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(out.join(format!("{name}.json"))).unwrap())
        .unwrap()
}

/// The chat form, rendered by the template, gives the token form's ids and mask (the template
/// adds the "\n" after the last <|im_end|>, which the token form stops before).
fn assert_chat_form_matches_tokens(line: &Value, tokenizer: &Tokenizer, template: &ChatTemplate) {
    let conversation = Conversation::from_json(line).unwrap();
    let rendered = template.tokenize(tokenizer, &conversation).unwrap();
    let tokens: Vec<u32> = serde_json::from_value(line["tokens"].clone()).unwrap();
    let mask: Vec<u8> = serde_json::from_value(line["action_mask"].clone()).unwrap();
    assert_eq!(
        &rendered.tokens[..tokens.len()],
        &tokens[..],
        "{}",
        line["task"]
    );
    assert_eq!(
        &rendered.action_mask[..tokens.len()],
        &mask[..],
        "{}",
        line["task"]
    );
    assert!(rendered.tokens.len() - tokens.len() <= 1);
}

#[test]
fn oracle_resolves_every_builtin_task_noop_none_and_chat_forms_match() {
    let dir = tempfile::tempdir().unwrap();
    let tokenizer = Tokenizer::qwen25().unwrap();
    let template = ChatTemplate::for_tokenizer(&tokenizer).unwrap();
    let tasks = load_tasks(&builtin::resolve_tasks("builtin:python-bugs").unwrap()).unwrap();
    assert!(tasks.len() >= 20);
    for (policy, want_resolved) in [("oracle", tasks.len()), ("noop", 0)] {
        let out = dir.path().join(policy);
        train(&[
            "rollout",
            "--tasks",
            "builtin:python-bugs",
            "--policy",
            policy,
            "--group",
            "1",
            "--concurrency",
            "4",
            "--out",
            out.to_str().unwrap(),
        ]);
        let s = summary(&out, "rollout");
        assert_eq!(s["resolved"], json!(want_resolved), "{policy}: {s}");
        assert_eq!(s["finish"], json!({"submitted": tasks.len()}), "{policy}");
        let trajectories = json_lines(&out.join("trajectories.jsonl"));
        assert_eq!(trajectories.len(), tasks.len());
        for line in &trajectories {
            assert_eq!(
                line["resolved"],
                json!(policy == "oracle"),
                "{}",
                line["task"]
            );
            // Resolved in two turns (edit, submit) is under the turn threshold: reward 1.
            let want_reward = if policy == "oracle" { 1.0 } else { 0.0 };
            assert_eq!(line["reward"], json!(want_reward));
            assert_chat_form_matches_tokens(line, &tokenizer, &template);
        }
    }
}

fn local_env(limits: Limits, root: &Path) -> LocalEnvironment {
    let mut config = LocalConfig::new(limits);
    config.root = root.to_path_buf();
    LocalEnvironment::new(config).unwrap()
}

/// One episode of `task` in the local sandbox, its turns the given replies (then submit).
fn scripted_episode(
    replies: Vec<String>,
    task: &swerve::env::Task,
    dir: &Path,
    seed: u64,
) -> Episode {
    let tokenizer = Tokenizer::qwen25().unwrap();
    let template = ChatTemplate::for_tokenizer(&tokenizer).unwrap();
    let policy = ScriptedPolicy {
        tokenizer: Arc::new(Tokenizer::qwen25().unwrap()),
        script: Script::Replies(replies),
    };
    let env = local_env(Limits::default(), &dir.join("sandboxes"));
    let config = EpisodeConfig::default();
    let ctx = EpisodeContext {
        env: &env,
        policy: &policy,
        tokenizer: &tokenizer,
        template: &template,
        config: &config,
    };
    run_episode(&ctx, task, 0, seed)
}

#[test]
fn malformed_tool_calls_are_masked_format_error_turns() {
    let dir = tempfile::tempdir().unwrap();
    let tokenizer = Tokenizer::qwen25().unwrap();
    let template = ChatTemplate::for_tokenizer(&tokenizer).unwrap();
    let tasks = load_tasks(&builtin::resolve_tasks("builtin:python-bugs").unwrap()).unwrap();
    let replies = vec![
        "I think the bug is in the pager.".to_string(),
        "<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"ls\"\n</tool_call>"
            .to_string(),
        "<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call>"
            .to_string(),
        "<tool_call>\n{\"name\": \"rm_rf\", \"arguments\": {}}\n</tool_call>".to_string(),
        "<tool_call>\n{\"name\": \"bash\", \"arguments\": {}}\n</tool_call>".to_string(),
        "<tool_call>\n{\"name\": \"submit\", \"arguments\": {}}\n</tool_call>".to_string(),
    ];
    let episode = scripted_episode(replies.clone(), &tasks[0], dir.path(), 7);
    assert_eq!(episode.finish, Finish::Submitted);
    assert_eq!(episode.turns, 6);
    assert_eq!(episode.format_errors, 4);
    let line = episode.to_json();
    let messages = line["messages"].as_array().unwrap();
    let assistants: Vec<&Value> = messages
        .iter()
        .filter(|m| m["role"] == "assistant")
        .collect();
    let masked: Vec<bool> = assistants
        .iter()
        .map(|m| m["loss"] == json!(false))
        .collect();
    assert_eq!(masked, vec![true, true, false, true, true, false]);
    // Each format error is answered by a user message naming the problem; `ls` by its output.
    let users: Vec<&str> = messages
        .iter()
        .skip(2)
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert!(users[0].contains("no tool call"), "{}", users[0]);
    assert!(users[1].contains("not a JSON object"), "{}", users[1]);
    assert!(users[2].contains("unknown tool `rm_rf`"), "{}", users[2]);
    assert!(users[3].contains("`command`"), "{}", users[3]);
    let tool = messages.iter().find(|m| m["role"] == "tool").unwrap();
    assert!(
        tool["content"].as_str().unwrap().contains("pager"),
        "{tool}"
    );
    // Only the two valid turns (and their <|im_end|>) are actions.
    let mask: Vec<u8> = serde_json::from_value(line["action_mask"].clone()).unwrap();
    let want: usize = [&replies[2], &replies[5]]
        .iter()
        .map(|r| tokenizer.encode(r).unwrap().len() + 1)
        .sum();
    assert_eq!(mask.iter().map(|&m| m as usize).sum::<usize>(), want);
    assert_chat_form_matches_tokens(&line, &tokenizer, &template);
}

#[test]
fn grading_ignores_edits_to_the_tests() {
    let dir = tempfile::tempdir().unwrap();
    let tasks = load_tasks(&builtin::resolve_tasks("builtin:python-bugs").unwrap()).unwrap();
    let task = &tasks[0];
    let test_module = task.test_command().to_string();
    let module = test_module.rsplit(' ').next().unwrap().replace('.', "/");
    // The agent replaces the hidden test file with one that passes, then, in a second task
    // attempt, turns `tests` into a symlink to a folder of passing tests.
    let passing =
        "import unittest\nclass T(unittest.TestCase):\n    def test_ok(self):\n        pass\n";
    let replay = dir.path().join("replay.jsonl");
    let calls = json!([
        {"name": "str_replace_editor", "arguments": {"command": "create", "path": "tests/__init__.py", "file_text": ""}},
        {"name": "str_replace_editor", "arguments": {"command": "create", "path": format!("{module}.py"), "file_text": passing}},
        {"name": "bash", "arguments": {"command": format!("mkdir -p /home/agent/fake && cp -r tests/. /home/agent/fake/ && rm -rf tests && ln -s /home/agent/fake tests && python3 -m unittest -q {} && echo PASSES-HERE", test_module.rsplit(' ').next().unwrap())}},
    ]);
    std::fs::write(
        &replay,
        format!("{}\n", json!({"task": task.id, "tool_calls": calls})),
    )
    .unwrap();
    let out = dir.path().join("out");
    train(&[
        "rollout",
        "--tasks",
        "builtin:python-bugs",
        "--limit-tasks",
        "1",
        "--policy",
        &format!("replay:{}", replay.display()),
        "--group",
        "1",
        "--out",
        out.to_str().unwrap(),
    ]);
    let line = &json_lines(&out.join("trajectories.jsonl"))[0];
    let bash_result = line["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .nth(2)
        .unwrap()["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(bash_result.contains("PASSES-HERE"), "{bash_result}");
    assert_eq!(line["finish"], json!("submitted"));
    assert_eq!(line["resolved"], json!(false), "{line}");
}

/// `<tool_call>{"name":"bash","arguments":{"command": "ls"}}</tool_call><|im_end|>` as a chain of
/// unique tokens, started by the generation prompt's last token ("\n").
fn bash_ls_chain(tokenizer: &Tokenizer) -> Vec<(u32, u32)> {
    let reply =
        "<tool_call>{\"name\":\"bash\",\"arguments\":{\"command\": \"ls\"}}</tool_call><|im_end|>";
    let mut ids = vec![tokenizer.encode("\n").unwrap()[0]];
    ids.extend(tokenizer.encode(reply).unwrap());
    ids.windows(2).map(|w| (w[0], w[1])).collect()
}

/// Rollout flags both models of [`model_rollouts_carry_logprobs_that_score_recomputes_and_rft_trains_on`] share.
const ROLLOUT_FLAGS: [&str; 12] = [
    "--tasks",
    "builtin:python-bugs",
    "--limit-tasks",
    "2",
    "--group",
    "2",
    "--max-turns",
    "3",
    "--device",
    "cpu",
    "--concurrency",
    "4",
];

#[test]
fn model_rollouts_carry_logprobs_that_score_recomputes_and_rft_trains_on() {
    let dir = tempfile::tempdir().unwrap();
    let tokenizer = Tokenizer::qwen25().unwrap();
    let template = ChatTemplate::for_tokenizer(&tokenizer).unwrap();

    // A random model: every turn is a format error, but its sampled tokens keep their logprobs.
    let random_out = dir.path().join("random");
    let mut args = vec![
        "rollout",
        "--model",
        "preset:tiny",
        "--max-turn-tokens",
        "24",
    ];
    args.extend(ROLLOUT_FLAGS);
    args.extend(["--out", random_out.to_str().unwrap()]);
    train(&args);
    let random = json_lines(&random_out.join("trajectories.jsonl"));
    assert_eq!(random.len(), 4);

    // A model that calls `ls` every turn: three valid turns of 15 action tokens each.
    let bigram_dir = dir.path().join("bigram-model");
    swerve::model::synthetic::write_bigram_model(&bigram_dir, &bash_ls_chain(&tokenizer), 151_936)
        .unwrap();
    let ls_out = dir.path().join("ls");
    let mut args = vec!["rollout", "--model", bigram_dir.to_str().unwrap()];
    args.extend(ROLLOUT_FLAGS);
    args.extend(["--out", ls_out.to_str().unwrap()]);
    train(&args);
    let ls = json_lines(&ls_out.join("trajectories.jsonl"));
    assert_eq!(ls.len(), 4);
    check_ls_rollouts(&ls, &tokenizer, &template);

    // `score` recomputes every sampled token's logprob from the token ids alone.
    for (lines, model) in [
        (&random, random_out.join("base-model")),
        (&ls, bigram_dir.clone()),
    ] {
        score_recomputes_the_rollout_logprobs(dir.path(), lines, &model);
    }
    rft_trains_on_the_rollout_file(dir.path(), &bigram_dir, &ls_out);
}

/// The `ls` model's rollouts: every turn valid, 15 action tokens each, the tool's output the
/// task's package, and the chat form equal to the tokens.
fn check_ls_rollouts(ls: &[Value], tokenizer: &Tokenizer, template: &ChatTemplate) {
    for line in ls {
        assert_eq!(line["finish"], json!("max_turns"), "{line}");
        assert_eq!(line["format_errors"], json!(0));
        let mask: Vec<u8> = serde_json::from_value(line["action_mask"].clone()).unwrap();
        assert_eq!(mask.iter().filter(|&&m| m == 1).count(), 3 * 15);
        // `ls` in the workspace lists the task's package (pager/, calc/).
        let tool = line["messages"].as_array().unwrap()[3]["content"]
            .as_str()
            .unwrap();
        let package = if line["task"] == "paginate-last-page" {
            "pager"
        } else {
            "calc"
        };
        assert_eq!(tool.trim(), package, "{line}");
        assert_chat_form_matches_tokens(line, tokenizer, template);
    }
}

/// `score` over the rollouts' token ids gives every sampled token's rollout logprob.
fn score_recomputes_the_rollout_logprobs(dir: &Path, lines: &[Value], model: &Path) {
    let input = dir.join("score-in.jsonl");
    let output = dir.join("score-out.jsonl");
    let text: String = lines
        .iter()
        .map(|l| format!("{}\n", json!({"tokens": l["tokens"]})))
        .collect();
    std::fs::write(&input, text).unwrap();
    train(&[
        "score",
        "--model",
        model.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
        "--output",
        output.to_str().unwrap(),
        "--device",
        "cpu",
    ]);
    let mut compared = 0;
    for (line, scored) in lines.iter().zip(json_lines(&output)) {
        let rollout = line["logprobs"].as_array().unwrap();
        let recomputed = scored["logprobs"].as_array().unwrap();
        assert_eq!(rollout.len(), recomputed.len());
        for (t, (a, b)) in rollout.iter().zip(recomputed).enumerate() {
            if let Some(a) = a.as_f64() {
                let b = b.as_f64().unwrap();
                assert!((a - b).abs() <= 1e-4, "token {t}: rollout {a} vs score {b}");
                compared += 1;
            }
        }
    }
    assert!(compared >= 4 * 3 * 15, "{compared}");
}

/// RFT trains on the rollout file as it is (token form; format errors masked).
fn rft_trains_on_the_rollout_file(dir: &Path, bigram_dir: &Path, ls_out: &Path) {
    let rft_out = dir.join("rft");
    train(&[
        "rft",
        "--model",
        bigram_dir.to_str().unwrap(),
        "--data",
        ls_out.join("trajectories.jsonl").to_str().unwrap(),
        "--out",
        rft_out.to_str().unwrap(),
        "--batch-size",
        "2",
        "--device",
        "cpu",
    ]);
    let metrics = json_lines(&rft_out.join("metrics.jsonl"));
    assert_eq!(metrics.len(), 2);
    assert_eq!(metrics[0]["action_tokens"], json!(2 * 3 * 15));
}

#[test]
fn server_mode_gives_the_in_process_trajectories() {
    let dir = tempfile::tempdir().unwrap();
    let tokenizer = Tokenizer::qwen25().unwrap();
    let model = dir.path().join("bigram-model");
    swerve::model::synthetic::write_bigram_model(&model, &bash_ls_chain(&tokenizer), 151_936)
        .unwrap();
    let server = common::serve::Server::start(&model, &["--max-model-len", "4096"]);
    let mut runs = Vec::new();
    for (name, server_args) in [
        ("local", vec![]),
        ("server", vec!["--server".to_string(), server.url()]),
    ] {
        let out = dir.path().join(name);
        let mut args: Vec<String> = [
            "rollout",
            "--model",
            model.to_str().unwrap(),
            "--tasks",
            "builtin:python-bugs",
            "--limit-tasks",
            "1",
            "--group",
            "2",
            "--max-turns",
            "2",
            "--max-context",
            "4096",
            "--device",
            "cpu",
            "--out",
            out.to_str().unwrap(),
        ]
        .map(String::from)
        .to_vec();
        args.extend(server_args);
        train(&args.iter().map(String::as_str).collect::<Vec<_>>());
        runs.push(json_lines(&out.join("trajectories.jsonl")));
    }
    assert_eq!(runs[0].len(), 2);
    for (a, b) in runs[0].iter().zip(&runs[1]) {
        assert_eq!(a["tokens"], b["tokens"]);
        assert_eq!(a["action_mask"], b["action_mask"]);
        assert_eq!(a["messages"], b["messages"]);
        assert_eq!(b["finish"], json!("max_turns"));
        for (x, y) in a["logprobs"]
            .as_array()
            .unwrap()
            .iter()
            .zip(b["logprobs"].as_array().unwrap())
        {
            match (x.as_f64(), y.as_f64()) {
                (Some(x), Some(y)) => assert!((x - y).abs() <= 1e-5, "{x} vs {y}"),
                (None, None) => {}
                other => panic!("logprob present in one form only: {other:?}"),
            }
        }
    }
}

#[test]
fn the_editor_views_edits_inserts_and_undoes_inside_the_sandbox() {
    let dir = tempfile::tempdir().unwrap();
    let tasks = load_tasks(&builtin::resolve_tasks("builtin:python-bugs").unwrap()).unwrap();
    let editor = |args: Value| {
        format!(
            "<tool_call>\n{}\n</tool_call>",
            json!({"name": "str_replace_editor", "arguments": args})
        )
    };
    let file = "pager/core.py";
    let replies = vec![
        editor(json!({"command": "view", "path": "/workspace"})),
        editor(json!({"command": "view", "path": file, "view_range": [1, 2]})),
        editor(json!({"command": "str_replace", "path": file, "old_str": "def "})),
        editor(json!({"command": "str_replace", "path": file, "old_str": "no such text", "new_str": "x"})),
        editor(json!({"command": "insert", "path": file, "insert_line": 0, "new_str": "# header"})),
        editor(json!({"command": "view", "path": file, "view_range": [1, 1]})),
        editor(json!({"command": "undo_edit", "path": file})),
        editor(json!({"command": "view", "path": file, "view_range": [1, 1]})),
        editor(json!({"command": "create", "path": file, "file_text": "x"})),
        editor(json!({"command": "create", "path": "notes/new.txt", "file_text": "hello\n"})),
        "<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"cat notes/new.txt; ls /\"}}\n</tool_call>".to_string(),
        editor(json!({"command": "view", "path": "/etc/shadow"})),
    ];
    let episode = scripted_episode(replies, &tasks[0], dir.path(), 1);
    assert_eq!(episode.finish, Finish::Submitted, "{:?}", episode.finish);
    assert_eq!(episode.format_errors, 0);
    let line = episode.to_json();
    let results: Vec<&str> = line["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    let expect = [
        "/workspace/pager/core.py",
        "     1\t",
        "Multiple occurrences of old_str `def `",
        "did not appear verbatim",
        "has been edited",
        "     1\t# header",
        "undone successfully",
        "     1\t\"\"\"",
        "already exists",
        "created successfully",
        "hello",
        "Error",
    ];
    assert_eq!(results.len(), expect.len());
    for (result, want) in results.iter().zip(expect) {
        assert!(result.contains(want), "want {want:?} in:\n{result}");
    }
    // The sandbox cannot read /etc/shadow (root only; the agent runs as its own uid).
    assert!(!results[11].contains("root:"), "{}", results[11]);
}

#[test]
fn eval_reports_pass_at_k() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("eval");
    train(&[
        "eval",
        "--tasks",
        "builtin:python-bugs",
        "--limit-tasks",
        "3",
        "--policy",
        "oracle",
        "--group",
        "2",
        "--out",
        out.to_str().unwrap(),
    ]);
    let s = summary(&out, "eval");
    assert_eq!(s["tasks"], json!(3));
    assert_eq!(s["pass@1"], json!(1.0));
    assert_eq!(s["pass@2"], json!(1.0));
    assert_eq!(s["per_task"].as_array().unwrap().len(), 3);
    // SWE-bench's predictions file per sample: every task once, its patch the oracle's fix.
    let trajectories = json_lines(&out.join("trajectories.jsonl"));
    for sample in 0..2 {
        let predictions = json_lines(&out.join(format!("predictions/sample-{sample}.jsonl")));
        assert_eq!(predictions.len(), 3);
        for p in &predictions {
            assert_eq!(p["model_name_or_path"], json!("swerve-oracle"));
            let line = trajectories
                .iter()
                .find(|t| t["task"] == p["instance_id"] && t["sample"] == json!(sample))
                .unwrap();
            assert_eq!(p["model_patch"], line["patch"]);
            assert!(
                p["model_patch"]
                    .as_str()
                    .unwrap()
                    .starts_with("diff --git a/"),
                "{p}"
            );
        }
    }
}

/// pass@k on a policy that resolves some samples and not others (the coin policy: bash or
/// submit at each reply, each at 1/2): eval's pass@k equals the unbiased estimator computed
/// here a different way, by counting the k-subsets of each task's samples that hold a resolved
/// one, from the trajectories alone.
#[test]
fn eval_pass_at_k_on_a_policy_that_resolves_some() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("coin-policy");
    common::coin::write_coin_policy(&model, 0.5);
    let tasks = common::coin::write_coin_tasks(&dir.path().join("tasks"), 1, 1, 3);
    let out = dir.path().join("eval");
    let group = 6;
    train(&[
        "eval",
        "--model",
        model.to_str().unwrap(),
        "--tasks",
        tasks.to_str().unwrap(),
        "--group",
        &group.to_string(),
        "--max-turns",
        "3",
        "--max-turn-tokens",
        "32",
        "--concurrency",
        "10",
        "--out",
        out.to_str().unwrap(),
    ]);
    let s = summary(&out, "eval");
    let lines = json_lines(&out.join("trajectories.jsonl"));
    assert_eq!(lines.len(), 5 * group);
    let mut partly = 0;
    let mut pass = vec![0.0f64; group + 1];
    for t in s["per_task"].as_array().unwrap() {
        let resolved: Vec<bool> = lines
            .iter()
            .filter(|l| l["task"] == t["task"])
            .map(|l| l["resolved"].as_bool().unwrap())
            .collect();
        assert_eq!(resolved.len(), group);
        let c = resolved.iter().filter(|&&r| r).count();
        assert_eq!(t["resolved"], json!(c), "{t}");
        if t["task"].as_str().unwrap().starts_with("never") {
            assert_eq!(c, 0, "{t}");
        }
        partly += usize::from(c > 0 && c < group);
        // Every k-subset of the samples, as a bit mask: the share holding a resolved one.
        for (k, p) in pass.iter_mut().enumerate().skip(1) {
            let subsets: Vec<u32> = (0u32..1 << group)
                .filter(|m| m.count_ones() as usize == k)
                .collect();
            let hit = subsets
                .iter()
                .filter(|&&m| (0..group).any(|i| m & (1 << i) != 0 && resolved[i]))
                .count();
            *p += hit as f64 / subsets.len() as f64;
        }
    }
    assert!(
        partly >= 2,
        "too few tasks resolved by some samples only: {s}"
    );
    for k in [1, 2, 4, group] {
        let want = pass[k] / 5.0;
        let got = s[format!("pass@{k}")].as_f64().unwrap();
        assert!(
            (got - want).abs() < 1e-12,
            "pass@{k}: {got}, counted {want}"
        );
    }
    let (p1, p2) = (s["pass@1"].as_f64().unwrap(), s["pass@2"].as_f64().unwrap());
    assert!(0.0 < p1 && p1 < p2 && p2 < 1.0, "{s}");
}
