//! NCCL ranks as threads for the GPU tests of `dist::nccl`: each rank its own `CudaBackend`
//! (device 0 on the emulator, where the ranks share it; device `rank` on GPUs), its NCCL
//! communicator (the id sent from rank 0 through a `LocalComm`) and that local communicator.

use super::gpu::gpu;
use swerve::backend::cuda::{self, CudaBackend, CudaDevice};
use swerve::dist::local::{LocalComm, LocalGroup};
use swerve::dist::nccl::NcclComm;
use swerve::dist::Collectives;

/// Rank `rank`'s backend: device 0 on the emulator (every rank shares it), device `rank` on GPUs.
pub fn backend_for(rank: usize) -> CudaBackend {
    if rank == 0 || cuda::is_emulated() {
        return gpu();
    }
    let device = CudaDevice::open(rank).unwrap_or_else(|e| panic!("opening cuda:{rank}: {e:#}"));
    CudaBackend::new(device).unwrap()
}

/// Whether `size` ranks can run here, saying why not (after device 0 opened: no device fails
/// the test instead of skipping it).
pub fn world_fits(size: usize) -> bool {
    let _ = gpu();
    if cuda::is_emulated() || size == 1 {
        return true;
    }
    let devices = cudarc::driver::CudaContext::device_count().unwrap_or(0) as usize;
    if devices < size {
        println!(
            "world size {size} skipped: {devices} GPU(s) here, and NCCL refuses two ranks on one"
        );
    }
    devices >= size
}

/// Runs `f` on `size` ranks, each a thread with its own backend, NCCL communicator and local
/// communicator; results in rank order.
pub fn on_ranks<R: Send>(
    size: usize,
    f: impl Fn(&CudaBackend, &NcclComm, &LocalComm) -> R + Sync,
) -> Vec<R> {
    spawn_ranks(size, |rank, backend, comm, local| {
        assert_eq!((comm.rank(), comm.size()), (rank, size));
        f(&backend, &comm, &local)
    })
}

/// [`on_ranks`] handing each rank's objects over: `f(rank, backend, NCCL, local)`.
pub fn spawn_ranks<R: Send>(
    size: usize,
    f: impl Fn(usize, CudaBackend, NcclComm, LocalComm) -> R + Sync,
) -> Vec<R> {
    std::thread::scope(|s| {
        let f = &f;
        let handles: Vec<_> = LocalGroup::new(size)
            .into_iter()
            .enumerate()
            .map(|(rank, local)| {
                s.spawn(move || {
                    let backend = backend_for(rank);
                    let comm = NcclComm::init(&backend, &local)
                        .unwrap_or_else(|e| panic!("rank {rank}: {e:#}"));
                    f(rank, backend, comm, local)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}
