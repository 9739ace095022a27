//! `swerve-train rft` and `dapo` end to end on a fixture model (CPU): a tiny model overfits a
//! small RFT set, a killed-and-resumed DAPO run equals an uninterrupted one, a resume with other
//! options or a run into a used folder is refused, checkpoints load, bad data is an error naming
//! file:line, and a data file is streamed (it never sits in memory as JSON values).

mod common;

use common::{bin_path, fixture_dir};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;

const MODEL: &str = "untied-gqa2-odd-f32";

/// Token ids below the fixture's vocabulary of 300.
fn tokens(seed: u64, n: usize) -> Vec<u32> {
    common::tokens(seed, n, 300)
}

fn write_lines(path: &Path, lines: &[Value]) {
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(path, text).unwrap();
}

fn run(args: &[&str]) -> std::process::Output {
    let out = Command::new(bin_path("swerve-train"))
        .args(args)
        .output()
        .unwrap();
    out
}

fn metrics(out: &Path) -> Vec<Value> {
    std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn rft_overfits_a_small_set_and_writes_a_loadable_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let data = rft_data(dir.path());
    let out = dir.path().join("out");
    let model = fixture_dir(MODEL);
    let result = run(&[
        "rft",
        "--model",
        model.to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--lr",
        "1e-2",
        "--batch-size",
        "4",
        "--epochs",
        "25",
        "--micro-batch-tokens",
        "64",
    ]);
    assert!(
        result.status.success(),
        "{}",
        String::from_utf8_lossy(&result.stderr)
    );
    let m = metrics(&out);
    assert_eq!(m.len(), 25);
    let first = m[0]["loss"].as_f64().unwrap();
    let last = m[24]["loss"].as_f64().unwrap();
    println!("rft loss {first:.4} -> {last:.6}");
    assert!(last < first / 10.0, "loss {first} -> {last}");
    for (i, line) in m.iter().enumerate() {
        assert_eq!(line["step"], i + 1);
        assert_eq!(line["action_tokens"], 80);
        assert_eq!(line["tokens"], 120);
        assert_eq!(line["skipped"], false);
        for key in [
            "grad_norm",
            "lr",
            "entropy",
            "clip_frac_low",
            "clip_frac_high",
            "logprob_gap_max",
            "tokens_per_s",
        ] {
            assert!(line[key].is_number(), "{key}");
        }
    }
    // The final checkpoint is a model folder swerve loads, in bf16.
    let final_dir = out.join("final");
    for file in [
        "config.json",
        "model.safetensors",
        "optimizer.safetensors",
        "trainer_state.json",
    ] {
        assert!(final_dir.join(file).is_file(), "{file}");
    }
    let checkpoint = swerve::model::weights::Checkpoint::open(&final_dir).unwrap();
    let embed = checkpoint
        .tensor("model.embed_tokens.weight", &[300, 96])
        .unwrap();
    assert_eq!(embed.dtype, swerve::tensor::DType::BF16);
    swerve::model::Qwen2Model::load(&swerve::backend::cpu::CpuBackend::new(), &final_dir).unwrap();
}

#[test]
fn a_resumed_dapo_run_equals_an_uninterrupted_one() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("dapo.jsonl");
    let lines = common::dapo_lines(
        300,
        |t, i| -4.0 - ((t * 7 + i) % 5) as f64 * 0.5,
        |i| (i % 2) as f64 + 0.1 * i as f64,
    );
    write_lines(&data, &lines);
    let model = fixture_dir(MODEL);
    let common_args = |out: &Path| -> Vec<String> {
        [
            "dapo",
            "--model",
            model.to_str().unwrap(),
            "--data",
            data.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--lr",
            "1e-2",
            "--batch-size",
            "3",
            "--epochs",
            "2",
            "--micro-batch-tokens",
            "40",
            "--save-every",
            "2",
            "--tis-cap",
            "2",
            "--lr-schedule",
            "cosine",
            "--warmup-steps",
            "2",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let run_with = |out: &Path, extra: &[&str]| {
        let mut args = common_args(out);
        args.extend(extra.iter().map(|s| s.to_string()));
        let result = Command::new(bin_path("swerve-train"))
            .args(&args)
            .output()
            .unwrap();
        assert!(
            result.status.success(),
            "{}",
            String::from_utf8_lossy(&result.stderr)
        );
    };
    let whole = dir.path().join("whole");
    run_with(&whole, &[]);
    // The same run "killed" during step 4: its checkpoints after step 2 and final/ never
    // written, a half-written checkpoint folder and a half-written metrics line left behind
    // (steps 3 to 6 are stale lines a resumed run must replace, not append to).
    let resumed = dir.path().join("resumed");
    run_with(&resumed, &[]);
    for gone in ["step-000004", "step-000006", "final"] {
        std::fs::remove_dir_all(resumed.join(gone)).unwrap();
    }
    std::fs::create_dir(resumed.join(".step-000004.partial")).unwrap();
    let mut log = std::fs::OpenOptions::new()
        .append(true)
        .open(resumed.join("metrics.jsonl"))
        .unwrap();
    std::io::Write::write_all(&mut log, b"{\"step\": 7, \"lo").unwrap();
    drop(log);
    run_with(&resumed, &["--resume"]);
    let (a, b) = (metrics(&whole), metrics(&resumed));
    assert_eq!(a.len(), 6);
    assert_eq!(b.len(), 6);
    for (x, y) in a.iter().zip(&b) {
        for key in [
            "step",
            "loss",
            "grad_norm",
            "lr",
            "clip_frac_low",
            "clip_frac_high",
        ] {
            assert_eq!(x[key], y[key], "step {}: {key}", x["step"]);
        }
    }
    assert!(a.iter().any(|m| m["clip_frac_low"].as_f64().unwrap() > 0.0));
    assert!(a
        .iter()
        .any(|m| m["clip_frac_high"].as_f64().unwrap() > 0.0));
    let read = |p: &Path| std::fs::read(p.join("final/model.safetensors")).unwrap();
    assert!(read(&whole) == read(&resumed), "final weights differ");
}

#[test]
fn bad_data_names_the_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let model = fixture_dir(MODEL);
    let cases = [
        (
            json!({"tokens": [1, 2, 3], "action_mask": [0, 1]}),
            "action_mask has 2 entries for 3 tokens",
        ),
        (
            json!({"tokens": [1, 2, 300], "action_mask": [0, 1, 1]}),
            "tokens[2] = 300",
        ),
        (
            json!({"tokens": tokens(1, 70), "action_mask": vec![1; 70]}),
            "exceed the maximum sequence length",
        ),
    ];
    for (i, (bad, message)) in cases.iter().enumerate() {
        let data = dir.path().join(format!("bad{i}.jsonl"));
        write_lines(
            &data,
            &[
                json!({"tokens": [1, 2, 3], "action_mask": [0, 1, 1]}),
                bad.clone(),
            ],
        );
        let out = dir.path().join(format!("out{i}"));
        let result = run(&[
            "rft",
            "--model",
            model.to_str().unwrap(),
            "--data",
            data.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--max-seq-len",
            "64",
        ]);
        let stderr = String::from_utf8_lossy(&result.stderr);
        assert!(!result.status.success());
        assert!(
            stderr.contains(&format!("bad{i}.jsonl:2")) && stderr.contains(message),
            "{stderr}"
        );
    }
}

fn rft_data(dir: &Path) -> std::path::PathBuf {
    let data = dir.join("rft.jsonl");
    let lines: Vec<Value> = (0..4)
        .map(|i| {
            let action_mask = [vec![0; 10], vec![1; 20]].concat();
            json!({"tokens": tokens(i, 30), "action_mask": action_mask})
        })
        .collect();
    write_lines(&data, &lines);
    data
}

#[test]
fn micro_batch_tokens_do_not_change_the_step() {
    let dir = tempfile::tempdir().unwrap();
    let data = rft_data(dir.path());
    let model = fixture_dir(MODEL);
    let mut steps = Vec::new();
    // One trajectory per micro-batch, two, and all four together.
    for micro in ["30", "60", "1000"] {
        let out = dir.path().join(format!("out{micro}"));
        let result = run(&[
            "rft",
            "--model",
            model.to_str().unwrap(),
            "--data",
            data.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--batch-size",
            "4",
            "--steps",
            "2",
            "--micro-batch-tokens",
            micro,
            "--lr",
            "1e-3",
        ]);
        assert!(
            result.status.success(),
            "{}",
            String::from_utf8_lossy(&result.stderr)
        );
        steps.push(metrics(&out));
    }
    for m in &steps[1..] {
        for (x, y) in m.iter().zip(&steps[0]) {
            for key in ["loss", "grad_norm"] {
                let (a, b) = (x[key].as_f64().unwrap(), y[key].as_f64().unwrap());
                assert!((a - b).abs() <= 1e-6 * b.abs(), "{key}: {a} vs {b}");
            }
        }
    }
}

#[test]
fn a_step_with_inf_or_nan_is_skipped_and_said_so() {
    let dir = tempfile::tempdir().unwrap();
    let data = rft_data(dir.path());
    let model = fixture_dir(MODEL);
    let out = dir.path().join("out");
    // An absurd learning rate: the first update overflows every later forward pass.
    let result = run(&[
        "rft",
        "--model",
        model.to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--batch-size",
        "2",
        "--epochs",
        "2",
        "--lr",
        "1e30",
        "--grad-clip",
        "0",
    ]);
    assert!(
        result.status.success(),
        "{}",
        String::from_utf8_lossy(&result.stderr)
    );
    let m = metrics(&out);
    assert_eq!(m.len(), 4);
    assert_eq!(m[0]["skipped"], false);
    for line in &m[1..] {
        assert_eq!(line["skipped"], true);
        assert!(line["loss"].is_null() && line["grad_norm"].is_null());
    }
    let state: Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("final/trainer_state.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(state["updates"], 1);
}

#[test]
fn rft_runs_on_the_embedded_default_model() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("rft.jsonl");
    // Ids spread over the default model's 32,768-token vocabulary.
    let lines: Vec<Value> = (0..2)
        .map(|i| {
            let ids: Vec<u32> = tokens(i + 10, 24).iter().map(|t| t * 109).collect();
            let action_mask = [vec![0; 8], vec![1; 16]].concat();
            json!({"tokens": ids, "action_mask": action_mask})
        })
        .collect();
    write_lines(&data, &lines);
    let out = dir.path().join("out");
    let result = run(&[
        "rft",
        "--model",
        "preset:default",
        "--data",
        data.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--batch-size",
        "2",
        "--epochs",
        "2",
    ]);
    assert!(
        result.status.success(),
        "{}",
        String::from_utf8_lossy(&result.stderr)
    );
    let m = metrics(&out);
    assert_eq!(m.len(), 2);
    assert!(m
        .iter()
        .all(|l| l["action_tokens"] == 32 && l["loss"].is_number()));
    assert!(out.join("base-model/config.json").is_file());
    swerve::model::Qwen2Model::load(&swerve::backend::cpu::CpuBackend::new(), &out.join("final"))
        .unwrap();

    let bad = run(&[
        "rft",
        "--model",
        "preset:nonsense",
        "--data",
        data.to_str().unwrap(),
    ]
    .iter()
    .copied()
    .chain(["--out", dir.path().join("bad").to_str().unwrap()])
    .collect::<Vec<_>>());
    assert!(!bad.status.success());
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(
        stderr.contains("preset:nonsense") && stderr.contains("unknown preset"),
        "{stderr}"
    );
}

#[test]
fn chat_form_rft_masks_loss_false_turns_but_keeps_them_in_context() {
    // The scripted model has Qwen2.5's whole vocabulary, so chat text tokenizes into it.
    let model = common::serve::scripted_model();
    let dir = tempfile::tempdir().unwrap();
    let turn = |content: &str, loss: Option<bool>| {
        let mut m = json!({"role": "assistant", "content": content});
        if let Some(loss) = loss {
            m["loss"] = json!(loss);
        }
        m
    };
    let user = |content: &str| json!({"role": "user", "content": content});
    let conversation = |with_masked_turn: bool| {
        let mut messages = vec![
            json!({"role": "system", "content": "You are a coding agent."}),
            user("What is six times seven?"),
            turn("The answer is forty-two.", None),
        ];
        if with_masked_turn {
            messages.push(user("Run the tests."));
            messages.push(turn("<tool_call>\n{\"name\": \"broken\"", Some(false)));
        }
        json!({"messages": messages})
    };
    let run_on = |with_masked_turn: bool| -> Value {
        let data = dir.path().join(format!("chat-{with_masked_turn}.jsonl"));
        write_lines(&data, &[conversation(with_masked_turn)]);
        let out = dir.path().join(format!("out-{with_masked_turn}"));
        let result = run(&[
            "rft",
            "--model",
            model.to_str().unwrap(),
            "--data",
            data.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--batch-size",
            "1",
            "--steps",
            "1",
        ]);
        assert!(
            result.status.success(),
            "{}",
            String::from_utf8_lossy(&result.stderr)
        );
        metrics(&out).remove(0)
    };
    let (plain, masked) = (run_on(false), run_on(true));
    let count = |m: &Value, key: &str| m[key].as_u64().unwrap();
    assert!(count(&plain, "action_tokens") > 0);
    assert_eq!(
        count(&masked, "action_tokens"),
        count(&plain, "action_tokens"),
        "a `loss: false` turn adds no action tokens"
    );
    assert!(
        count(&masked, "tokens") > count(&plain, "tokens"),
        "but it stays in the context"
    );
}

#[test]
fn non_finite_or_out_of_range_hyperparameters_are_refused_at_parse_time_naming_the_flag() {
    let base = |command: &'static str| -> Vec<&'static str> {
        match command {
            "rl" => vec!["rl", "--model", "m", "--tasks", "t", "--out", "o"],
            other => vec![other, "--model", "m", "--data", "d", "--out", "o"],
        }
    };
    for (command, flag, value, message) in [
        ("rft", "--lr", "-1", "-1 must be greater than 0"),
        ("rft", "--lr", "0", "0 must be greater than 0"),
        ("rft", "--weight-decay", "-0.1", "-0.1 must be at least 0"),
        ("rft", "--grad-clip", "-1", "-1 must be at least 0"),
        ("dapo", "--eps-low", "1", "must be at least 0 and below 1"),
        ("dapo", "--eps-high", "-0.1", "must be at least 0"),
        ("dapo", "--tis-cap", "0", "0 must be greater than 0"),
        ("rl", "--rft-lr", "-1e-6", "must be greater than 0"),
        ("rft", "--lr", "NaN", "NaN is not a finite number"),
        ("dapo", "--eps-high", "inf", "inf is not a finite number"),
        ("rl", "--grad-clip", "-inf", "-inf is not a finite number"),
        ("rl", "--lr", "NaN", "NaN is not a finite number"),
    ] {
        let value_arg = format!("{flag}={value}");
        let mut args = base(command);
        args.push(&value_arg);
        let out = run(&args);
        assert!(!out.status.success(), "{args:?} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(message) && err.contains(&format!("'{flag} <")),
            "{args:?}: {err}"
        );
    }
}

/// `rft` on the fixture model over `data` into `out` with `extra` flags.
fn rft(data: &Path, out: &Path, extra: &[&str]) -> std::process::Output {
    let model = fixture_dir(MODEL);
    let mut args = vec![
        "rft",
        "--model",
        model.to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--device",
        "cpu",
    ];
    args.extend_from_slice(extra);
    run(&args)
}

fn ok(result: &std::process::Output) -> String {
    let stderr = String::from_utf8_lossy(&result.stderr).into_owned();
    assert!(result.status.success(), "{stderr}");
    stderr
}

fn refused(result: &std::process::Output) -> String {
    let stderr = String::from_utf8_lossy(&result.stderr).into_owned();
    assert!(!result.status.success(), "accepted: {stderr}");
    stderr
}

#[test]
fn a_resume_with_other_options_is_refused_naming_each_difference() {
    let dir = tempfile::tempdir().unwrap();
    let data = rft_data(dir.path());
    let out = dir.path().join("out");
    let options = ["--lr", "1e-3", "--batch-size", "2", "--save-every", "1"];
    let options = [&options[..], &["--epochs", "2"]].concat();
    ok(&rft(&data, &out, &options));
    assert_eq!(metrics(&out).len(), 4);
    let before = std::fs::read(out.join("final/model.safetensors")).unwrap();

    // Another data file (one token changed), another lr and batch size: all named, old and new.
    let other = dir.path().join("other.jsonl");
    let text = std::fs::read_to_string(&data).unwrap();
    let changed =
        text.replacen("[", "[7,", 1)
            .replacen("\"action_mask\":[", "\"action_mask\":[0,", 1);
    assert_ne!(changed, text);
    std::fs::write(&other, changed).unwrap();
    let changed_options = [
        "--lr",
        "2e-3",
        "--batch-size",
        "4",
        "--epochs",
        "2",
        "--save-every",
        "1",
    ];
    let stderr = refused(&rft(
        &other,
        &out,
        &[&changed_options[..], &["--resume"]].concat(),
    ));
    let hash = |path: &Path| swerve::jsonl::hash_file(path).unwrap().to_string();
    for line in [
        "--lr: 0.001 in the run, 0.002 now".to_string(),
        "--batch-size: 2 in the run, 4 now".to_string(),
        format!("--data: {} in the run, {} now", hash(&data), hash(&other)),
    ] {
        assert!(stderr.contains(&line), "{line} in {stderr}");
    }
    assert!(!stderr.contains("--epochs"), "{stderr}");
    // Each alone is refused too, and a changed seed or schedule length.
    let base = &options[..options.len() - 2];
    for (epochs, more, flag) in [
        ("2", &["--seed", "1"][..], "--seed"),
        ("3", &[][..], "--epochs"),
        ("2", &["--steps", "3"][..], "--steps"),
    ] {
        let args = [base, &["--epochs", epochs], more, &["--resume"]].concat();
        let stderr = refused(&rft(&data, &out, &args));
        assert!(stderr.contains(&format!("{flag}: ")), "{flag}: {stderr}");
    }
    let stderr = refused(&rft(&other, &out, &[&options[..], &["--resume"]].concat()));
    assert!(
        stderr.contains("--data: ") && !stderr.contains("--lr"),
        "{stderr}"
    );
    // Nothing was touched by the refused runs.
    assert_eq!(metrics(&out).len(), 4);
    assert_eq!(
        std::fs::read(out.join("final/model.safetensors")).unwrap(),
        before
    );

    // The same options, the data file copied elsewhere, memory-only flags changed: accepted; the
    // run was finished, so nothing is trained again and nothing is appended.
    let copy = dir.path().join("copy.jsonl");
    std::fs::copy(&data, &copy).unwrap();
    let extra = [
        "--micro-batch-tokens",
        "30",
        "--no-activation-checkpointing",
        "--resume",
    ];
    let stderr = ok(&rft(&copy, &out, &[&options[..], &extra].concat()));
    assert!(stderr.contains("resuming after step 4"), "{stderr}");
    let steps: Vec<u64> = metrics(&out)
        .iter()
        .map(|m| m["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, [1, 2, 3, 4]);
    assert_eq!(
        std::fs::read(out.join("final/model.safetensors")).unwrap(),
        before
    );
}

#[test]
fn a_used_output_folder_needs_resume_or_overwrite() {
    let dir = tempfile::tempdir().unwrap();
    let data = rft_data(dir.path());
    let out = dir.path().join("out");
    ok(&rft(
        &data,
        &out,
        &["--batch-size", "2", "--epochs", "2", "--save-every", "1"],
    ));
    let stderr = refused(&rft(&data, &out, &["--batch-size", "4", "--steps", "1"]));
    assert!(
        stderr.contains("is not empty")
            && stderr.contains("metrics.jsonl")
            && stderr.contains("--resume")
            && stderr.contains("--overwrite"),
        "{stderr}"
    );
    assert_eq!(metrics(&out).len(), 4, "the refused run wrote nothing");
    let stderr = refused(&rft(&data, &out, &["--resume", "--overwrite"]));
    assert!(stderr.contains("cannot be used with"), "{stderr}");

    // --overwrite removes what swerve wrote, keeps the rest, and the new run starts at step 1.
    std::fs::write(out.join("notes.txt"), "mine").unwrap();
    ok(&rft(
        &data,
        &out,
        &["--batch-size", "4", "--steps", "1", "--overwrite"],
    ));
    let m = metrics(&out);
    assert_eq!(m.len(), 1);
    assert_eq!(m[0]["step"], 1);
    assert_eq!(m[0]["trajectories"], 4);
    let mut names: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["config.toml", "final", "metrics.jsonl", "notes.txt", "tb"]
    );
    // The first run's event file went with the rest.
    assert_eq!(std::fs::read_dir(out.join("tb")).unwrap().count(), 1);
    // OUT/config.toml is the new run's (docs/config.md).
    let config = std::fs::read_to_string(out.join("config.toml")).unwrap();
    for line in ["batch-size = 4", "steps = 1", "epochs = 1", "lr = 5e-6"] {
        assert!(config.lines().any(|l| l == line), "{line} in\n{config}");
    }
    assert_eq!(
        std::fs::read_to_string(out.join("notes.txt")).unwrap(),
        "mine"
    );
}

#[test]
fn base_model_of_another_preset_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    // A run of preset:default stopped by bad data leaves only OUT/base-model behind.
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"tokens\": [1]}\n").unwrap();
    let args = |model: &str, data: &Path| -> Vec<String> {
        [
            "rft",
            "--model",
            model,
            "--data",
            data.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ]
        .iter()
        .map(|s| s.to_string())
        .chain(["--device", "cpu", "--steps", "1", "--batch-size", "2"].map(String::from))
        .collect()
    };
    let run_args = |a: Vec<String>| run(&a.iter().map(String::as_str).collect::<Vec<_>>());
    refused(&run_args(args("preset:default", &bad)));
    assert!(out.join("base-model/config.json").is_file());
    let data = dir.path().join("rft.jsonl");
    let lines: Vec<Value> = (0..2)
        .map(|i| {
            let action_mask = [vec![0; 8], vec![1; 16]].concat();
            json!({"tokens": tokens(i + 10, 24), "action_mask": action_mask})
        })
        .collect();
    write_lines(&data, &lines);
    // Another preset: refused, naming what differs.
    let stderr = refused(&run_args(args("preset:tiny", &data)));
    assert!(
        stderr.contains("base-model holds another model than --model preset:tiny")
            && stderr.contains("hidden_size 512 there, 64 asked"),
        "{stderr}"
    );
    // The same preset reuses it.
    ok(&run_args(args("preset:default", &data)));
    assert_eq!(metrics(&out).len(), 1);
}

#[test]
fn a_data_file_is_streamed_not_held_as_json_values() {
    // 3.0M tokens in 50,000 lines (17 MB of text). As serde_json values (the old reader) they
    // take about 500 MB; packed, 5 bytes a token (15 MB). The run gets 128 MiB of data segment
    // (RLIMIT_DATA: heap and private mappings), about 40 MiB of which the binary and the model
    // use on their own.
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("big.jsonl");
    let mut text = String::with_capacity(18 << 20);
    let mask = format!("[{}]", [vec!["0"; 10], vec!["1"; 50]].concat().join(","));
    for i in 0..50_000u64 {
        let ids: Vec<String> = tokens(i, 60).iter().map(u32::to_string).collect();
        text += &format!(
            "{{\"tokens\":[{}],\"action_mask\":{mask}}}\n",
            ids.join(",")
        );
    }
    std::fs::write(&data, &text).unwrap();
    let out = dir.path().join("out");
    let model = fixture_dir(MODEL);
    let result = Command::new("sh")
        .args(["-c", "ulimit -d 131072 && exec \"$0\" \"$@\""])
        .arg(bin_path("swerve-train"))
        .args([
            "rft",
            "--device",
            "cpu",
            "--steps",
            "1",
            "--batch-size",
            "4",
            "--model",
        ])
        .arg(&model)
        .arg("--data")
        .arg(&data)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(result.status.success(), "{:?}: {stderr}", result.status);
    let m = metrics(&out);
    assert_eq!(m.len(), 1);
    assert_eq!(m[0]["tokens"], 240);
    // The limit is in force as the shell reports it (RLIMIT_DATA, in KiB).
    let shown = Command::new("sh")
        .args(["-c", "ulimit -d 131072 && ulimit -d"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&shown.stdout).trim(), "131072");
}
