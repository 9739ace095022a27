//! `swerve-train dapo` with `--tensor-parallel` and `--data-parallel` end to end on the CPU: in
//! one process (ranks as threads), and as two processes launched the way torchrun launches them
//! (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`) meeting over loopback TCP. Every step's
//! loss and gradient norm equal the single-rank run's within f32 reduction-order noise, the
//! metrics are written once, and the final checkpoint holds whole tensors that load at TP 1.

mod common;

use common::{bin_path, dapo_lines, fixture_dir};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const MODEL: &str = "untied-gqa2-odd-f32";
const MAX_RELATIVE_ERROR: f64 = 1e-4;

fn data(dir: &Path) -> PathBuf {
    let path = dir.join("dapo.jsonl");
    let lines = dapo_lines(
        300,
        |t, i| -4.0 - 0.05 * ((t + i) % 7) as f64,
        |i| (i % 2) as f64,
    );
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&path, text).unwrap();
    path
}

fn dapo_args(data: &Path, out: &Path) -> Vec<String> {
    let model = fixture_dir(MODEL);
    [
        "dapo",
        "--model",
        model.to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--device",
        "cpu",
        "--lr",
        "1e-3",
        "--batch-size",
        "4",
        "--epochs",
        "2",
        "--micro-batch-tokens",
        "40",
        "--save-every",
        "2",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn swerve_train(args: &[String], env: &[(&str, String)]) -> Command {
    let mut command = Command::new(bin_path("swerve-train"));
    command.args(args);
    for var in [
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "SLURM_PROCID",
        "SLURM_NTASKS",
        "SWERVE_RDZV_PORT",
        "TORCHELASTIC_USE_AGENT_STORE",
    ] {
        command.env_remove(var);
    }
    command.envs(env.iter().map(|(k, v)| (k, v)));
    command
}

fn check(output: &Output, what: &str) {
    assert!(
        output.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

fn metrics(out: &Path) -> Vec<Value> {
    std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn compare(name: &str, got: &Path, want: &Path) {
    let (got, want) = (metrics(got), metrics(want));
    assert_eq!(
        got.len(),
        want.len(),
        "{name}: one metrics line per step, written once"
    );
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g["step"], w["step"]);
        assert_eq!(g["action_tokens"], w["action_tokens"], "{name}");
        assert_eq!(g["tokens"], w["tokens"], "{name}");
        for key in ["loss", "grad_norm", "entropy"] {
            let (a, b) = (g[key].as_f64().unwrap(), w[key].as_f64().unwrap());
            let error = (a - b).abs() / b.abs().max(1e-12);
            assert!(
                error <= MAX_RELATIVE_ERROR,
                "{name} step {}: {key} {a} vs {b}",
                g["step"]
            );
        }
    }
}

/// The final checkpoints' masters, whole, within the noise of each other.
fn compare_checkpoints(got: &Path, want: &Path) {
    let read = |dir: &Path| std::fs::read(dir.join("final/optimizer.safetensors")).unwrap();
    let (a, b) = (read(got), read(want));
    let (a, b) = (
        safetensors::SafeTensors::deserialize(&a).unwrap(),
        safetensors::SafeTensors::deserialize(&b).unwrap(),
    );
    let mut names: Vec<String> = b.names().into_iter().map(String::from).collect();
    names.sort();
    let mut got_names: Vec<String> = a.names().into_iter().map(String::from).collect();
    got_names.sort();
    assert_eq!(got_names, names, "the same whole tensors");
    // A key bias's true gradient is 0 (softmax ignores a shift shared by a query's scores):
    // AdamW's normalised update turns its rounding noise into steps of up to lr, different for
    // any summation order, so only its shape is compared (tests/tensor_parallel_train.rs).
    for name in names
        .iter()
        .filter(|n| n.starts_with("master.") && !n.ends_with("k_proj.bias"))
    {
        let values = |st: &safetensors::SafeTensors, n: &str| -> Vec<f32> {
            st.tensor(n)
                .unwrap()
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect()
        };
        let (x, y) = (values(&a, name), values(&b, name));
        assert_eq!(
            a.tensor(name).unwrap().shape(),
            b.tensor(name).unwrap().shape()
        );
        let scale = y.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1e-30);
        let error = x
            .iter()
            .zip(&y)
            .map(|(p, q)| (p - q).abs())
            .fold(0.0, f32::max)
            / scale;
        assert!(error <= 2e-4, "{name}: {error}");
    }
}

#[test]
fn dapo_at_tp2_x_dp2_in_one_process_equals_one_rank() {
    let dir = tempfile::tempdir().unwrap();
    let data = data(dir.path());
    let single = dir.path().join("single");
    check(
        &swerve_train(&dapo_args(&data, &single), &[])
            .output()
            .unwrap(),
        "one rank",
    );
    let parallel = dir.path().join("parallel");
    let mut args = dapo_args(&data, &parallel);
    args.extend(["--tensor-parallel", "2", "--data-parallel", "2"].map(String::from));
    let output = swerve_train(&args, &[]).output().unwrap();
    check(&output, "tp 2 x dp 2");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("tensor-parallel 2 x data-parallel 2"),
        "{stderr}"
    );
    compare("tp 2 x dp 2", &parallel, &single);
    compare_checkpoints(&parallel, &single);
}

#[test]
fn dapo_over_two_processes_launched_as_torchrun_does_equals_one_rank() {
    let dir = tempfile::tempdir().unwrap();
    let data = data(dir.path());
    let single = dir.path().join("single");
    check(
        &swerve_train(&dapo_args(&data, &single), &[])
            .output()
            .unwrap(),
        "one rank",
    );
    let out = dir.path().join("two-processes");
    let port = free_port_block();
    let mut args = dapo_args(&data, &out);
    args.extend(["--tensor-parallel", "2"].map(String::from));
    let children: Vec<_> = (0..2)
        .map(|rank| {
            let env = [
                ("RANK", rank.to_string()),
                ("WORLD_SIZE", "2".to_string()),
                ("LOCAL_RANK", "0".to_string()),
                ("LOCAL_WORLD_SIZE", "1".to_string()),
                ("MASTER_ADDR", "127.0.0.1".to_string()),
                ("MASTER_PORT", port.to_string()),
                ("SWERVE_RDZV_TIMEOUT_S", "60".to_string()),
            ];
            swerve_train(&args, &env)
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for (rank, child) in children.into_iter().enumerate() {
        check(
            &child.wait_with_output().unwrap(),
            &format!("process {rank}"),
        );
    }
    compare("2 processes x tp 2", &out, &single);
    compare_checkpoints(&out, &single);
    // Only the first process writes the logs: one event file.
    assert_eq!(std::fs::read_dir(out.join("tb")).unwrap().count(), 1);
}

/// A port with the next few free too (the process group meets at it, each tensor-parallel rank's
/// data-parallel group at the ports after it).
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
