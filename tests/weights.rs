//! Checkpoint loading: sharded and single-file checkpoints load, and every malformed case gives
//! an error that names the file and the tensor at fault.

mod common;

use common::{fixture_dir, FIXTURE_MODELS};
use std::path::{Path, PathBuf};
use swerve::backend::cpu::CpuBackend;
use swerve::config::ModelConfig;
use swerve::model::weights::{write_safetensors, Checkpoint};
use swerve::model::Qwen2Model;
use swerve::tensor::{DType, HostTensor};

/// A copy of a fixture model in a temporary folder, to be damaged by a test.
fn copy_fixture(name: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(name);
    std::fs::create_dir(&dir).unwrap();
    for entry in std::fs::read_dir(fixture_dir(name)).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
    }
    (tmp, dir)
}

fn load_error(dir: &Path) -> String {
    match Qwen2Model::load(&CpuBackend::new(), dir) {
        Ok(_) => panic!("{} loaded but should not have", dir.display()),
        Err(e) => format!("{e:#}"),
    }
}

/// Rewrites `model.safetensors` of a single-file fixture after `edit` changes its tensor list.
fn rewrite(dir: &Path, edit: impl FnOnce(&mut Vec<(String, HostTensor<'static>)>)) {
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, HostTensor<'static>)> = st
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            let dtype = match view.dtype() {
                safetensors::Dtype::BF16 => DType::BF16,
                safetensors::Dtype::F16 => DType::F16,
                safetensors::Dtype::F32 => DType::F32,
                other => panic!("{other:?}"),
            };
            (
                name,
                HostTensor {
                    dtype,
                    shape: view.shape().to_vec(),
                    bytes: view.data().to_vec().into(),
                },
            )
        })
        .collect();
    edit(&mut tensors);
    write_safetensors(&path, &tensors).unwrap();
}

#[test]
fn every_fixture_loads_with_exactly_the_expected_tensors() {
    for name in FIXTURE_MODELS {
        let dir = fixture_dir(name);
        let config = ModelConfig::from_dir(&dir).unwrap();
        let checkpoint = Checkpoint::open(&dir).unwrap();
        let local = config.local_sizes(1).unwrap();
        checkpoint.qwen2_params(&config, &local).unwrap();
        let expected = swerve::model::Qwen2Params::<()>::expected_tensors(&config, &local);
        assert_eq!(checkpoint.tensor_names().count(), expected.len(), "{name}");
        assert_eq!(
            expected.iter().any(|(n, _)| n == "lm_head.weight"),
            !config.tie_word_embeddings
        );
    }
}

#[test]
fn truncated_file_is_named() {
    let (_tmp, dir) = copy_fixture("tied-gqa4-bf16");
    let path = dir.join("model.safetensors");
    let len = std::fs::metadata(&path).unwrap().len();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(len - 1000).unwrap();
    let e = load_error(&dir);
    assert!(
        e.contains("model.safetensors") && e.contains("truncated"),
        "{e}"
    );
}

#[test]
fn file_cut_inside_its_header_is_named() {
    let (_tmp, dir) = copy_fixture("tied-gqa4-bf16");
    let path = dir.join("model.safetensors");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(100)
        .unwrap();
    let e = load_error(&dir);
    assert!(
        e.contains("model.safetensors") && e.contains("truncated or corrupt"),
        "{e}"
    );
}

#[test]
fn bad_header_is_named() {
    let (_tmp, dir) = copy_fixture("tied-gqa4-bf16");
    let path = dir.join("model.safetensors");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[8] = b'#'; // the header's opening brace
    std::fs::write(&path, bytes).unwrap();
    let e = load_error(&dir);
    assert!(
        e.contains("model.safetensors") && e.contains("bad header"),
        "{e}"
    );
}

#[test]
fn missing_tensor_is_named() {
    let (_tmp, dir) = copy_fixture("tied-gqa4-bf16");
    rewrite(&dir, |t| {
        t.retain(|(n, _)| n != "model.layers.1.mlp.up_proj.weight")
    });
    let e = load_error(&dir);
    assert!(
        e.contains("tensor model.layers.1.mlp.up_proj.weight is missing")
            && e.contains("model.safetensors"),
        "{e}"
    );
}

#[test]
fn extra_tensor_is_named() {
    let (_tmp, dir) = copy_fixture("untied-gqa2-odd-f32");
    // Sharded: add an unexpected tensor to a shard and list it in the index.
    let shard = dir.join("model-00002-of-00002.safetensors");
    std::fs::rename(&shard, dir.join("model.safetensors")).unwrap();
    rewrite(&dir, |t| {
        t.push((
            "model.layers.0.self_attn.rotary_emb.inv_freq".into(),
            HostTensor::from_f32(vec![8], &[1.0; 8]),
        ))
    });
    std::fs::rename(dir.join("model.safetensors"), &shard).unwrap();
    let index_path = dir.join("model.safetensors.index.json");
    let mut index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&index_path).unwrap()).unwrap();
    index["weight_map"]["model.layers.0.self_attn.rotary_emb.inv_freq"] =
        "model-00002-of-00002.safetensors".into();
    std::fs::write(&index_path, index.to_string()).unwrap();
    let e = load_error(&dir);
    assert!(
        e.contains("unexpected tensor model.layers.0.self_attn.rotary_emb.inv_freq"),
        "{e}"
    );
    assert!(e.contains("model-00002-of-00002.safetensors"), "{e}");
}

#[test]
fn lm_head_in_a_tied_checkpoint_is_rejected() {
    let (_tmp, dir) = copy_fixture("tied-gqa4-bf16");
    rewrite(&dir, |t| {
        let embed = t
            .iter()
            .find(|(n, _)| n == "model.embed_tokens.weight")
            .unwrap()
            .1
            .clone();
        t.push(("lm_head.weight".into(), embed));
    });
    let e = load_error(&dir);
    assert!(
        e.contains("unexpected tensor lm_head.weight") && e.contains("tie_word_embeddings"),
        "{e}"
    );
}

#[test]
fn wrong_shape_is_named() {
    let (_tmp, dir) = copy_fixture("tied-gqa4-bf16");
    rewrite(&dir, |t| {
        let entry = t
            .iter_mut()
            .find(|(n, _)| n == "model.layers.0.self_attn.k_proj.bias")
            .unwrap();
        entry.1 = HostTensor::from_bf16(vec![32], &[half::bf16::ONE; 32]);
    });
    let e = load_error(&dir);
    assert!(
        e.contains("model.layers.0.self_attn.k_proj.bias has shape [32]") && e.contains("[64]"),
        "{e}"
    );
    assert!(e.contains("model.safetensors"), "{e}");
}

#[test]
fn wrong_dtype_is_named() {
    let (_tmp, dir) = copy_fixture("tied-gqa4-bf16");
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    // Re-write one tensor as I16 (same byte size as BF16) with the others unchanged.
    let tensors: Vec<(String, safetensors::tensor::TensorView<'_>)> = st
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            let dtype = if name == "model.norm.weight" {
                safetensors::Dtype::I16
            } else {
                view.dtype()
            };
            let view =
                safetensors::tensor::TensorView::new(dtype, view.shape().to_vec(), view.data())
                    .unwrap();
            (name, view)
        })
        .collect();
    let out = safetensors::serialize(tensors, None).unwrap();
    std::fs::write(&path, out).unwrap();
    let e = load_error(&dir);
    assert!(
        e.contains("model.norm.weight has dtype I16") && e.contains("model.safetensors"),
        "{e}"
    );
}

#[test]
fn missing_shard_and_missing_checkpoint_are_named() {
    let (_tmp, dir) = copy_fixture("untied-gqa2-odd-f32");
    std::fs::remove_file(dir.join("model-00001-of-00002.safetensors")).unwrap();
    let e = load_error(&dir);
    assert!(e.contains("model-00001-of-00002.safetensors"), "{e}");

    let empty = tempfile::tempdir().unwrap();
    std::fs::copy(
        fixture_dir("tied-gqa4-bf16").join("config.json"),
        empty.path().join("config.json"),
    )
    .unwrap();
    let e = load_error(empty.path());
    assert!(
        e.contains("no checkpoint in") && e.contains("model.safetensors.index.json"),
        "{e}"
    );
}

#[test]
fn bad_config_is_named_with_its_file() {
    let (_tmp, dir) = copy_fixture("tied-gqa4-bf16");
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("\"num_key_value_heads\": 1", "\"num_key_value_heads\": 3");
    std::fs::write(&path, text).unwrap();
    let e = load_error(&dir);
    assert!(
        e.contains("config.json")
            && e.contains("num_key_value_heads (3) does not divide num_attention_heads (4)"),
        "{e}"
    );
}

#[test]
fn bf16_f16_and_f32_checkpoints_all_load() {
    let dtypes: Vec<DType> = FIXTURE_MODELS
        .iter()
        .map(|name| {
            let dir = fixture_dir(name);
            let config = ModelConfig::from_dir(&dir).unwrap();
            let checkpoint = Checkpoint::open(&dir).unwrap();
            let params = checkpoint
                .qwen2_params(&config, &config.local_sizes(1).unwrap())
                .unwrap();
            params.embed_tokens.dtype
        })
        .collect();
    assert_eq!(dtypes, [DType::BF16, DType::F32, DType::F16]);
}
