//! The canonical tensor-parallel sums on the CUDA backend (DESIGN.md decision 10): NCCL's
//! `all_reduce_sum` and `reduce_scatter_rows` give, per element, `x_0 + x_1 + ... + x_{n-1}` in
//! rank order in fp32 rounded once, bit for bit the CPU reference (`dist::sum_in_rank_order`, what
//! the host path computes), for every message size and for both collectives.
//!
//! - The `rank_sum` kernel (`kernels/rank_sum.cu`) against the reference: 1 to 5 ranks, ragged
//!   counts and strides, bf16 and f32, outputs poisoned. One GPU.
//! - The ordered all-reduce and reduce-scatter at 1 to 4 ranks, tiny sizes and sizes not
//!   divisible by the ranks, equal the reference, and an all-reduce's rows equal the
//!   reduce-scatter's of the same data; the same inside a CUDA graph capture (replayed twice), and
//!   a scratch that would grow inside a capture is refused.
//! - (emulated builds) The protection is real: the emulated `ncclAllReduce` (what
//!   `all_reduce_sum_any_order` calls, and what the tensor-parallel sums used before) is not in
//!   rank order, so at 4 ranks it differs from the reference; at 2 it cannot (`a + b == b + a`).
//!
//! Real NCCL refuses two ranks on one GPU: a world size runs only with that many GPUs and is
//! skipped with a note otherwise. Needs a CUDA GPU or a SWERVE_EMU=1 build: without either these
//! tests fail, never pass.

mod common;

use common::gpu::{gpu, poisoned};
use common::nccl_ranks::{on_ranks, world_fits};
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use half::bf16;
use swerve::backend::cuda::{self, CudaBackend, CudaTensor, DeviceDType};
use swerve::dist::nccl::NcclComm;
use swerve::dist::{sum_in_rank_order, Collectives, Communicator};
use swerve::rng::{Rng, SplitMix64};

const DTYPES: [DeviceDType; 2] = [DeviceDType::Bf16, DeviceDType::F32];

/// Rank `rank`'s `n` values for case `seed`, representable in `dtype`, with a magnitude that
/// differs by rank (so the order of a sum shows in its rounding).
fn values(dtype: DeviceDType, n: usize, seed: u64, rank: usize) -> Vec<f32> {
    let mut rng = SplitMix64::new(seed * 1_000 + rank as u64 + 5);
    let scale = [1.0f32, 300.0, 0.003, 7.0, 90.0][rank % 5];
    (0..n)
        .map(|_| round((rng.next_f64() * 2.0 - 1.0) as f32 * scale, dtype))
        .collect()
}

fn round(v: f32, dtype: DeviceDType) -> f32 {
    match dtype {
        DeviceDType::Bf16 => bf16::from_f32(v).to_f32(),
        _ => v,
    }
}

fn bytes_of(dtype: DeviceDType, values: &[f32]) -> Vec<u8> {
    match dtype {
        DeviceDType::Bf16 => values
            .iter()
            .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
            .collect(),
        _ => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

fn upload(backend: &CudaBackend, dtype: DeviceDType, shape: &[usize], v: &[f32]) -> CudaTensor {
    let mut t = poisoned(backend, shape, dtype);
    backend.write_bytes(&mut t, &bytes_of(dtype, v)).unwrap();
    t
}

/// The rank-order reference over every rank's `parts`, rounded once to `dtype`.
fn reference(dtype: DeviceDType, parts: &[Vec<f32>]) -> Vec<f32> {
    let all: Vec<f32> = parts.concat();
    let sums = sum_in_rank_order(&all, parts.len());
    sums.into_iter().map(|v| round(v, dtype)).collect()
}

/// `got` (device bytes) against `want`, bit for bit.
fn assert_bits(what: &str, dtype: DeviceDType, got: &[u8], want: &[f32]) {
    let want = bytes_of(dtype, want);
    assert_eq!(got.len(), want.len(), "{what}: sizes");
    if got != want.as_slice() {
        let es = dtype.size();
        let i = (0..got.len() / es)
            .find(|&i| got[i * es..][..es] != want[i * es..][..es])
            .unwrap();
        panic!(
            "{what}: element {i} is {:?}, the rank-order sum {:?}",
            &got[i * es..][..es],
            &want[i * es..][..es]
        );
    }
}

#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn the_rank_sum_kernel_equals_the_cpu_reference() {
    let backend = gpu();
    let cases = [
        (1, 1),
        (7, 7),
        (8, 8),
        (5, 9),
        (0, 3),
        (1000, 1003),
        (4099, 4099),
    ];
    for dtype in DTYPES {
        for ranks in 1..=5 {
            for (i, &(count, stride)) in cases.iter().enumerate() {
                let rows: Vec<Vec<f32>> = (0..ranks)
                    .map(|r| values(dtype, stride, i as u64, r))
                    .collect();
                let partials = upload(&backend, dtype, &[ranks, stride], &rows.concat());
                let mut out = poisoned(&backend, &[count], dtype);
                backend.device.rank_sum(&partials, &mut out).unwrap();
                let firsts: Vec<Vec<f32>> = rows.iter().map(|r| r[..count].to_vec()).collect();
                assert_bits(
                    &format!("rank_sum {dtype:?} of {ranks} rows, {count} of {stride}"),
                    dtype,
                    &backend.read_bytes(&out).unwrap(),
                    &reference(dtype, &firsts),
                );
            }
        }
    }
}

/// Message sizes of the all-reduces: tiny, not divisible by 2, 3 or 4, divisible.
const COUNTS: [usize; 9] = [1, 2, 3, 5, 8, 13, 64, 1001, 4099];
/// (rows per rank, columns) of the reduce-scatters.
const ROWS: [(usize, usize); 4] = [(1, 1), (1, 5), (3, 7), (2, 33)];

/// Every rank's inputs of a case (each rank computes them all: the reference needs them).
fn every_rank(dtype: DeviceDType, n: usize, seed: u64, size: usize) -> Vec<Vec<f32>> {
    (0..size).map(|r| values(dtype, n, seed, r)).collect()
}

/// The ordered all-reduce of every count, and the reduce-scatter of every row shape beside the
/// all-reduce of the same data, on this rank, against the reference.
fn ordered_sums_match(backend: &CudaBackend, comm: &NcclComm) {
    let (rank, size) = (comm.rank(), comm.size());
    for dtype in DTYPES {
        for (case, &count) in COUNTS.iter().enumerate() {
            let inputs = every_rank(dtype, count, case as u64, size);
            let mut x = upload(backend, dtype, &[count], &inputs[rank]);
            comm.all_reduce_sum(backend, &mut x).unwrap();
            let what = format!("all-reduce of {count} {dtype:?}, rank {rank} of {size}");
            assert_bits(
                &what,
                dtype,
                &backend.read_bytes(&x).unwrap(),
                &reference(dtype, &inputs),
            );
        }
        for (case, &(rows, cols)) in ROWS.iter().enumerate() {
            let n = rows * cols;
            let inputs = every_rank(dtype, size * n, 100 + case as u64, size);
            let full = upload(backend, dtype, &[size * rows, cols], &inputs[rank]);
            let mut out = poisoned(backend, &[rows, cols], dtype);
            comm.reduce_scatter_rows(backend, &full, &mut out).unwrap();
            let want = reference(dtype, &inputs);
            let what =
                format!("reduce-scatter of {rows} x {cols} {dtype:?}, rank {rank} of {size}");
            let scattered = backend.read_bytes(&out).unwrap();
            assert_bits(&what, dtype, &scattered, &want[rank * n..][..n]);
            // The same elements through the all-reduce: the same bits.
            let mut all = upload(backend, dtype, &[size * rows, cols], &inputs[rank]);
            comm.all_reduce_sum(backend, &mut all).unwrap();
            let es = dtype.size();
            assert_eq!(
                backend.read_bytes(&all).unwrap()[rank * n * es..][..n * es],
                scattered[..],
                "{what}: the all-reduce's rows {rank} differ from the reduce-scatter's"
            );
        }
    }
}

#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn ordered_all_reduce_and_reduce_scatter_equal_the_rank_order_sum() {
    let mut ran = 0;
    for size in [1, 2, 3, 4] {
        if world_fits(size) {
            on_ranks(size, |backend, comm, _| ordered_sums_match(backend, comm));
            ran += 1;
        }
    }
    println!("{ran} of 4 world sizes ran");
    if cuda::is_emulated() {
        assert_eq!(ran, 4);
    }
}

/// One rank's ordered sums recorded in a CUDA graph and replayed twice (inputs restored between
/// replays), against the reference; then a capture that would grow the scratch is refused.
fn ordered_sums_in_a_graph(backend: &CudaBackend, comm: &NcclComm) {
    let (rank, size) = (comm.rank(), comm.size());
    let dtype = DeviceDType::Bf16;
    let (odd, even, rows, cols) = (1001, 1024, 3, 7);
    let a = every_rank(dtype, odd, 1, size);
    let b = every_rank(dtype, even, 2, size);
    let c = every_rank(dtype, size * rows * cols, 3, size);
    let mut xa = upload(backend, dtype, &[odd], &a[rank]);
    let mut xb = upload(backend, dtype, &[even], &b[rank]);
    let full = upload(backend, dtype, &[size * rows, cols], &c[rank]);
    let mut out = poisoned(backend, &[rows, cols], dtype);
    let run = |xa: &mut CudaTensor, xb: &mut CudaTensor, out: &mut CudaTensor| {
        comm.all_reduce_sum(backend, xa)?;
        comm.all_reduce_sum(backend, xb)?;
        comm.reduce_scatter_rows(backend, &full, out)
    };
    // Eagerly first: sizes the scratch, as the engine's warm-up does.
    run(&mut xa, &mut xb, &mut out).unwrap();
    let stream = &backend.device.stream;
    stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
        .unwrap();
    let captured = run(&mut xa, &mut xb, &mut out);
    let graph = stream.end_capture(CUgraphInstantiate_flags(0)).unwrap();
    captured.unwrap();
    let graph = graph.expect("the capture recorded the sums");
    let n = rows * cols;
    for replay in 0..2 {
        backend
            .write_bytes(&mut xa, &bytes_of(dtype, &a[rank]))
            .unwrap();
        backend
            .write_bytes(&mut xb, &bytes_of(dtype, &b[rank]))
            .unwrap();
        backend.fill_bytes(&mut out, 0xFF).unwrap();
        graph.launch().unwrap();
        let what = |w: &str| format!("{w} in a graph, replay {replay}, rank {rank} of {size}");
        assert_bits(
            &what("all-reduce of 1001"),
            dtype,
            &backend.read_bytes(&xa).unwrap(),
            &reference(dtype, &a),
        );
        assert_bits(
            &what("all-reduce of 1024"),
            dtype,
            &backend.read_bytes(&xb).unwrap(),
            &reference(dtype, &b),
        );
        let want = reference(dtype, &c);
        assert_bits(
            &what("reduce-scatter"),
            dtype,
            &backend.read_bytes(&out).unwrap(),
            &want[rank * n..][..n],
        );
    }
    drop(graph);
    // A sum larger than any eager one inside a capture: refused before any NCCL call (every rank
    // alike), with the reason.
    let mut big = upload(backend, dtype, &[8 * even], &vec![1.0; 8 * even]);
    stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
        .unwrap();
    let refused = comm.all_reduce_sum(backend, &mut big);
    let _ = stream.end_capture(CUgraphInstantiate_flags(0));
    let e = format!("{:#}", refused.unwrap_err());
    assert!(e.contains("inside a CUDA graph capture"), "{e}");
}

#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn ordered_sums_replay_in_cuda_graphs() {
    let mut ran = 0;
    for size in [2, 4] {
        if world_fits(size) {
            on_ranks(size, |backend, comm, _| {
                ordered_sums_in_a_graph(backend, comm)
            });
            ran += 1;
        }
    }
    println!("{ran} of 2 world sizes ran");
    if cuda::is_emulated() {
        assert_eq!(ran, 2);
    }
}

/// How many elements of this rank's `ncclAllReduce` (`all_reduce_sum_any_order`) differ from the
/// rank-order reference, for a message of `count` in `dtype`; the ordered sum of the same data is
/// checked equal to it.
#[cfg(swerve_emu)]
fn ring_differences(backend: &CudaBackend, comm: &NcclComm, dtype: DeviceDType) -> usize {
    let (rank, size, count) = (comm.rank(), comm.size(), 4099);
    let inputs = every_rank(dtype, count, 7, size);
    let want = bytes_of(dtype, &reference(dtype, &inputs));
    let mut ordered = upload(backend, dtype, &[count], &inputs[rank]);
    comm.all_reduce_sum(backend, &mut ordered).unwrap();
    assert_eq!(backend.read_bytes(&ordered).unwrap(), want);
    let mut ring = upload(backend, dtype, &[count], &inputs[rank]);
    comm.all_reduce_sum_any_order(backend, &mut ring).unwrap();
    let got = backend.read_bytes(&ring).unwrap();
    let es = dtype.size();
    (0..count)
        .filter(|&i| got[i * es..][..es] != want[i * es..][..es])
        .count()
}

#[test]
#[cfg(swerve_emu)]
fn the_emulated_nccl_all_reduce_is_not_in_rank_order_from_three_ranks() {
    for dtype in DTYPES {
        let two = on_ranks(2, |backend, comm, _| ring_differences(backend, comm, dtype));
        assert_eq!(
            two,
            vec![0, 0],
            "{dtype:?} at 2 ranks: any order gives the same bits"
        );
        let four = on_ranks(4, |backend, comm, _| ring_differences(backend, comm, dtype));
        println!("{dtype:?} at 4 ranks: ncclAllReduce differs from rank order in {four:?} of 4099");
        assert!(
            four.iter().all(|&d| d > 0 && d == four[0]),
            "{dtype:?} at 4 ranks: {four:?} elements differ (the same on every rank, never none)"
        );
    }
}
