//! A checkpoint written by a tensor-parallel run is an ordinary HF folder: the committed
//! `tests/fixtures/checkpoint-tp4/` is `final/` of `swerve-train dapo --tensor-parallel 4` on the
//! untied fixture (6 query heads over 3 KV heads: KV heads replicated over ranks), and
//! transformers' float64 logits for it (`tests/fixtures/checkpoint_logits.py`). It loads in
//! transformers (their logits) and in swerve at TP 1, 2, 3 and 4 with the same logits, and a TP 4
//! run today writes the same checkpoint.
//!
//! Regenerate (then run the Python script): `SWERVE_REGENERATE_TP4_CHECKPOINT=1 cargo test
//! --release --test checkpoint_tp4 -- --ignored regenerate`.

mod common;

use common::ranks::split_logits;
use common::{bin_path, dapo_lines, fixture_dir, root};
use safetensors::SafeTensors;
use std::path::{Path, PathBuf};
use swerve::model::PackedBatch;

/// The parity tests' bound for f32 logits against transformers' f64 (DESIGN.md).
const MAX_LOGITS_ERROR: f64 = 1e-4;

fn checkpoint() -> PathBuf {
    root().join("tests/fixtures/checkpoint-tp4")
}

/// `swerve-train dapo --tensor-parallel 4` from the untied fixture; returns `OUT/final`.
fn train_tp4(dir: &Path) -> PathBuf {
    let data = dir.join("dapo.jsonl");
    let lines = dapo_lines(
        300,
        |t, i| -4.0 - 0.05 * ((t + i) % 7) as f64,
        |i| (i % 2) as f64,
    );
    std::fs::write(
        &data,
        lines.iter().map(|l| format!("{l}\n")).collect::<String>(),
    )
    .unwrap();
    let out = dir.join("out");
    let model = fixture_dir("untied-gqa2-odd-f32");
    let output = std::process::Command::new(bin_path("swerve-train"))
        .args([
            "dapo",
            "--device",
            "cpu",
            "--tensor-parallel",
            "4",
            "--lr",
            "1e-3",
            "--batch-size",
            "4",
        ])
        .args(["--epochs", "1", "--micro-batch-tokens", "40", "--model"])
        .arg(&model)
        .arg("--data")
        .arg(&data)
        .arg("--out")
        .arg(&out)
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .env_remove("SLURM_PROCID")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    out.join("final")
}

/// The token sequences `checkpoint_logits.py` scores (the same list is in the script).
fn sequences() -> Vec<Vec<u32>> {
    vec![vec![1, 5, 9, 200, 3, 77, 299, 2, 150, 11], vec![42, 0, 7]]
}

fn f64s(st: &SafeTensors<'_>, key: &str) -> Vec<f64> {
    st.tensor(key)
        .unwrap_or_else(|_| panic!("no {key}"))
        .data()
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn a_tp4_checkpoint_loads_in_transformers_and_at_any_tp_with_the_same_logits() {
    let dir = checkpoint();
    let bytes = std::fs::read(dir.join("transformers_logits.safetensors")).unwrap();
    let expected = SafeTensors::deserialize(&bytes).unwrap();
    for (i, sequence) in sequences().iter().enumerate() {
        let want = f64s(&expected, &format!("logits_{i}"));
        let scale = want.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        for tp in [1, 2, 3, 4] {
            let got = split_logits(&dir, tp, &PackedBatch::from_sequences(&[sequence]));
            assert_eq!(got.len(), want.len());
            let error = got
                .iter()
                .zip(&want)
                .map(|(&g, &w)| (g as f64 - w).abs())
                .fold(0.0, f64::max)
                / scale;
            eprintln!("sequence {i} at tp {tp}: relative error {error:.1e} against transformers");
            assert!(
                error <= MAX_LOGITS_ERROR,
                "sequence {i} at tp {tp}: {error:.2e}"
            );
        }
    }
}

#[test]
fn a_tp4_run_writes_the_committed_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let written = train_tp4(dir.path());
    let read = |d: &Path| std::fs::read(d.join("model.safetensors")).unwrap();
    let (a, b) = (read(&written), read(&checkpoint()));
    let (a, b) = (
        SafeTensors::deserialize(&a).unwrap(),
        SafeTensors::deserialize(&b).unwrap(),
    );
    let mut names: Vec<&str> = b.names().into_iter().collect();
    names.sort();
    let mut got: Vec<&str> = a.names().into_iter().collect();
    got.sort();
    assert_eq!(got, names);
    for name in names {
        let (x, y) = (a.tensor(name).unwrap(), b.tensor(name).unwrap());
        assert_eq!((x.shape(), x.dtype()), (y.shape(), y.dtype()), "{name}");
        if name.ends_with("k_proj.bias") {
            continue; // its true gradient is 0: see tests/tensor_parallel_train.rs
        }
        // bf16: equal, or one rounding step apart where the f32 master sits on a boundary.
        let bf16 = |d: &[u8]| -> Vec<f32> {
            d.chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect()
        };
        for (p, q) in bf16(x.data()).iter().zip(bf16(y.data())) {
            assert!(
                (p - q).abs() <= q.abs() * 2f32.powi(-7),
                "{name}: {p} vs {q}"
            );
        }
    }
}

#[test]
#[ignore = "writes the fixture: SWERVE_REGENERATE_TP4_CHECKPOINT=1"]
fn regenerate() {
    if std::env::var_os("SWERVE_REGENERATE_TP4_CHECKPOINT").is_none() {
        panic!("set SWERVE_REGENERATE_TP4_CHECKPOINT=1 to rewrite tests/fixtures/checkpoint-tp4");
    }
    let dir = tempfile::tempdir().unwrap();
    let written = train_tp4(dir.path());
    let target = checkpoint();
    std::fs::create_dir_all(&target).unwrap();
    for file in ["config.json", "model.safetensors"] {
        std::fs::copy(written.join(file), target.join(file)).unwrap();
    }
}
