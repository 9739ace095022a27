//! `swerve-train rl` end to end on the CPU: the toy task is learned (resolved rate from its
//! random start to 0.9 or more), the rollout-vs-trainer logprob gap is exactly 0 on one backend,
//! a killed and resumed run continues exactly, an iteration on built-in Python tasks runs
//! through the bubblewrap sandbox, `--rollout-deadline` drops the episodes it stops, and across
//! processes the one with more room runs more task groups.

mod common;

use common::{bin_path, json_lines};
use serde_json::Value;
use std::process::Command;

/// Runs `swerve-train rl ARGS --device cpu`; returns its stderr.
fn rl(args: &[&str]) -> String {
    let out = Command::new(bin_path("swerve-train"))
        .arg("rl")
        .args(args)
        .args(["--device", "cpu"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "swerve-train rl {args:?} failed:\n{stderr}"
    );
    stderr
}

/// A line without its wall-clock times (the only part a rerun may change).
fn without_times(mut line: Value) -> Value {
    line.as_object_mut().unwrap().remove("time_s");
    line.as_object_mut().unwrap().remove("tokens_per_s");
    line
}

#[test]
fn the_toy_is_learned_and_the_logprob_gap_is_zero() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("toy");
    rl(&[
        "--model",
        "preset:toy",
        "--tasks",
        "builtin:toy",
        "--out",
        out.to_str().unwrap(),
        "--seed",
        "0",
    ]);
    let iterations = json_lines(&out.join("iterations.jsonl"));
    // The RFT phase's rollouts are the random base model's.
    assert_eq!(iterations[0]["phase"], "rft");
    let base = iterations[0]["resolved_rate"].as_f64().unwrap();
    assert!(base > 0.0 && base < 0.5, "the random model resolves {base}");
    let dapo: Vec<&Value> = iterations.iter().filter(|l| l["phase"] == "dapo").collect();
    let resolved: Vec<f64> = dapo
        .iter()
        .map(|l| l["resolved_rate"].as_f64().unwrap())
        .collect();
    let best_late = resolved[resolved.len() - 10..]
        .iter()
        .cloned()
        .fold(0.0, f64::max);
    let mean_late = resolved[resolved.len() - 10..].iter().sum::<f64>() / 10.0;
    assert!(
        mean_late >= 0.9,
        "resolved rate of the last 10 iterations {mean_late} (best {best_late}): {resolved:?}"
    );
    for line in &iterations {
        assert_eq!(line["logprob_gap_max"].as_f64(), Some(0.0), "{line}");
    }
    let png = std::fs::read(out.join("reward.png")).unwrap();
    assert_eq!(&png[..4], b"\x89PNG");
    let metrics = json_lines(&out.join("metrics.jsonl"));
    assert!(
        metrics.len() > dapo.len(),
        "several optimizer steps per iteration"
    );
}

#[test]
fn a_killed_and_resumed_run_continues_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let whole = dir.path().join("whole");
    let split = dir.path().join("split");
    let common = [
        "--model",
        "preset:toy",
        "--tasks",
        "builtin:toy",
        "--save-every",
        "2",
        "--no-rft-first",
        "--seed",
        "3",
    ];
    let mut args = common.to_vec();
    args.extend(["--out", whole.to_str().unwrap(), "--iterations", "4"]);
    rl(&args);
    let mut args = common.to_vec();
    args.extend(["--out", split.to_str().unwrap(), "--iterations", "2"]);
    rl(&args);
    // A run into a used folder without --resume is refused.
    let refused = Command::new(bin_path("swerve-train"))
        .args(["rl", "--device", "cpu"])
        .args(&args)
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--resume"));
    let mut args = common.to_vec();
    args.extend([
        "--out",
        split.to_str().unwrap(),
        "--iterations",
        "4",
        "--resume",
    ]);
    // A resume that changes what the run is made of is refused, naming each change.
    let mut changed = args.clone();
    changed.extend(["--batch-size", "16"]);
    let seed = changed.iter().position(|a| *a == "--seed").unwrap();
    changed[seed + 1] = "4";
    let refused = Command::new(bin_path("swerve-train"))
        .args(["rl", "--device", "cpu"])
        .args(&changed)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(
        stderr.contains("--seed: 3 in the run, 4 now")
            && stderr.contains("--batch-size: 32 in the run, 16 now"),
        "{stderr}"
    );
    rl(&args);
    // Checkpoints carry the starting model's own tokenizer files.
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        assert_eq!(
            std::fs::read(whole.join("iteration-000004").join(file)).unwrap(),
            std::fs::read(whole.join("base-model").join(file)).unwrap(),
            "{file}"
        );
    }
    let a = json_lines(&whole.join("iterations.jsonl"));
    let b = json_lines(&split.join("iterations.jsonl"));
    assert_eq!(a.len(), 4);
    assert_eq!(b.len(), 4);
    for (x, y) in a.into_iter().zip(b) {
        assert_eq!(without_times(x), without_times(y));
    }
    let a = json_lines(&whole.join("metrics.jsonl"));
    let b = json_lines(&split.join("metrics.jsonl"));
    assert_eq!(a.len(), b.len());
    for (x, y) in a.into_iter().zip(b) {
        assert_eq!(without_times(x), without_times(y));
    }
}

#[test]
fn an_iteration_on_python_tasks_runs_through_the_sandbox() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("py");
    rl(&[
        "--model",
        "preset:tiny",
        "--tasks",
        "builtin:python-bugs",
        "--out",
        out.to_str().unwrap(),
        "--iterations",
        "1",
        "--tasks-per-iteration",
        "2",
        "--group",
        "2",
        "--max-turns",
        "2",
        "--max-turn-tokens",
        "16",
        "--concurrency",
        "4",
    ]);
    let iterations = json_lines(&out.join("iterations.jsonl"));
    assert_eq!(iterations.len(), 1);
    let line = &iterations[0];
    assert_eq!(line["episodes"], 4);
    let finishes: u64 = line["finish"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(finishes, 4);
    assert!(line["finish"].get("error").is_none(), "{line}");
    assert!(out.join("iteration-000001/model.safetensors").is_file());
}

#[test]
fn the_loop_runs_tensor_parallel_learner_and_engine() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("toy-tp2");
    let log = rl(&[
        "--model",
        "preset:toy",
        "--tasks",
        "builtin:toy",
        "--out",
        out.to_str().unwrap(),
        "--seed",
        "0",
        "--iterations",
        "3",
        "--save-every",
        "3",
        "--tensor-parallel",
        "2",
    ]);
    // Both halves ran on two ranks.
    assert!(log.contains("ranks: tensor-parallel 2"), "{log}");
    assert!(log.contains("tensor-parallel 2); KV cache"), "{log}");
    let iterations = json_lines(&out.join("iterations.jsonl"));
    assert_eq!(
        iterations.len(),
        4,
        "the RFT phase and three DAPO iterations"
    );
    for line in &iterations {
        // Rollouts from the tensor-parallel engine, logp_old from the tensor-parallel learner:
        // the same model through other summation orders (the engine all-reduces, the trainer's
        // forward is sequence-parallel and its loss vocabulary-parallel).
        let gap = line["logprob_gap_max"].as_f64().unwrap();
        assert!(gap < 1e-4, "logprob gap {gap}: {line}");
    }
    // The same run in one rank: the same episodes and, step by step, the same loss and
    // gradient norm (a shard counted twice or missed in the norm or the loss would show).
    let single = dir.path().join("toy-tp1");
    rl(&[
        "--model",
        "preset:toy",
        "--tasks",
        "builtin:toy",
        "--out",
        single.to_str().unwrap(),
        "--seed",
        "0",
        "--iterations",
        "3",
        "--save-every",
        "3",
    ]);
    let want = json_lines(&single.join("iterations.jsonl"));
    for (g, w) in iterations.iter().zip(&want) {
        for key in [
            "episodes",
            "mean_reward",
            "trajectories_kept",
            "optimizer_steps",
        ] {
            assert_eq!(g[key], w[key], "iteration {}: {key}", w["iteration"]);
        }
    }
    assert_same_steps(
        &json_lines(&out.join("metrics.jsonl")),
        &json_lines(&single.join("metrics.jsonl")),
        "tensor-parallel 2",
    );
    // The checkpoint holds whole tensors: it loads in one rank.
    let checkpoint = out.join("iteration-000003");
    let backend = swerve::backend::cpu::CpuBackend::new();
    swerve::model::Qwen2Model::load(&backend, &checkpoint).unwrap();
}

/// A port with the next few free too (the processes meet at it, their data-parallel groups at
/// the ports after it).
fn free_port_block() -> u16 {
    loop {
        let base = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if base < 65000
            && (1..4).all(|i| std::net::TcpListener::bind(("127.0.0.1", base + i)).is_ok())
        {
            return base;
        }
    }
}

#[test]
fn two_processes_share_the_rollouts_and_train_as_data_parallel_replicas() {
    let dir = tempfile::tempdir().unwrap();
    let args = |out: &std::path::Path| -> Vec<String> {
        [
            "--model",
            "preset:toy",
            "--tasks",
            "builtin:toy",
            "--seed",
            "0",
            "--iterations",
            "2",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain(["--out".to_string(), out.display().to_string()])
        .collect()
    };
    let single = dir.path().join("one-process");
    rl(&args(&single).iter().map(String::as_str).collect::<Vec<_>>());
    let out = dir.path().join("two-processes");
    let port = free_port_block();
    let children: Vec<_> = (0..2)
        .map(|rank| {
            Command::new(bin_path("swerve-train"))
                .arg("rl")
                .args(args(&out))
                .args(["--device", "cpu"])
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", "2")
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .env_remove("SLURM_PROCID")
                .env_remove("TORCHELASTIC_USE_AGENT_STORE")
                .env_remove("SWERVE_RDZV_PORT")
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for (rank, child) in children.into_iter().enumerate() {
        let output = child.wait_with_output().unwrap();
        assert!(
            output.status.success(),
            "process {rank}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let (got, want) = (
        json_lines(&out.join("iterations.jsonl")),
        json_lines(&single.join("iterations.jsonl")),
    );
    assert_eq!(got.len(), want.len(), "the lines are written once");
    // The RFT phase's rollouts come from the same base model with the same seeds, wherever
    // each episode ran: the same episodes.
    for key in [
        "episodes",
        "mean_reward",
        "resolved_rate",
        "mean_turns",
        "action_tokens",
    ] {
        assert_eq!(got[0][key], want[0][key], "rft phase: {key}");
    }
    // Then DAPO on every episode as two data-parallel replicas (gradients summed across the
    // processes) against one: f32 noise apart, which changes no sampled token here (the CPU
    // backend's rows do not depend on what else an engine step holds).
    for (g, w) in got.iter().zip(&want) {
        for key in [
            "episodes",
            "mean_reward",
            "resolved_rate",
            "trajectories_kept",
        ] {
            assert_eq!(g[key], w[key], "iteration {}: {key}", g["iteration"]);
        }
    }
    assert_same_steps(
        &json_lines(&out.join("metrics.jsonl")),
        &json_lines(&single.join("metrics.jsonl")),
        "two processes",
    );
}

/// Two runs' optimizer steps, step by step: the same batches (trajectories, action tokens) and
/// the same loss and gradient norm up to f32 summation order. A data-parallel gradient summed
/// twice doubles the norm, a per-rank `N_act` halves the loss: both fail here (Adam being nearly
/// scale-invariant, rewards and resolved rates would not show either).
fn assert_same_steps(got: &[Value], want: &[Value], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: optimizer steps");
    assert!(!want.is_empty(), "{what}: no optimizer step ran");
    for (g, w) in got.iter().zip(want) {
        let step = &w["step"];
        for key in ["step", "iteration", "trajectories", "action_tokens", "lr"] {
            assert_eq!(g[key], w[key], "{what}: step {step}: {key}");
        }
        for key in ["loss", "grad_norm"] {
            let (a, b) = (g[key].as_f64().unwrap(), w[key].as_f64().unwrap());
            assert!(
                (a - b).abs() <= 1e-4 * b.abs().max(1e-3),
                "{what}: step {step}: {key} {a} against {b} in one rank"
            );
        }
    }
}

/// An iteration on tasks whose rewards are mixed within groups and non-dyadic (the coin policy:
/// `1[resolved] - turns / 30`, so 29/30 for a task resolved in one turn, whose mean over a group
/// of five is not exact in floating point): every uniform group is dropped whole, the others get RL-SPEC's
/// advantages, and the first DAPO step's loss equals a hand computation over the kept
/// trajectories (at the rollout weights the ratio is exactly 1, so
/// `L = -(sum_i A_i * n_i) / N_act` with `n_i` trajectory i's action tokens).
#[test]
fn mixed_groups_train_and_uniform_groups_drop_whole() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("coin-policy");
    common::coin::write_coin_policy(&model, 0.1);
    let tasks = common::coin::write_coin_tasks(&dir.path().join("tasks"), 3, 3, 4);
    let out = dir.path().join("run");
    rl(&[
        "--model",
        model.to_str().unwrap(),
        "--tasks",
        tasks.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--iterations",
        "1",
        "--tasks-per-iteration",
        "10",
        "--group",
        "5",
        "--max-turns",
        "30",
        "--turn-threshold",
        "0",
        "--max-turn-tokens",
        "32",
        "--batch-size",
        "64",
        "--concurrency",
        "10",
        "--save-rollouts",
    ]);
    let line = &json_lines(&out.join("iterations.jsonl"))[0];
    let episodes = json_lines(&out.join("rollouts/iteration-000001.jsonl"));
    assert_eq!(episodes.len(), 50);
    assert!(line["finish"].get("error").is_none(), "{line}");

    let ByHand {
        groups,
        uniform,
        uniform_inexact,
        dropped,
        weighted,
        action_tokens,
        kept,
    } = groups_by_hand(&episodes);
    assert!(
        uniform_inexact > 0,
        "no uniform group with an inexact mean: {line}"
    );
    assert!(kept > 0, "no mixed group: {line}");
    assert_eq!(line["groups"], groups);
    assert_eq!(line["groups_uniform"], uniform);
    assert_eq!(line["dropped"]["uniform_group"], dropped);
    assert_eq!(line["trajectories_kept"], kept);
    assert_eq!(line["optimizer_steps"], 1);

    // The first DAPO step, by hand.
    let step = &json_lines(&out.join("metrics.jsonl"))[0];
    eprintln!("{line}\n{step}");
    assert_eq!(step["trajectories"], kept);
    assert_eq!(step["action_tokens"], action_tokens);
    let want = -weighted / action_tokens as f64;
    let loss = step["loss"].as_f64().unwrap();
    assert!(
        (loss - want).abs() <= 1e-5 * want.abs().max(1e-3),
        "loss {loss}, by hand {want}"
    );
    assert_eq!(step["clip_frac_low"].as_f64(), Some(0.0));
    assert_eq!(step["clip_frac_high"].as_f64(), Some(0.0));
    assert_eq!(
        step["lr"].as_f64(),
        Some(1e-7),
        "DAPO's first warmup step: 1e-6 / 10"
    );
}

/// What the iteration's groups should have been, computed here from its saved rollouts.
struct ByHand {
    groups: usize,
    uniform: usize,
    /// Uniform groups whose mean, computed, is not their reward.
    uniform_inexact: usize,
    /// Trajectories in uniform groups.
    dropped: usize,
    /// Over the kept trajectories: the sum of A_i * n_i, the sum of n_i, and their number.
    weighted: f64,
    action_tokens: usize,
    kept: usize,
}

/// Rewards (`1[resolved] - turns / 30`), uniform groups (advantage 0, not kept) and RL-SPEC's
/// advantages for the others, checked against each saved line.
fn groups_by_hand(episodes: &[Value]) -> ByHand {
    let mut groups: std::collections::BTreeMap<String, Vec<&Value>> = Default::default();
    for e in episodes {
        let turns = e["turns"].as_f64().unwrap();
        let resolved = if e["resolved"].as_bool().unwrap() {
            1.0
        } else {
            0.0
        };
        let reward = e["reward"].as_f64().unwrap();
        assert!((reward - (resolved - turns / 30.0)).abs() < 1e-12, "{e}");
        groups
            .entry(e["group"].as_str().unwrap().to_string())
            .or_default()
            .push(e);
    }
    let (mut uniform, mut uniform_inexact, mut dropped) = (0, 0, 0);
    let (mut weighted, mut action_tokens, mut kept) = (0.0f64, 0usize, 0usize);
    for members in groups.values() {
        let rewards: Vec<f64> = members
            .iter()
            .map(|e| e["reward"].as_f64().unwrap())
            .collect();
        if rewards.iter().all(|&r| r == rewards[0]) {
            uniform += 1;
            dropped += members.len();
            // A group whose mean, computed, is not its reward: the float comparison of an
            // advantage to 0 would keep it.
            let mean = rewards.iter().sum::<f64>() / rewards.len() as f64;
            eprintln!("uniform group: rewards {rewards:?}, mean {mean:e}");
            if mean != rewards[0] {
                uniform_inexact += 1;
            }
            for e in members {
                assert_eq!(e["advantage"].as_f64(), Some(0.0), "{e}");
                assert_eq!(e["kept"], Value::Bool(false), "{e}");
            }
            continue;
        }
        let n = rewards.len() as f64;
        let mean = rewards.iter().sum::<f64>() / n;
        let std = (rewards.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
        for (e, r) in members.iter().zip(&rewards) {
            let a = (r - mean) / (std + 1e-6);
            assert!((e["advantage"].as_f64().unwrap() - a).abs() < 1e-12, "{e}");
            assert_eq!(e["kept"], Value::Bool(true), "{e}");
            let mask: Vec<u8> = serde_json::from_value(e["action_mask"].clone()).unwrap();
            let n_i = mask.iter().filter(|&&m| m == 1).count();
            weighted += a * n_i as f64;
            action_tokens += n_i;
            kept += 1;
        }
    }
    ByHand {
        groups: groups.len(),
        uniform,
        uniform_inexact,
        dropped,
        weighted,
        action_tokens,
        kept,
    }
}

/// A policy whose every bash turn sleeps `seconds` (bash with probability 0.9, else submit),
/// and `tasks` folder tasks it never resolves: every reward is 0, so no group trains (a step
/// of this model's 151,936-token head costs a minute here) and the rollouts are the test.
fn sleepy_run(dir: &std::path::Path, seconds: &str, tasks: usize) -> (String, String) {
    let model = dir.join("sleepy-policy");
    common::coin::write_command_policy(&model, 0.9, &["sleep", " ", seconds]);
    let tasks = common::coin::write_coin_tasks(&dir.join("tasks"), 0, tasks, 0);
    (
        model.to_str().unwrap().to_string(),
        tasks.to_str().unwrap().to_string(),
    )
}

/// `--rollout-deadline`: episodes that need ~2 s a turn for up to 5 turns (two waves of 4 on 4
/// workers: up to ~20 s without a deadline) stop at their first turn after 1.5 s, episodes not
/// started by then never start, and the iteration goes on with what finished.
#[test]
fn the_rollout_deadline_drops_unfinished_episodes_and_ends_the_rollouts_promptly() {
    let dir = tempfile::tempdir().unwrap();
    let (model, tasks) = sleepy_run(dir.path(), "2", 2);
    let out = dir.path().join("run");
    let started = std::time::Instant::now();
    let stderr = rl(&[
        "--model",
        &model,
        "--tasks",
        &tasks,
        "--out",
        out.to_str().unwrap(),
        "--iterations",
        "1",
        "--no-rft-first",
        "--tasks-per-iteration",
        "2",
        "--group",
        "4",
        "--max-turns",
        "5",
        "--max-turn-tokens",
        "32",
        "--concurrency",
        "4",
        "--rollout-deadline",
        "1.5",
    ]);
    let wall = started.elapsed().as_secs_f64();
    let line = &json_lines(&out.join("iterations.jsonl"))[0];
    let (finished, past, stopped) = (
        line["episodes"].as_u64().unwrap(),
        line["dropped"]["deadline"].as_u64().unwrap(),
        line["episodes_past_deadline"].as_u64().unwrap(),
    );
    eprintln!("{line}\nwall {wall:.1} s");
    assert_eq!(finished + past, 8, "{line}");
    // The first wave ran bash (p 0.9 a turn) past 1.5 s unless it submitted at once; a worker
    // stuck in a 2 s sleep at 1.5 s starts nothing more.
    assert!(stopped >= 1 && past > stopped, "{line}");
    assert_eq!(line["rollout_deadline_s"], 1.5);
    // One process; a second group is pulled only by a worker whose episode submitted at once.
    let groups = line["task_groups_by_process"].as_array().unwrap();
    assert!(
        groups.len() == 1 && groups[0].as_u64().unwrap() >= 1,
        "{line}"
    );
    let dropped: u64 = [
        "uniform_group",
        "zero_advantage",
        "infrastructure",
        "deadline",
    ]
    .iter()
    .map(|k| line["dropped"][k].as_u64().unwrap())
    .sum();
    assert_eq!(line["trajectories_dropped"].as_u64().unwrap(), dropped);
    assert_eq!(
        line["finish"].get("error"),
        None,
        "stopped is not failed: {line}"
    );
    let rollout_s = line["time_s"]["rollout"].as_f64().unwrap();
    assert!(rollout_s < 6.0, "the rollouts took {rollout_s} s");
    assert!(
        stderr.contains("--rollout-deadline 1.5 s dropped"),
        "{stderr}"
    );
}

/// Two processes pull task groups from process 0's queue as they have room: the one with four
/// workers takes more of the slow groups than the one with one, and every process still trains
/// on all of them.
#[test]
fn a_process_with_more_room_takes_more_task_groups() {
    let dir = tempfile::tempdir().unwrap();
    let (model, tasks) = sleepy_run(dir.path(), "1", 8);
    let out = dir.path().join("run");
    let port = free_port_block();
    let children: Vec<_> = [(0, "1"), (1, "4")]
        .into_iter()
        .map(|(rank, concurrency)| {
            Command::new(bin_path("swerve-train"))
                .arg("rl")
                .args(["--model", &model, "--tasks", &tasks])
                .args(["--out", out.to_str().unwrap()])
                .args(["--iterations", "1", "--no-rft-first"])
                .args(["--tasks-per-iteration", "8", "--group", "2"])
                .args(["--max-turns", "2", "--max-turn-tokens", "32"])
                .args(["--concurrency", concurrency, "--device", "cpu"])
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", "2")
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .env_remove("SLURM_PROCID")
                .env_remove("TORCHELASTIC_USE_AGENT_STORE")
                .env_remove("SWERVE_RDZV_PORT")
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut logs = Vec::new();
    for (rank, child) in children.into_iter().enumerate() {
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(output.status.success(), "process {rank}: {stderr}");
        logs.push(stderr);
    }
    let line = &json_lines(&out.join("iterations.jsonl"))[0];
    let by_process: Vec<u64> = line["task_groups_by_process"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_u64().unwrap())
        .collect();
    eprintln!("{line}");
    assert_eq!(by_process.iter().sum::<u64>(), 8, "{line}");
    assert!(by_process[1] > by_process[0], "{by_process:?}");
    assert_eq!(line["episodes"], 16, "every process has every episode");
    let ran = format!("process 1 ran {} of 8 task groups", by_process[1]);
    assert!(logs[1].contains(&ran), "{}", logs[1]);
}
