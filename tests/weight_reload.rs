//! Weight reloads overwrite the engine's parameters in place: a bad checkpoint is refused before
//! anything is written (the old weights serve on, bit for bit), a good one changes the outputs,
//! and no second model is ever built (every parameter keeps its storage).

mod common;

use common::fixture_dir;
use std::path::Path;
use swerve::backend::cpu::CpuBackend;
use swerve::config::ModelConfig;
use swerve::engine::{Engine, EngineConfig, EngineEvent, GenerationRequest, SamplingParams};
use swerve::model::weights::{write_safetensors, Checkpoint};
use swerve::model::{Qwen2Model, Qwen2Params};
use swerve::tensor::HostTensor;

const MODEL: &str = "tied-gqa4-bf16";

fn engine() -> Engine<CpuBackend> {
    let backend = CpuBackend::with_threads(1);
    let model = Qwen2Model::load(&backend, &fixture_dir(MODEL)).unwrap();
    Engine::new(backend, model, EngineConfig::for_model(128, 32)).unwrap()
}

/// The tokens and logprobs of one greedy request of 12 tokens.
fn generate(engine: &mut Engine<CpuBackend>) -> (Vec<u32>, Vec<u32>) {
    let id = engine
        .add_request(GenerationRequest {
            prompt: (3..40).collect(),
            params: SamplingParams::greedy(),
            max_tokens: 12,
            stop_ids: vec![],
            prompt_logprobs: None,
        })
        .unwrap();
    loop {
        for event in engine.step().unwrap() {
            if let EngineEvent::Finished(r) = event {
                assert_eq!(r.id, id);
                return (
                    r.output_tokens,
                    r.logprobs.iter().map(|x| x.to_bits()).collect(),
                );
            }
        }
    }
}

/// Where every parameter's values live.
fn storage(engine: &Engine<CpuBackend>) -> Vec<*const f32> {
    engine
        .model
        .params
        .iter()
        .map(|t| t.data.as_ptr())
        .collect()
}

/// The fixture's tensors in checkpoint order, each passed through `edit(name, tensor)`; `None`
/// drops it.
fn edited_tensors(
    edit: impl Fn(&str, HostTensor<'static>) -> Option<HostTensor<'static>>,
) -> Vec<(String, HostTensor<'static>)> {
    let config = ModelConfig::from_dir(&fixture_dir(MODEL)).unwrap();
    let local = config.local_sizes(1).unwrap();
    let checkpoint = Checkpoint::open(&fixture_dir(MODEL)).unwrap();
    let params = checkpoint.qwen2_params(&config, &local).unwrap();
    let names = Qwen2Params::<()>::expected_tensors(&config, &local);
    names
        .into_iter()
        .zip(params.iter())
        .filter_map(|((name, _), t)| {
            let owned = HostTensor {
                dtype: t.dtype,
                shape: t.shape.clone(),
                bytes: t.bytes.to_vec().into(),
            };
            edit(&name, owned).map(|t| (name, t))
        })
        .collect()
}

/// A model folder: the fixture's config.json and these tensors.
fn write_model(dir: &Path, tensors: &[(String, HostTensor<'static>)]) {
    std::fs::copy(
        fixture_dir(MODEL).join("config.json"),
        dir.join("config.json"),
    )
    .unwrap();
    write_safetensors(&dir.join("model.safetensors"), tensors).unwrap();
}

#[test]
fn bad_checkpoints_leave_the_weights_and_good_ones_overwrite_them_in_place() {
    let mut engine = engine();
    let before = generate(&mut engine);
    let pointers = storage(&engine);

    // Bad checkpoints: each refused with the reason, the old weights kept.
    let root = tempfile::tempdir().unwrap();
    let bad = |name: &str| {
        let dir = root.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    };
    let missing = bad("missing");
    write_model(
        &missing,
        &edited_tensors(|n, t| (n != "model.layers.1.mlp.up_proj.weight").then_some(t)),
    );
    let reshaped = bad("reshaped");
    write_model(
        &reshaped,
        &edited_tensors(|n, mut t| {
            if n == "model.norm.weight" {
                // Same bytes, another shape.
                t.shape = vec![t.shape[0] / 2, 2];
            }
            Some(t)
        }),
    );
    // The fixture's own file, cut short, and with its first tensor's dtype said to be I16.
    let bytes = std::fs::read(fixture_dir(MODEL).join("model.safetensors")).unwrap();
    let truncated = bad("truncated");
    write_model(&truncated, &[]);
    std::fs::write(
        truncated.join("model.safetensors"),
        &bytes[..bytes.len() - 100],
    )
    .unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&bytes[8..8 + header_len]).unwrap();
    let retyped = header.replacen("\"BF16\"", "\"I16\" ", 1); // same length
    assert_ne!(retyped, header);
    let integer = bad("integer");
    write_model(&integer, &[]);
    let mut integer_bytes = bytes[..8].to_vec();
    integer_bytes.extend_from_slice(retyped.as_bytes());
    integer_bytes.extend_from_slice(&bytes[8 + header_len..]);
    std::fs::write(integer.join("model.safetensors"), integer_bytes).unwrap();
    let other_arch = fixture_dir("untied-gqa2-odd-f32");
    for (dir, expected) in [
        (&missing, "model.layers.1.mlp.up_proj.weight is missing"),
        (&reshaped, "model.norm.weight has shape [128, 2]"),
        (&integer, "has dtype I16; expected BF16, F16 or F32"),
        (&truncated, "truncated"),
        (&other_arch, "a different architecture"),
    ] {
        let e = format!("{:#}", engine.update_weights(dir).unwrap_err());
        assert!(e.contains(expected), "{}: {e}", dir.display());
        assert_eq!(generate(&mut engine), before, "{}", dir.display());
        assert_eq!(engine.stats().weight_version, 0);
    }

    // A good checkpoint with other weights: new outputs, the same storage.
    let good = bad("good");
    write_model(
        &good,
        &edited_tensors(|n, t| {
            if !n.ends_with("up_proj.weight") {
                return Some(t);
            }
            let values: Vec<f32> = t.to_f32_vec().iter().map(|v| -2.0 * v).collect();
            Some(HostTensor::from_f32(t.shape.clone(), &values))
        }),
    );
    assert_eq!(engine.update_weights(&good).unwrap(), 1);
    let changed = generate(&mut engine);
    assert_ne!(changed.1, before.1);
    assert_eq!(storage(&engine), pointers, "a parameter was reallocated");
    // The same weights handed over in memory give the same outputs, also in place.
    let host = Checkpoint::open(&good).unwrap();
    let config = ModelConfig::from_dir(&good).unwrap();
    let params = host
        .qwen2_params(&config, &config.local_sizes(1).unwrap())
        .unwrap();
    engine.update_weights(&fixture_dir(MODEL)).unwrap();
    assert_eq!(generate(&mut engine), before, "back to the first weights");
    assert_eq!(engine.update_weights_from_host(&params).unwrap(), 3);
    assert_eq!(generate(&mut engine), changed);
    assert_eq!(storage(&engine), pointers, "a parameter was reallocated");
}
