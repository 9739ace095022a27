//! Tensor-parallel ranks as threads on the CPU backend, for the tests that compare a split model
//! with one rank.

use std::path::Path;
use std::sync::Arc;
use swerve::backend::cpu::CpuBackend;
use swerve::backend::Backend;
use swerve::dist::local::LocalGroup;
use swerve::dist::Communicator;
use swerve::model::{PackedBatch, Qwen2Model};

/// Runs `f(backend, rank model)` on `tp` threads, each with its own single-threaded CPU backend
/// and its part of `dir`'s model in an in-process group; results in rank order.
pub fn cpu_ranks<R: Send>(
    dir: &Path,
    tp: usize,
    f: impl Fn(&CpuBackend, &Qwen2Model<CpuBackend>) -> R + Sync,
) -> Vec<R> {
    std::thread::scope(|s| {
        let f = &f;
        let handles: Vec<_> = LocalGroup::new(tp)
            .into_iter()
            .map(|comm| {
                s.spawn(move || {
                    let backend = CpuBackend::with_threads(1);
                    let comm: Arc<dyn Communicator<CpuBackend>> = Arc::new(comm);
                    let model = Qwen2Model::load_shard(&backend, dir, comm).unwrap();
                    f(&backend, &model)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Rank 0's logits `[T, vocab]` of `batch` with `dir`'s model split over `tp` ranks.
pub fn split_logits(dir: &Path, tp: usize, batch: &PackedBatch) -> Vec<f32> {
    cpu_ranks(dir, tp, |backend, model| {
        backend
            .to_host(&model.forward_logits(backend, batch).unwrap())
            .unwrap()
    })
    .swap_remove(0)
}
