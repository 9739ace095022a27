//! A config.json with absurd sizes is a clean error naming the field, through the library and
//! through `swerve-serve`, never an abort in an allocation.

mod common;

use common::{bin_path, fixture_dir};
use std::path::Path;
use std::process::Command;
use swerve::backend::cpu::CpuBackend;
use swerve::config::ModelConfig;
use swerve::model::Qwen2Model;

/// A copy of a fixture model whose config.json has `field` set to `value`.
fn model_with(field: &str, value: u64) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let fixture = fixture_dir("tied-gqa4-bf16");
    std::fs::copy(
        fixture.join("model.safetensors"),
        dir.path().join("model.safetensors"),
    )
    .unwrap();
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture.join("config.json")).unwrap()).unwrap();
    config[field] = value.into();
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    dir
}

fn load_error(dir: &Path) -> String {
    match Qwen2Model::load(&CpuBackend::new(), dir) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => format!("{e:#}"),
    }
}

#[test]
fn the_library_refuses_absurd_sizes_by_name() {
    // 10^12 layers of this width count fine (3.6e17 parameters) but no checkpoint holds them:
    // refused before a per-layer list is allocated.
    let dir = model_with("num_hidden_layers", 1_000_000_000_000);
    let e = load_error(dir.path());
    assert!(
        e.contains("`num_hidden_layers` 1000000000000 is more than the 26 tensors"),
        "{e}"
    );
    let config = ModelConfig::from_dir(dir.path()).unwrap();
    let e = config
        .check_parameters_fit(4, 1 << 40, "1 TiB")
        .unwrap_err()
        .to_string();
    assert!(e.contains("`num_hidden_layers` 1000000000000 x"), "{e}");

    // A hidden size whose products overflow 64 bits: refused when the config is read.
    let dir = model_with("hidden_size", 1 << 40);
    let e = load_error(dir.path());
    assert!(e.contains("overflows 64 bits"), "{e}");
    assert!(e.contains(&format!("hidden_size {}", 1u64 << 40)), "{e}");

    // Sizes the checkpoint contradicts: the shape check names the tensor.
    let dir = model_with("intermediate_size", 1 << 30);
    let e = load_error(dir.path());
    assert!(e.contains("mlp.gate_proj.weight has shape"), "{e}");
}

/// Runs `swerve-serve` on `dir` and returns its exit status and stderr.
fn serve(dir: &Path) -> (std::process::ExitStatus, String) {
    let out = Command::new(bin_path("swerve-serve"))
        .args([
            "--model",
            dir.to_str().unwrap(),
            "--device",
            "cpu",
            "--port",
            "0",
        ])
        .output()
        .unwrap();
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn swerve_serve_exits_with_the_field_named() {
    for (field, value, expected) in [
        // Counts, but needs far more than any machine's memory: the launch says so.
        (
            "num_hidden_layers",
            1_000_000_000_000u64,
            "`num_hidden_layers` 1000000000000 x",
        ),
        ("vocab_size", 1 << 40, "`vocab_size` is 1099511627776"),
        (
            "max_position_embeddings",
            1 << 40,
            "`max_position_embeddings` 1099511627776",
        ),
    ] {
        let dir = model_with(field, value);
        let (status, stderr) = serve(dir.path());
        // An abort would be a signal (no exit code) or 134; a clean error exits 1.
        assert_eq!(status.code(), Some(1), "{field}: {status:?}\n{stderr}");
        assert!(stderr.contains(expected), "{field}:\n{stderr}");
    }
}
