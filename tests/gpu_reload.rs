//! Weight reloads on the CUDA backend overwrite the parameter arena in place (host-to-device
//! copies into the existing buffers, `Backend::overwrite`): a bad checkpoint changes nothing, a
//! good one (bf16 or f32 on disk) gives the weights `upload` would, and every parameter keeps its
//! device address.
//!
//! Needs a CUDA GPU (or the emulated device): without one these tests fail, never pass.

mod common;

use common::fixture_dir;
use std::path::Path;
use swerve::backend::cuda::CudaBackend;
use swerve::backend::Backend;
use swerve::config::ModelConfig;
use swerve::engine::{Engine, EngineConfig, EngineEvent, GenerationRequest, SamplingParams};
use swerve::model::weights::{write_safetensors, Checkpoint};
use swerve::model::{Qwen2Model, Qwen2Params};
use swerve::tensor::HostTensor;

const MODEL: &str = "tied-gqa4-bf16";

fn gpu() -> CudaBackend {
    CudaBackend::open_default()
        .expect("these tests need a CUDA GPU and a build with kernels (SWERVE_REQUIRE_CUDA=1)")
}

/// The tokens and logprob bits of one greedy request (decode steps replayed from graphs).
fn generate(engine: &mut Engine<CudaBackend>) -> (Vec<u32>, Vec<u32>) {
    let id = engine
        .add_request(GenerationRequest {
            prompt: (3..30).collect(),
            params: SamplingParams::greedy(),
            max_tokens: 8,
            stop_ids: vec![],
            prompt_logprobs: None,
        })
        .unwrap();
    loop {
        for event in engine.step().unwrap() {
            if let EngineEvent::Finished(r) = event {
                assert_eq!(r.id, id);
                let bits = r.logprobs.iter().map(|x| x.to_bits()).collect();
                return (r.output_tokens, bits);
            }
        }
    }
}

/// The fixture's tensors with every `up_proj` negated and stored as f32 (the device rounds).
fn write_negated_up_proj(dir: &Path) {
    let config = ModelConfig::from_dir(&fixture_dir(MODEL)).unwrap();
    let local = config.local_sizes(1).unwrap();
    let checkpoint = Checkpoint::open(&fixture_dir(MODEL)).unwrap();
    let params = checkpoint.qwen2_params(&config, &local).unwrap();
    let names = Qwen2Params::<()>::expected_tensors(&config, &local);
    let tensors: Vec<(String, HostTensor<'static>)> = names
        .into_iter()
        .zip(params.iter())
        .map(|((name, shape), t)| {
            let mut values = t.to_f32_vec();
            if name.ends_with("up_proj.weight") {
                values.iter_mut().for_each(|v| *v = -*v);
            }
            (name, HostTensor::from_f32(shape, &values))
        })
        .collect();
    std::fs::copy(
        fixture_dir(MODEL).join("config.json"),
        dir.join("config.json"),
    )
    .unwrap();
    write_safetensors(&dir.join("model.safetensors"), &tensors).unwrap();
}

#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn reloads_overwrite_the_device_weights_in_place() {
    let backend = gpu();
    let model = Qwen2Model::load(&backend, &fixture_dir(MODEL)).unwrap();
    let mut engine = Engine::new(backend, model, EngineConfig::for_model(128, 32)).unwrap();
    let before = generate(&mut engine);
    let addresses: Vec<u64> = engine.model.params.iter().map(|t| t.ptr()).collect();

    // A truncated checkpoint: refused, nothing written.
    let root = tempfile::tempdir().unwrap();
    let truncated = root.path().join("truncated");
    std::fs::create_dir_all(&truncated).unwrap();
    let bytes = std::fs::read(fixture_dir(MODEL).join("model.safetensors")).unwrap();
    std::fs::write(
        truncated.join("model.safetensors"),
        &bytes[..bytes.len() - 64],
    )
    .unwrap();
    std::fs::copy(
        fixture_dir(MODEL).join("config.json"),
        truncated.join("config.json"),
    )
    .unwrap();
    let e = format!("{:#}", engine.update_weights(&truncated).unwrap_err());
    assert!(e.contains("truncated"), "{e}");
    assert_eq!(generate(&mut engine), before);

    // f32 weights: the overwritten parameters hold what an upload of the same file holds.
    let negated = root.path().join("negated");
    std::fs::create_dir_all(&negated).unwrap();
    write_negated_up_proj(&negated);
    let generation = engine.backend.graph_generation();
    assert_eq!(engine.update_weights(&negated).unwrap(), 1);
    assert!(
        engine.backend.graph_generation() > generation,
        "graphs start over"
    );
    let after: Vec<u64> = engine.model.params.iter().map(|t| t.ptr()).collect();
    assert_eq!(after, addresses, "a parameter was reallocated");
    let uploaded = Qwen2Model::load(&engine.backend, &negated).unwrap();
    for (mine, fresh) in engine.model.params.iter().zip(uploaded.params.iter()) {
        let (a, b) = (
            engine.backend.to_host(mine).unwrap(),
            engine.backend.to_host(fresh).unwrap(),
        );
        assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
    }
    drop(uploaded);
    assert_ne!(generate(&mut engine).1, before.1);

    // Back to the first weights: the first outputs again, bit for bit.
    engine.update_weights(&fixture_dir(MODEL)).unwrap();
    assert_eq!(generate(&mut engine), before);
}
