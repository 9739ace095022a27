//! `swerve-bench` end to end on the CPU backend: the agent workload runs through the engine,
//! hits the prefix cache, and reports; bad flags are named.

mod common;

use common::bin_path;
use serde_json::Value;
use std::process::Command;

#[test]
fn agent_workload_runs_and_hits_the_prefix_cache() {
    let out = Command::new(bin_path("swerve-bench"))
        .args(["agent", "--device", "cpu", "--tasks", "1", "--group", "3"])
        .args(["--max-context", "400"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find(|l| l.starts_with("prefix-cache hit rate"))
        .unwrap_or_else(|| panic!("no report in {stdout}"));
    let rate: f64 = line
        .trim_start_matches("prefix-cache hit rate ")
        .split('%')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    // Two of three rollouts reuse the prompt; later turns reuse their history.
    assert!(rate > 50.0, "{line}");
    assert!(stdout.contains("rollouts 3"), "{stdout}");
}

#[test]
fn agent_refuses_a_context_beyond_the_model() {
    let out = Command::new(bin_path("swerve-bench"))
        .args(["agent", "--device", "cpu", "--max-context", "100000"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--max-context 100000"));
}

#[test]
fn slow_env_compares_one_knob_two_knobs_and_a_warm_pool() {
    let dir = tempfile::tempdir().unwrap();
    let jsonl = dir.path().join("slow.jsonl");
    let out = Command::new(bin_path("swerve-bench"))
        .args(["agent", "--device", "cpu", "--preset", "tiny"])
        .args([
            "--tasks",
            "2",
            "--group",
            "8",
            "--slow-env",
            "0.2,0.05",
            "--jsonl",
        ])
        .arg(&jsonl)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let records: Vec<Value> = std::fs::read_to_string(&jsonl)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let names: Vec<&str> = records
        .iter()
        .map(|r| r["configuration"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["coupled", "separate", "separate+warm"]);
    for r in &records {
        assert_eq!(r["episodes"], 16, "{r}");
        let busy = r["engine_busy_fraction"].as_f64().unwrap();
        assert!(busy > 0.0 && busy <= 1.0, "{r}");
        let exposed = r["startup_exposed_s"].as_f64().unwrap();
        let hidden = r["startup_hidden_s"].as_f64().unwrap();
        // Every episode starts one sandbox of 0.2 s: exposed + hidden covers the 16 starts.
        assert!(exposed + hidden >= 16.0 * 0.2 - 1e-6, "{r}");
        if r["warm_pool"] == 0 {
            assert_eq!(hidden, 0.0, "{r}");
        } else {
            // 8 sandboxes take the first 8 episodes at once; the pool starts the next ones.
            assert!(hidden > 0.0, "{r}");
        }
    }
    // One knob: 2 sandboxes for a batch of 2; two knobs: 8 sandboxes, the same batch.
    assert_eq!(records[0]["sandboxes"], records[0]["engine_batch"]);
    assert_eq!(records[1]["engine_batch"], records[0]["engine_batch"]);
    assert!(records[1]["sandboxes"].as_u64() > records[0]["sandboxes"].as_u64());
}

#[test]
fn decode_reports_each_batch_size_and_writes_jsonl() {
    let dir = tempfile::tempdir().unwrap();
    let jsonl = dir.path().join("decode.jsonl");
    let out = Command::new(bin_path("swerve-bench"))
        .args(["decode", "--device", "cpu", "--batch-sizes", "1,3"])
        .args(["--context", "40", "--steps", "2", "--jsonl"])
        .arg(&jsonl)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let records: Vec<serde_json::Value> = std::fs::read_to_string(&jsonl)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), 2, "{records:?}");
    for (record, batch) in records.iter().zip([1, 3]) {
        assert_eq!(record["table"], "decode");
        assert!(record["key"]
            .as_str()
            .unwrap()
            .contains(&format!("batch={batch} context=40")));
        assert!(record["tokens_per_s"].as_f64().unwrap() > 0.0);
        // Weights (f32 on the CPU) plus the K/V of every cached token.
        assert!(record["bytes_per_step"].as_f64().unwrap() > 1e6);
    }
}

#[test]
fn decode_refuses_a_context_beyond_the_model() {
    let out = Command::new(bin_path("swerve-bench"))
        .args(["decode", "--device", "cpu", "--context", "1000000"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("context 1000000"), "{stderr}");
}

#[test]
fn agent_through_http_reports_host_time_next_to_the_in_process_run() {
    let dir = tempfile::tempdir().unwrap();
    let jsonl = dir.path().join("agent.jsonl");
    let out = Command::new(bin_path("swerve-bench"))
        .args(["agent", "--device", "cpu", "--tasks", "1", "--group", "2"])
        .args(["--max-context", "300", "--http", "--jsonl"])
        .arg(&jsonl)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    host_time_is_above_zero_and_within_the_wall_time(&stdout);
    the_record_gives_the_host_time_again(&stdout, &common::json_lines(&jsonl)[0]);
    both_runs_do_the_same_turns(&stdout);
}

/// The printed host time per generated token (us) of the report line starting with `prefix`.
fn host_us_per_token(stdout: &str, prefix: &str) -> f64 {
    let line = stdout
        .lines()
        .find(|l| l.starts_with(prefix) && l.contains("host time per generated token"))
        .unwrap_or_else(|| panic!("no {prefix:?} host-time line in {stdout}"));
    line.rsplit("token ")
        .next()
        .and_then(|s| s.trim_end_matches(" us").split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("cannot read {line:?}"))
}

/// The wall time per generated token (us) from the tokens/s line starting with `prefix`
/// (printed to the unit, hence the half token/s).
fn wall_us_per_token(stdout: &str, prefix: &str) -> f64 {
    let line = stdout
        .lines()
        .find(|l| l.starts_with(prefix) && l.ends_with(" tokens/s"))
        .unwrap_or_else(|| panic!("no {prefix:?} tokens/s line in {stdout}"));
    let tokens_per_s: f64 = line
        .trim_end_matches(" tokens/s")
        .rsplit(' ')
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("cannot read {line:?}"));
    1e6 / (tokens_per_s - 0.5)
}

/// Host time per token is wall time minus model time, over the tokens: above 0 (the engine's
/// scheduling is never free; 0 is what the clamp gives when model time exceeds the wall time it
/// is part of) and at most the wall time per token, which the report's tokens/s gives
/// independently (printed to the unit, hence the half token/s; the host time to 0.1 us).
fn host_time_is_above_zero_and_within_the_wall_time(stdout: &str) {
    for (host, wall) in [
        ("host time", "rollouts 2"),
        ("through HTTP", "through HTTP: rollouts"),
    ] {
        let host_us = host_us_per_token(stdout, host);
        let wall_us = wall_us_per_token(stdout, wall);
        assert!(
            host_us > 0.0 && host_us <= wall_us + 0.05,
            "{host}: host time per token {host_us} us against wall time per token {wall_us} us"
        );
    }
}

/// In process, the record's other fields give the host time again: wall time = generated /
/// tokens/s, model time = steps x mean step x (1 - host overhead share of the steps).
fn the_record_gives_the_host_time_again(stdout: &str, record: &Value) {
    assert_eq!(record["table"], "agent");
    let field = |key: &str| {
        record[key]
            .as_f64()
            .unwrap_or_else(|| panic!("no {key} in {record}"))
    };
    let generated: f64 = stdout
        .lines()
        .find(|l| l.starts_with("rollouts 2"))
        .and_then(|l| l.split("generated ").nth(1))
        .and_then(|s| s.split(' ').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no generated tokens in {stdout}"));
    let wall_seconds = generated / field("tokens_per_s");
    let model_seconds =
        field("steps") * field("mean_step_ms") / 1e3 * (1.0 - field("host_overhead"));
    let want_us = (wall_seconds - model_seconds) / generated * 1e6;
    let got_us = field("host_us_per_token");
    assert!(
        (got_us - want_us).abs() <= 1e-9 * wall_seconds / generated * 1e6,
        "host time per token {got_us} us, but the record's other fields give {want_us} us"
    );
    assert!(
        (got_us - host_us_per_token(stdout, "host time")).abs() <= 0.051,
        "printed {} us, recorded {got_us} us",
        host_us_per_token(stdout, "host time")
    );
}

/// Same workload both ways: the same turns, and the HTTP run hits the prefix cache too.
fn both_runs_do_the_same_turns(stdout: &str) {
    assert!(stdout.contains("rollouts 2, turns"), "{stdout}");
    let http = stdout
        .lines()
        .find(|l| l.starts_with("through HTTP: rollouts"))
        .unwrap();
    let in_process = stdout
        .lines()
        .find(|l| l.starts_with("rollouts 2"))
        .unwrap();
    let turns = |l: &str| l.split(", ").nth(1).map(str::to_string);
    assert_eq!(
        turns(http.trim_start_matches("through HTTP: ")),
        turns(in_process)
    );
    assert!(
        stdout.contains("through HTTP: prefix-cache hit rate"),
        "{stdout}"
    );
}

#[test]
fn train_reports_a_step_and_refuses_bad_packing() {
    let dir = tempfile::tempdir().unwrap();
    let jsonl = dir.path().join("train.jsonl");
    let out = Command::new(bin_path("swerve-bench"))
        .args([
            "train",
            "--device",
            "cpu",
            "--tokens",
            "32",
            "--seq-len",
            "16",
        ])
        .args(["--reps", "1", "--jsonl"])
        .arg(&jsonl)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let record: serde_json::Value =
        serde_json::from_str(std::fs::read_to_string(&jsonl).unwrap().trim()).unwrap();
    assert_eq!(record["key"], "preset=default tokens=32 seq_len=16");
    assert!(record["tokens_per_s"].as_f64().unwrap() > 0.0);
    assert!(record["tflops"].as_f64().unwrap() > 0.0);

    let out = Command::new(bin_path("swerve-bench"))
        .args([
            "train",
            "--device",
            "cpu",
            "--tokens",
            "30",
            "--seq-len",
            "16",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("30 tokens do not pack into sequences of 16"),
        "{stderr}"
    );
}

#[test]
fn yarn4_presets_reach_131k_and_write_a_loadable_folder() {
    let (config, _) = swerve::model::synthetic::preset("default-yarn4").unwrap();
    assert_eq!(config.max_context(), 131_072);
    let dir = tempfile::tempdir().unwrap();
    swerve::model::synthetic::write_model_dir(&config, 7, dir.path()).unwrap();
    let loaded = swerve::config::ModelConfig::from_dir(dir.path()).unwrap();
    assert_eq!(loaded, config);
    assert!(swerve::model::synthetic::preset("nonsense-yarn4").is_err());
}

fn plan(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(bin_path("swerve-bench"))
        .arg("plan")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn plan_prints_the_papers_setup_and_the_context_parallelism_it_would_need() {
    let paper = [
        "--gpus",
        "128",
        "--gpu-memory",
        "141",
        "--context",
        "131072",
    ];
    let (ok, stdout, stderr) = plan(&paper);
    assert!(ok, "{stdout}{stderr}");
    for line in [
        "TP 8 x DP 16, context 131,072",
        "training: micro-batch of 131,072 tokens (16,384 rows a rank",
        "f32 gradients",
        "f32 masters + 2 moments of 568,328,192 (ZeRO-1 / 16)",
        "kept layer inputs (80 x [T/8, d])",
        "fused loss tiles (vocabulary 19,008 a rank)",
        "rollouts: 10 sequences of 131,072 tokens",
        "KV cache: 10 x 131,072 tokens x 40,960 B",
        "at most ",
        "KV cache of the colocated rollouts a GPU, by what the trainer keeps while they run:",
        "gradients given back (rl's default)",
        "(--offload-optimizer)   2,758,064 tokens (+166,496): 21 sequences of 131,072",
    ] {
        assert!(stdout.contains(line), "no {line:?} in\n{stdout}");
    }
    let verdicts = stdout.lines().filter(|l| l.starts_with("peak: ")).count();
    assert_eq!(verdicts, 2, "{stdout}");
    // Two 131k sequences a micro-batch do not fit: context parallelism 2 halves the activations.
    let mut doubled = paper.to_vec();
    doubled.extend(["--micro-batch-tokens", "262144"]);
    let (ok, stdout, _) = plan(&doubled);
    assert!(ok);
    assert!(stdout.contains("does not fit"), "{stdout}");
    assert!(
        stdout.contains("needs context parallelism 2: activations "),
        "{stdout}"
    );
}

#[test]
fn plan_refuses_bad_flags_naming_them() {
    for (args, expected) in [
        (
            vec!["--gpus", "0", "--gpu-memory", "80"],
            "--gpus must be at least 1",
        ),
        (
            vec!["--gpus", "8", "--gpu-memory", "0"],
            "--gpu-memory must be a positive",
        ),
        (
            vec!["--gpus", "8", "--gpu-memory", "NaN"],
            "--gpu-memory must be a positive",
        ),
        (vec!["--gpus", "8", "--gpu-memory", "-80"], "--gpu-memory"),
        (
            vec!["--gpus", "128", "--gpu-memory", "80", "--tp", "3"],
            "--tp 3 does not divide --gpus 128",
        ),
        (
            vec!["--gpus", "128", "--gpu-memory", "80", "--tp", "128"],
            "--tp 128: tensor-parallel size 128 is more than num_attention_heads (64)",
        ),
        (
            vec![
                "--gpus",
                "16",
                "--gpu-memory",
                "80",
                "--tp",
                "8",
                "--dp",
                "4",
            ],
            "--tp 8 x --dp 4 is 32 GPUs, not --gpus 16",
        ),
        (
            vec![
                "--gpus",
                "8",
                "--gpu-memory",
                "80",
                "--preset",
                "qwen2.5-72b",
                "--context",
                "131072",
            ],
            "--context 131072 must be from 1 to the model's 32768 positions",
        ),
        (
            vec!["--gpus", "8", "--gpu-memory", "80", "--group", "0"],
            "--group must be positive",
        ),
        (
            vec![
                "--gpus",
                "8",
                "--gpu-memory",
                "80",
                "--micro-batch-tokens",
                "0",
            ],
            "--micro-batch-tokens must be positive",
        ),
        (
            vec!["--gpus", "8", "--gpu-memory", "80", "--reserve", "90"],
            "--reserve must be",
        ),
        (
            vec!["--gpus", "8", "--gpu-memory", "80", "--preset", "nonsense"],
            "--preset",
        ),
        (
            vec!["--gpus", "8", "--gpu-memory", "80", "--mode", "both"],
            "--mode",
        ),
        (vec!["--gpu-memory", "80"], "--gpus"),
    ] {
        let (ok, stdout, stderr) = plan(&args);
        assert!(!ok, "{args:?} was accepted:\n{stdout}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}

/// `swerve-bench ARGS --device cpu --tensor-parallel 2 --jsonl FILE` on the default preset (two
/// ranks of one thread each): stdout and the records, after checking that it succeeded, that
/// the table's header says TP 2 and that every record carries `tensor_parallel: 2`.
fn run_at_tp2(args: &[&str]) -> (String, Vec<Value>) {
    let dir = tempfile::tempdir().unwrap();
    let jsonl = dir.path().join("bench.jsonl");
    let out = Command::new(bin_path("swerve-bench"))
        .args(args)
        .args(["--device", "cpu", "--tensor-parallel", "2", "--jsonl"])
        .arg(&jsonl)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.lines().any(|l| l.starts_with(
            "TP 2 (2 ranks in lockstep, rank 0 on cpu (1 threads)): rank 0's wall times"
        )),
        "{stdout}"
    );
    let records = common::json_lines(&jsonl);
    for record in &records {
        assert_eq!(record["tensor_parallel"], 2, "{record}");
        assert!(
            record["key"].as_str().unwrap().ends_with(" tp=2"),
            "{record}"
        );
    }
    (stdout, records)
}

fn field(record: &Value, key: &str) -> f64 {
    record[key]
        .as_f64()
        .unwrap_or_else(|| panic!("no {key} in {record}"))
}

/// `a` and `b` equal to a relative `1e-9` (the records' numbers are computed from each other).
fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs())
}

#[test]
fn prefill_at_tp2_reports_rank_0s_times_and_flops_per_rank() {
    let (_, records) = run_at_tp2(&["prefill", "--seq-lens", "16,48", "--reps", "1"]);
    assert_eq!(records.len(), 2, "{records:?}");
    let (config, _) = swerve::model::synthetic::preset("default").unwrap();
    for (record, len) in records.iter().zip([16, 48]) {
        assert_eq!(record["key"], format!("preset=default len={len} tp=2"));
        let seconds = field(record, "median_ms") / 1e3;
        assert!(seconds > 0.0, "{record}");
        assert!(close(field(record, "tokens_per_s"), len as f64 / seconds));
        // Half the whole model's work a rank.
        let flops = swerve::bench::prefill_flops(&config, 1, len) / 2.0;
        assert!(
            close(field(record, "tflops"), flops / seconds / 1e12),
            "{record}"
        );
    }
}

#[test]
fn decode_at_tp2_reads_half_the_weights_a_rank() {
    let (stdout, records) = run_at_tp2(&[
        "decode",
        "--batch-sizes",
        "1,3",
        "--context",
        "40",
        "--steps",
        "2",
    ]);
    assert_eq!(records.len(), 2, "{records:?}");
    let (config, _) = swerve::model::synthetic::preset("default").unwrap();
    let whole = config.num_parameters() as f64 * 4.0;
    for (record, batch) in records.iter().zip([1, 3]) {
        assert_eq!(
            record["key"],
            format!("preset=default batch={batch} context=40 tp=2")
        );
        let seconds = field(record, "median_ms") / 1e3;
        assert!(seconds > 0.0, "{record}");
        assert!(close(field(record, "tokens_per_s"), batch as f64 / seconds));
        // The rank's f32 shard (half the model, the norms whole) and its KV head's cache.
        let bytes = field(record, "bytes_per_step");
        assert!(
            bytes > whole / 2.0 && bytes < whole / 2.0 * 1.01,
            "{bytes} of {whole}"
        );
        assert_eq!(record["cuda_graphs"], false);
    }
    assert!(stdout.contains("MB/step"), "{stdout}");
}

#[test]
fn train_at_tp2_runs_the_sequence_parallel_step() {
    let (stdout, records) =
        run_at_tp2(&["train", "--tokens", "32", "--seq-len", "16", "--reps", "1"]);
    assert!(
        stdout.contains("sequence-parallel over 2 ranks"),
        "{stdout}"
    );
    assert_eq!(records.len(), 1, "{records:?}");
    let record = &records[0];
    assert_eq!(record["key"], "preset=default tokens=32 seq_len=16 tp=2");
    let step = field(record, "step_ms") / 1e3;
    assert!(field(record, "fwd_bwd_ms") > 0.0 && step >= field(record, "fwd_bwd_ms") / 1e3);
    assert!(
        close(field(record, "tokens_per_s"), 32.0 / step),
        "{record}"
    );
    let (config, _) = swerve::model::synthetic::preset("default").unwrap();
    let flops = swerve::bench::train::train_flops(&config, 32, 16) / 2.0;
    assert!(
        close(field(record, "tflops"), flops / step / 1e12),
        "{record}"
    );
}

#[test]
fn tensor_parallel_refuses_what_cannot_be_split_naming_it() {
    for (args, expected) in [
        (
            vec!["prefill", "--tensor-parallel", "0"],
            "--tensor-parallel must be at least 1",
        ),
        (
            vec!["decode", "--tensor-parallel", "16"],
            "--tensor-parallel 16: tensor-parallel size 16 is more than num_attention_heads (8)",
        ),
        (
            vec!["train", "--tensor-parallel", "9"],
            "--tensor-parallel 9: tensor-parallel size 9 is more than num_attention_heads (8)",
        ),
        (
            vec!["prefill", "--preset", "qwen2.5-72b-tp8", "--tensor-parallel", "2"],
            "already one rank of tensor-parallel 8 (no collective): split the whole model instead (preset qwen2.5-72b --tensor-parallel 2)",
        ),
        (
            vec!["train", "--preset", "qwen2.5-72b-tp8"],
            "train the whole model's preset with --tensor-parallel 8",
        ),
    ] {
        let out = Command::new(bin_path("swerve-bench"))
            .args(&args)
            .args(["--device", "cpu"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}
