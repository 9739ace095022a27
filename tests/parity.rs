//! The CPU backend against transformers' Qwen2 in float64 (tests/fixtures/generate.py): logits
//! of every fixture sequence, all sequences of a model packed into one batch.

mod common;

use common::{expected, fixture_dir, relative_error, root, FIXTURE_MODELS};

use swerve::backend::cpu::CpuBackend;
use swerve::backend::Backend;
use swerve::model::{PackedBatch, Qwen2Model};

const MAX_RELATIVE_ERROR: f64 = 1e-4;

fn check_model(name: &str, backend: &CpuBackend) {
    let model = Qwen2Model::load(backend, &fixture_dir(name)).unwrap();
    let cases = expected(name);
    assert!(
        cases.len() >= 3,
        "{name}: fixture has {} sequences",
        cases.len()
    );
    let batch =
        PackedBatch::from_sequences(&cases.iter().map(|c| c.tokens.clone()).collect::<Vec<_>>());
    let logits = backend
        .to_host(&model.forward_logits(backend, &batch).unwrap())
        .unwrap();
    let vocab = model.config.vocab_size;
    for (i, case) in cases.iter().enumerate() {
        let range = batch.sequence_range(i);
        let got = &logits[range.start * vocab..range.end * vocab];
        let err = relative_error(got, &case.logits);
        println!(
            "{name} sequence {i} ({} tokens): relative error {err:.2e}",
            case.tokens.len()
        );
        assert!(
            err <= MAX_RELATIVE_ERROR,
            "{name} sequence {i}: relative error {err:.3e}"
        );
    }
}

/// The model folders on disk (those with an `expected.safetensors`) are exactly the ones the
/// tests walk: a fixture `generate.py` writes but `FIXTURE_MODELS` misses would go unchecked.
#[test]
fn every_fixture_on_disk_is_checked() {
    let dir = root().join("tests/fixtures");
    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.join("expected.safetensors").is_file())
        .map(|path| path.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = FIXTURE_MODELS.iter().map(|s| s.to_string()).collect();
    listed.sort();
    assert_eq!(
        listed, on_disk,
        "FIXTURE_MODELS against the folders of tests/fixtures"
    );
}

#[test]
fn tied_gqa4_bf16_matches_transformers() {
    check_model("tied-gqa4-bf16", &CpuBackend::new());
}

#[test]
fn untied_gqa2_odd_hidden_f32_sharded_matches_transformers() {
    check_model("untied-gqa2-odd-f32", &CpuBackend::new());
}

#[test]
fn yarn4_beyond_original_context_matches_transformers() {
    let name = "yarn4-f16";
    let model = Qwen2Model::load(&CpuBackend::new(), &fixture_dir(name)).unwrap();
    let swerve::config::RopeScaling::Yarn(yarn) = &model.config.rope.scaling else {
        panic!("{name} is not YaRN")
    };
    let longest = expected(name).iter().map(|c| c.tokens.len()).max().unwrap();
    assert!(
        longest > yarn.original_max_position_embeddings,
        "fixture must reach past the original context"
    );
    check_model(name, &CpuBackend::new());
}

#[test]
fn single_threaded_backend_gives_the_same_logits() {
    check_model("tied-gqa4-bf16", &CpuBackend::with_threads(1));
}

#[test]
fn packing_does_not_change_a_sequence() {
    // The same sequence alone and packed between others gives the same logits.
    let backend = CpuBackend::new();
    let model = Qwen2Model::load(&backend, &fixture_dir("untied-gqa2-odd-f32")).unwrap();
    let cases = expected("untied-gqa2-odd-f32");
    let alone = backend
        .to_host(
            &model
                .forward_logits(
                    &backend,
                    &PackedBatch::from_sequences(&[cases[1].tokens.clone()]),
                )
                .unwrap(),
        )
        .unwrap();
    let packed_batch = PackedBatch::from_sequences(&[
        cases[2].tokens.clone(),
        cases[1].tokens.clone(),
        cases[0].tokens.clone(),
    ]);
    let packed = backend
        .to_host(&model.forward_logits(&backend, &packed_batch).unwrap())
        .unwrap();
    let vocab = model.config.vocab_size;
    let range = packed_batch.sequence_range(1);
    assert_eq!(&packed[range.start * vocab..range.end * vocab], &alone[..]);
}
