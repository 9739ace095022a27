//! `dist::nccl` (NCCL between GPU ranks) against the host-staged collectives of `LocalComm`
//! (`Communicator`'s default bodies, rank-order f32 sums) on the same device tensors.
//!
//! - World size 1 (one GPU, any host): every collective through NCCL equals the local
//!   communicator's bit for bit (NCCL with one rank copies).
//! - World sizes 2, 3 and 4, each rank a thread with its own `CudaBackend`, the NCCL id sent
//!   from rank 0 through the `LocalComm`: all-reduce (bf16, f32), all-gather and reduce-scatter of
//!   rows, broadcast, all-gather of columns of unequal widths (one of them empty), on random
//!   tensors of ragged shapes with every output NaN-poisoned first; and the host `Collectives`
//!   through NCCL (ragged byte lengths, broadcast, rank-order reductions). Everything is bitwise,
//!   on the emulated device (several ranks share it) and on GPUs: the tensor sums are the ordered
//!   ones (rank order, fp32, one rounding; tests/gpu_ordered_sums.rs tests them further).
//!   Real NCCL refuses two ranks on one GPU, so there a size runs only with that many GPUs (rank r
//!   on device r); the others are skipped with a note.
//! - The emulated libnccl's refusals (emulated builds only): ranks that disagree (raw
//!   `ncclAllReduce`, through `all_reduce_sum_any_order`; sends and receives that do not match),
//!   a rank that leaves, a rank that never comes (a child process with a short timeout), grouped
//!   calls from one thread, unknown communicators.
//!
//! Needs a CUDA GPU (run through scripts/gpu-pack.sh) or a SWERVE_EMU=1 build; without either
//! these tests fail, never pass.

mod common;

use common::gpu::{gpu, poisoned};
use common::nccl_ranks::{on_ranks, world_fits};
use half::bf16;
use swerve::backend::cuda::{self, CudaBackend, CudaTensor, DeviceDType};
use swerve::dist::local::LocalComm;
use swerve::dist::nccl::{self, NcclComm};
use swerve::dist::{Collectives, Communicator, ReduceOp};
use swerve::rng::{Rng, SplitMix64};

/// Rank `rank`'s input for case `case`: full-precision f32, or bf16-representable values, with a
/// magnitude that differs between ranks (so the order of a sum shows in its rounding).
fn input(dtype: DeviceDType, n: usize, case: u64, rank: usize) -> Vec<f32> {
    let mut rng = SplitMix64::new(1_000 * case + rank as u64 + 17);
    let scale = [1.0f32, 37.0, 0.01, 5.0][rank % 4];
    (0..n)
        .map(|_| {
            let v = (rng.next_f64() * 2.0 - 1.0) as f32 * scale;
            match dtype {
                DeviceDType::Bf16 => bf16::from_f32(v).to_f32(),
                _ => v,
            }
        })
        .collect()
}

fn upload(
    backend: &CudaBackend,
    dtype: DeviceDType,
    shape: &[usize],
    values: &[f32],
) -> CudaTensor {
    match dtype {
        DeviceDType::Bf16 => {
            let v: Vec<bf16> = values.iter().map(|&x| bf16::from_f32(x)).collect();
            backend.upload_pod(&v, shape, dtype).unwrap()
        }
        DeviceDType::F32 => backend.upload_pod(values, shape, dtype).unwrap(),
        other => panic!("no {other:?} inputs"),
    }
}

fn as_f32(dtype: DeviceDType, bytes: &[u8]) -> Vec<f32> {
    match dtype {
        DeviceDType::Bf16 => bytes
            .chunks_exact(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        _ => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect(),
    }
}

/// NCCL's output against the local communicator's, bit for bit (sums included: both are in rank
/// order, fp32, rounded once).
fn compare(what: &str, dtype: DeviceDType, got: &[u8], want: &[u8]) {
    assert_eq!(got.len(), want.len(), "{what}: sizes");
    let (g, w) = (as_f32(dtype, got), as_f32(dtype, want));
    if let Some(i) = g.iter().position(|v| v.is_nan()) {
        panic!("{what}: element {i} is NaN (unwritten poison?)");
    }
    if got != want {
        let i = g
            .iter()
            .zip(&w)
            .position(|(a, b)| a.to_bits() != b.to_bits())
            .unwrap_or(0);
        panic!(
            "{what}: element {i} is {} through NCCL, {} through the host",
            g[i], w[i]
        );
    }
}

const SHAPES: [&[usize]; 5] = [&[1, 1], &[3, 5], &[7, 33], &[2, 3, 4], &[16, 129]];

/// One rank's backend and its two communicators: NCCL, and the local one it is checked against.
struct Comms<'a> {
    backend: &'a CudaBackend,
    comm: &'a NcclComm,
    local: &'a LocalComm,
}

impl Comms<'_> {
    /// A case's name in a failure message: the collective, shape, dtype and rank.
    fn label(&self, op: &str, shape: &[usize], dtype: DeviceDType) -> String {
        let (rank, size) = (self.comm.rank(), self.comm.size());
        format!("{op} {shape:?} {dtype:?}, rank {rank} of {size}")
    }
}

/// Every tensor collective on every shape and dtype, NCCL against the local communicator.
fn tensor_collectives(backend: &CudaBackend, comm: &NcclComm, local: &LocalComm) {
    let c = Comms {
        backend,
        comm,
        local,
    };
    let (rank, size) = (comm.rank(), comm.size());
    let mut case = 0u64;
    for dtype in [DeviceDType::Bf16, DeviceDType::F32] {
        for shape in SHAPES {
            case += 1;
            let x = input(dtype, shape.iter().product(), case, rank);
            all_reduce_matches(&c, dtype, shape, &x);
            all_gather_rows_matches(&c, dtype, shape, &x);
            case += 1;
            reduce_scatter_rows_matches(&c, dtype, shape, case);
            broadcast_matches(&c, dtype, shape, &x, case);
        }
        for (rows, widths) in column_cases(size) {
            case += 1;
            all_gather_columns_matches(&c, dtype, rows, &widths, case);
        }
    }
}

/// All-reduce, in place, of this rank's `x`.
fn all_reduce_matches(c: &Comms, dtype: DeviceDType, shape: &[usize], x: &[f32]) {
    let backend = c.backend;
    let mut via_nccl = upload(backend, dtype, shape, x);
    let mut via_host = upload(backend, dtype, shape, x);
    c.comm.all_reduce_sum(backend, &mut via_nccl).unwrap();
    c.local.all_reduce_sum(backend, &mut via_host).unwrap();
    compare(
        &c.label("all-reduce", shape, dtype),
        dtype,
        &backend.read_bytes(&via_nccl).unwrap(),
        &backend.read_bytes(&via_host).unwrap(),
    );
}

/// All-gather of rows: every rank's `x` stacked in rank order.
fn all_gather_rows_matches(c: &Comms, dtype: DeviceDType, shape: &[usize], x: &[f32]) {
    let backend = c.backend;
    let mut big = shape.to_vec();
    big[0] *= c.comm.size();
    let part = upload(backend, dtype, shape, x);
    let mut out_nccl = poisoned(backend, &big, dtype);
    let mut out_host = poisoned(backend, &big, dtype);
    c.comm
        .all_gather_rows(backend, &part, &mut out_nccl)
        .unwrap();
    c.local
        .all_gather_rows(backend, &part, &mut out_host)
        .unwrap();
    compare(
        &c.label("all-gather", shape, dtype),
        dtype,
        &backend.read_bytes(&out_nccl).unwrap(),
        &backend.read_bytes(&out_host).unwrap(),
    );
}

/// Reduce-scatter of rows: every rank's [size * rows, ..] (case `case`), this rank's rows summed.
fn reduce_scatter_rows_matches(c: &Comms, dtype: DeviceDType, shape: &[usize], case: u64) {
    let (backend, rank, size) = (c.backend, c.comm.rank(), c.comm.size());
    let n: usize = shape.iter().product();
    let mut big = shape.to_vec();
    big[0] *= size;
    let full = input(dtype, n * size, case, rank);
    let full = upload(backend, dtype, &big, &full);
    let mut out_nccl = poisoned(backend, shape, dtype);
    let mut out_host = poisoned(backend, shape, dtype);
    c.comm
        .reduce_scatter_rows(backend, &full, &mut out_nccl)
        .unwrap();
    c.local
        .reduce_scatter_rows(backend, &full, &mut out_host)
        .unwrap();
    compare(
        &c.label("reduce-scatter", shape, dtype),
        dtype,
        &backend.read_bytes(&out_nccl).unwrap(),
        &backend.read_bytes(&out_host).unwrap(),
    );
}

/// Broadcast of `x`, in place, from a different root each case.
fn broadcast_matches(c: &Comms, dtype: DeviceDType, shape: &[usize], x: &[f32], case: u64) {
    let backend = c.backend;
    let root = case as usize % c.comm.size();
    let mut via_nccl = upload(backend, dtype, shape, x);
    let mut via_host = upload(backend, dtype, shape, x);
    c.comm.broadcast(backend, &mut via_nccl, root).unwrap();
    c.local.broadcast(backend, &mut via_host, root).unwrap();
    compare(
        &c.label(&format!("broadcast from {root}"), shape, dtype),
        dtype,
        &backend.read_bytes(&via_nccl).unwrap(),
        &backend.read_bytes(&via_host).unwrap(),
    );
}

/// Rows and per-rank widths of the column all-gathers (vocabulary shards), one case with an
/// empty one.
fn column_cases(size: usize) -> [(usize, Vec<usize>); 3] {
    [
        (3, (0..size).map(|r| 7 - r % 3).collect::<Vec<_>>()),
        (
            1,
            (0..size)
                .map(|r| if r == 1 { 0 } else { 2 * r + 1 })
                .collect(),
        ),
        (5, vec![4; size]),
    ]
}

/// All-gather of columns of unequal widths: `rows` rows, rank r's part `widths[r]` wide.
fn all_gather_columns_matches(
    c: &Comms,
    dtype: DeviceDType,
    rows: usize,
    widths: &[usize],
    case: u64,
) {
    let (backend, rank) = (c.backend, c.comm.rank());
    let total: usize = widths.iter().sum();
    let x = input(dtype, rows * widths[rank], case, rank);
    let part = upload(backend, dtype, &[rows, widths[rank]], &x);
    let mut out_nccl = poisoned(backend, &[rows, total], dtype);
    let mut out_host = poisoned(backend, &[rows, total], dtype);
    c.comm
        .all_gather_columns(backend, &part, widths, &mut out_nccl)
        .unwrap();
    c.local
        .all_gather_columns(backend, &part, widths, &mut out_host)
        .unwrap();
    compare(
        &format!("all-gather of columns {widths:?} x {rows} rows {dtype:?}, rank {rank}"),
        dtype,
        &backend.read_bytes(&out_nccl).unwrap(),
        &backend.read_bytes(&out_host).unwrap(),
    );
}

/// The host collectives through NCCL's device buffers equal the local group's.
fn host_collectives(comm: &NcclComm, local: &LocalComm) {
    let (rank, size) = (comm.rank(), comm.size());
    let mine: Vec<u8> = (0..(rank * 5) % 7).map(|i| (i * 31 + rank) as u8).collect();
    assert_eq!(
        comm.all_gather_bytes(&mine).unwrap(),
        local.all_gather_bytes(&mine).unwrap(),
        "ragged all-gather of bytes, rank {rank}"
    );
    assert_eq!(
        comm.all_gather_bytes(&[]).unwrap(),
        vec![Vec::<u8>::new(); size]
    );
    comm.barrier().unwrap();
    let mut a = if rank == size - 1 {
        b"the root's bytes".to_vec()
    } else {
        Vec::new()
    };
    let mut b = a.clone();
    comm.broadcast_bytes(&mut a, size - 1).unwrap();
    local.broadcast_bytes(&mut b, size - 1).unwrap();
    assert_eq!(a, b);
    let x = input(DeviceDType::F32, 11, 99, rank);
    let (mut via_nccl, mut via_host) = (x.clone(), x.clone());
    comm.all_reduce_f32(&mut via_nccl, ReduceOp::Sum).unwrap();
    local.all_reduce_f32(&mut via_host, ReduceOp::Sum).unwrap();
    assert_eq!(
        via_nccl.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        via_host.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        "host all-reduce (rank order) through NCCL, rank {rank}"
    );
    let y: Vec<f64> = x.iter().map(|&v| v as f64 * 1.5).collect();
    let (mut via_nccl, mut via_host) = (y.clone(), y);
    comm.all_reduce_f64(&mut via_nccl, ReduceOp::Max).unwrap();
    local.all_reduce_f64(&mut via_host, ReduceOp::Max).unwrap();
    assert_eq!(via_nccl, via_host);
}

#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn the_library_is_found_and_reports_its_version() {
    let _ = gpu();
    let version = nccl::probe().unwrap_or_else(|e| panic!("{e:#}"));
    println!("{version}");
    assert!(version.starts_with("NCCL 2."), "{version}");
    assert_eq!(
        cuda::is_emulated(),
        version.contains("emulated"),
        "{version}"
    );
}

#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn world_size_one_through_nccl_equals_the_local_communicator() {
    assert!(world_fits(1));
    on_ranks(1, |backend, comm, local| {
        tensor_collectives(backend, comm, local);
        host_collectives(comm, local);
    });
}

#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn ranks_as_threads_match_the_host_staged_collectives() {
    let mut ran = 0;
    for size in [2, 3, 4] {
        if !world_fits(size) {
            continue;
        }
        on_ranks(size, |backend, comm, local| {
            tensor_collectives(backend, comm, local);
            host_collectives(comm, local);
        });
        ran += 1;
    }
    println!("{ran} of 3 world sizes ran");
    if cuda::is_emulated() {
        assert_eq!(ran, 3);
    }
}

/// The emulated libnccl's refusals: errors naming the call and the ranks, never a hang.
#[cfg(swerve_emu)]
mod emulated {
    use super::*;
    use std::ffi::{c_char, c_int, c_void, CString};
    use std::process::Command;
    use std::sync::mpsc;

    const CHILD: &str = "SWERVE_GPU_NCCL_CHILD";

    /// Two ranks; `f(rank, backend, comm)` on each; errors as text.
    fn two_ranks<R: Send>(f: impl Fn(usize, &CudaBackend, NcclComm) -> R + Sync) -> Vec<R> {
        on_ranks_owned(2, f)
    }

    fn on_ranks_owned<R: Send>(
        size: usize,
        f: impl Fn(usize, &CudaBackend, NcclComm) -> R + Sync,
    ) -> Vec<R> {
        common::nccl_ranks::spawn_ranks(size, |rank, backend, comm, local| {
            drop(local);
            f(rank, &backend, comm)
        })
    }

    fn f32_tensor(backend: &CudaBackend, n: usize) -> CudaTensor {
        backend
            .upload_pod(&vec![1.0f32; n], &[n], DeviceDType::F32)
            .unwrap()
    }

    #[test]
    fn ranks_that_disagree_fail_on_every_rank_naming_them() {
        // Counts.
        let errors = two_ranks(|rank, backend, comm| {
            let mut x = f32_tensor(backend, 4 + rank);
            let first = comm.all_reduce_sum_any_order(backend, &mut x);
            let first = format!("{:#}", first.unwrap_err());
            // The communicator stays broken: the next call fails at once with the same cause.
            let second = format!("{:#}", comm.all_reduce_sum(backend, &mut x).unwrap_err());
            (first, second)
        });
        for (first, second) in &errors {
            assert!(first.contains("ncclAllReduce"), "{first}");
            assert!(first.contains("count: rank 0 4, rank 1 5"), "{first}");
            assert!(first.contains("ncclInvalidUsage"), "{first}");
            assert!(
                second.contains("broken") && second.contains("count"),
                "{second}"
            );
        }
        // Datatypes.
        let errors = two_ranks(|rank, backend, comm| {
            let dtype = [DeviceDType::F32, DeviceDType::Bf16][rank];
            let mut x = poisoned(backend, &[4], dtype);
            comm.broadcast(backend, &mut x, 0).unwrap_err()
        });
        for e in &errors {
            let e = format!("{e:#}");
            assert!(
                e.contains("datatype: rank 0 ncclFloat32, rank 1 ncclBfloat16"),
                "{e}"
            );
        }
        // Collectives.
        let errors = two_ranks(|rank, backend, comm| {
            let mut x = f32_tensor(backend, 4);
            match rank {
                0 => comm.all_reduce_sum_any_order(backend, &mut x).unwrap_err(),
                _ => comm.broadcast(backend, &mut x, 0).unwrap_err(),
            }
        });
        for e in &errors {
            let e = format!("{e:#}");
            assert!(
                e.contains("collective: rank 0 ncclAllReduce, rank 1 ncclBroadcast"),
                "{e}"
            );
        }
    }

    #[test]
    fn ordered_sums_that_disagree_fail_naming_the_sends_and_receives() {
        // Counts: the all-to-all of slices of 2 and 3 elements.
        let errors = two_ranks(|rank, backend, comm| {
            let mut x = f32_tensor(backend, 4 + 2 * rank);
            format!("{:#}", comm.all_reduce_sum(backend, &mut x).unwrap_err())
        });
        for e in &errors {
            assert!(e.contains("ncclSend/ncclRecv"), "{e}");
            assert!(e.contains("ncclInvalidUsage"), "{e}");
            assert!(
                e.contains(
                    "rank 0's send #1 to rank 1 is 2 x ncclFloat32, \
                     rank 1's receive #1 from rank 0 is 3 x ncclFloat32"
                ),
                "{e}"
            );
        }
        // One rank sums in order, the other through ncclAllReduce: the collectives differ.
        let errors = two_ranks(|rank, backend, comm| {
            let mut x = f32_tensor(backend, 4);
            let r = match rank {
                0 => comm.all_reduce_sum(backend, &mut x),
                _ => comm.all_reduce_sum_any_order(backend, &mut x),
            };
            format!("{:#}", r.unwrap_err())
        });
        for e in &errors {
            assert!(
                e.contains("collective: rank 0 ncclSend/ncclRecv, rank 1 ncclAllReduce"),
                "{e}"
            );
        }
    }

    #[test]
    fn a_rank_that_leaves_fails_the_others_instead_of_blocking_them() {
        let errors = on_ranks_owned(3, |rank, backend, comm| {
            comm.barrier().unwrap();
            if rank == 2 {
                drop(comm);
                return None;
            }
            let mut x = f32_tensor(backend, 8);
            Some(format!(
                "{:#}",
                comm.all_reduce_sum(backend, &mut x).unwrap_err()
            ))
        });
        for e in errors.into_iter().flatten() {
            assert!(
                e.contains("rank(s) 2 of 3 destroyed their communicator"),
                "{e}"
            );
            assert!(e.contains("ncclRemoteError"), "{e}");
        }
    }

    #[test]
    fn a_rank_that_never_comes_times_out_naming_it() {
        const CASE: &str = "emulated::a_rank_that_never_comes_times_out_naming_it";
        if std::env::var(CHILD).as_deref() == Ok(CASE) {
            let (done, wait) = mpsc::channel::<()>();
            let wait = std::sync::Mutex::new(wait);
            let errors = two_ranks(|rank, backend, comm| {
                if rank == 1 {
                    // Alive, but never calling: until rank 0 has given up.
                    wait.lock().unwrap().recv().unwrap();
                    return String::new();
                }
                let mut x = f32_tensor(backend, 8);
                let e = format!("{:#}", comm.all_reduce_sum(backend, &mut x).unwrap_err());
                done.send(()).unwrap();
                e
            });
            eprintln!("RANK0: {}", errors[0]);
            std::process::exit(0);
        }
        let start = std::time::Instant::now();
        let output = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", CASE, "--nocapture", "--test-threads=1"])
            .env(CHILD, CASE)
            .env("SWERVE_EMU_NCCL_TIMEOUT_S", "1")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{stderr}");
        assert!(
            stderr.contains("RANK0:")
                && stderr.contains("rank(s) 1 of 2 did not call it within 1 s"),
            "{stderr}"
        );
        assert!(start.elapsed().as_secs() < 60);
    }

    type Res = c_int;

    /// The stand-in library's raw entry points, as a C program would call them.
    struct Raw {
        get_unique_id: unsafe extern "C" fn(*mut [u8; 128]) -> Res,
        init_rank: unsafe extern "C" fn(*mut *mut c_void, c_int, [u8; 128], c_int) -> Res,
        destroy: unsafe extern "C" fn(*mut c_void) -> Res,
        all_reduce: unsafe extern "C" fn(
            *const c_void,
            *mut c_void,
            usize,
            c_int,
            c_int,
            *mut c_void,
            *mut c_void,
        ) -> Res,
        group_start: unsafe extern "C" fn() -> Res,
        group_end: unsafe extern "C" fn() -> Res,
        last_error: unsafe extern "C" fn(*mut c_void) -> *const c_char,
    }

    fn raw() -> Raw {
        let path = cuda::embedded::EMULATOR_LIBRARIES
            .iter()
            .find(|p| p.ends_with("/libnccl.so"))
            .unwrap();
        let c_path = CString::new(*path).unwrap();
        // SAFETY: the stand-in library this build made; the handle is never closed.
        let handle = unsafe { libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW) };
        assert!(!handle.is_null());
        /// # Safety
        /// `F` is the symbol's C signature as a function pointer.
        unsafe fn sym<F: Copy>(handle: *mut c_void, name: &str) -> F {
            let c_name = CString::new(name).unwrap();
            let p = libc::dlsym(handle, c_name.as_ptr());
            assert!(!p.is_null(), "{name}");
            std::mem::transmute_copy::<*mut c_void, F>(&p)
        }
        // SAFETY: each symbol has the C signature of its field (nccl.h; the id by value).
        unsafe {
            Raw {
                get_unique_id: sym(handle, "ncclGetUniqueId"),
                init_rank: sym(handle, "ncclCommInitRank"),
                destroy: sym(handle, "ncclCommDestroy"),
                all_reduce: sym(handle, "ncclAllReduce"),
                group_start: sym(handle, "ncclGroupStart"),
                group_end: sym(handle, "ncclGroupEnd"),
                last_error: sym(handle, "ncclGetLastError"),
            }
        }
    }

    fn last_error(raw: &Raw, comm: *mut c_void) -> String {
        // SAFETY: a C string owned by the library.
        unsafe { std::ffi::CStr::from_ptr((raw.last_error)(comm)) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn one_thread_drives_two_ranks_through_groups() {
        let backend = gpu();
        let raw = raw();
        let stream = backend.device.stream.cu_stream() as *mut c_void;
        let mut id = [0u8; 128];
        let mut comms = [std::ptr::null_mut::<c_void>(); 2];
        // SAFETY: the C API with valid pointers; the buffers are device (= host) memory.
        unsafe {
            assert_eq!((raw.get_unique_id)(&mut id), 0);
            assert_eq!((raw.group_start)(), 0);
            for (rank, comm) in comms.iter_mut().enumerate() {
                assert_eq!((raw.init_rank)(comm, 2, id, rank as c_int), 0);
            }
            assert_eq!((raw.group_end)(), 0);
            let a = backend
                .upload_pod(&[1.0f32, 2.0, 3.0], &[3], DeviceDType::F32)
                .unwrap();
            let b = backend
                .upload_pod(&[10.0f32, 20.0, 30.0], &[3], DeviceDType::F32)
                .unwrap();
            assert_eq!((raw.group_start)(), 0);
            for (comm, t) in comms.iter().zip([&a, &b]) {
                let p = t.ptr() as *mut c_void;
                assert_eq!((raw.all_reduce)(p, p, 3, 7, 0, *comm, stream), 0);
            }
            assert_eq!((raw.group_end)(), 0);
            for t in [&a, &b] {
                let got: Vec<f32> = bytemuck::cast_slice(&backend.read_bytes(t).unwrap()).to_vec();
                assert_eq!(got, vec![11.0, 22.0, 33.0]);
            }
            // ncclGroupEnd without a start, an unknown communicator, an id used up.
            assert_eq!((raw.group_end)(), 5);
            let bogus = 0x1234usize as *mut c_void;
            let p = a.ptr() as *mut c_void;
            assert_eq!((raw.all_reduce)(p, p, 3, 7, 0, bogus, stream), 4);
            assert!(last_error(&raw, bogus).contains("not a live communicator"));
            let mut late = std::ptr::null_mut();
            assert_eq!((raw.init_rank)(&mut late, 2, id, 1), 5);
            assert!(last_error(&raw, std::ptr::null_mut()).contains("joined already"));
            // Buffers too small for the count (beyond the pool's size class of the tensor).
            assert_eq!((raw.all_reduce)(p, p, 1 << 20, 7, 0, comms[0], stream), 4);
            let e = last_error(&raw, comms[0]);
            assert!(e.contains("does not hold 4194304 bytes"), "{e}");
            for comm in comms {
                assert_eq!((raw.destroy)(comm), 0);
            }
            assert_eq!((raw.destroy)(comms[0]), 4);
        }
    }
}
