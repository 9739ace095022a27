//! NCCL: collectives between GPUs (DESIGN.md decision 11). One [`NcclComm`] per GPU rank, made
//! from an id that rank 0 draws ([`NcclId::new`]) and every rank receives through a host
//! [`Collectives`] ([`NcclComm::init`]), then [`Communicator<CudaBackend>`] on the device: every
//! tensor collective runs on the backend's stream (no host copy: one NCCL call, or for the
//! ordered sums a group of sends and receives, a kernel and an all-gather), and the host
//! [`Collectives`] go through a device buffer.
//!
//! ```text
//!  rank 0: NcclId::new ─► broadcast_bytes over LocalComm / TCP ─► every rank: ncclCommInitRank
//!  all_reduce_sum       ordered: all-to-all of slices (ncclSend/ncclRecv in a group), the
//!                       rank_sum kernel, ncclAllGather (in place; bf16 or f32; `ordered.rs`)
//!  reduce_scatter_rows  ordered: the same all-to-all and kernel, into this rank's rows
//!  all_reduce_sum_any_order   ncclAllReduce (sum, in place): data-parallel gradients
//!  all_gather_rows      ncclAllGather
//!  broadcast            ncclBroadcast (in place)
//!  all_gather_columns   local [rows, w_r] ─2-D copy─► [rows, max w] ─ncclAllGather─► [size, rows,
//!                       max w] ─2-D copies (cuMemcpy2DAsync)─► out [rows, Σ w] column blocks
//!  all_gather_bytes     lengths (ncclAllGather of 8 bytes), then the bytes padded to the longest
//! ```
//!
//! **Initialisation**: `ncclCommInitRank` returns only when every rank of the id has called it.
//! With ranks as threads of one process (one GPU each), each thread makes its own
//! [`CudaBackend`] and calls [`NcclComm::init`] (or [`NcclComm::new`] with the shared id)
//! concurrently with the others; called one after another from a single thread it would wait
//! forever on real NCCL (a single thread driving several GPUs would have to wrap the calls in
//! `ncclGroupStart`/`ncclGroupEnd` around them; this module groups only one rank's own sends
//! and receives). Real NCCL refuses two ranks on
//! one GPU ("Duplicate GPU detected"); the emulated device allows it.
//!
//! **Numbers**: gathers and broadcasts are exact. Tensor-parallel sums ([`Communicator::
//! all_reduce_sum`], [`Communicator::reduce_scatter_rows`]) are in the canonical order (DESIGN.md
//! decision 10): element i is `x_0[i] + x_1[i] + ... + x_{n-1}[i]` in rank order, in fp32 (bf16
//! inputs widened exactly), rounded once to the tensor's dtype; the same arithmetic for the
//! all-reduce and the reduce-scatter and for every message size, so an element of an all-reduce
//! equals the same element of a reduce-scatter of the same data, and bitwise what the CPU
//! backend's host path computes ([`Collectives`]' rank-order sums over `LocalComm`). They do not
//! use `ncclAllReduce` / `ncclReduceScatter`, whose order is NCCL's (ring or tree, chunked by
//! message size, bf16 partial sums rounded to bf16); `ordered.rs` says how and what it costs. Only
//! [`Communicator::all_reduce_sum_any_order`] (data-parallel gradients) is `ncclAllReduce`: the
//! same bits on every rank, not the rank-order sum; against it an element over `n` ranks differs
//! by at most about `2 (n - 1) 2^-24 Σ|x_r|` (f32) or `n 2^-8 Σ|x_r|` (bf16). The emulated libnccl
//! (`emu/nccl.cpp`) models that order (a ring, bf16 partial sums rounded), so the difference
//! shows in tests at 3 ranks and more (at 2, `x_0 + x_1 == x_1 + x_0`: any order, the same bits).
//! With one rank every collective is a copy, exact.
//!
//! **The library** is opened at run time, like libcuda (`library.rs`): `libnccl.so.2`, else
//! `libnccl.so`; in an emulated build the stand-in libnccl. A missing library is an error from
//! [`probe`] and [`NcclComm::new`] ([`NOT_FOUND`]), never a panic.

mod library;
mod ordered;

pub use library::{probe, NcclId, NOT_FOUND};

use super::{check_rows_scale, Collectives, Communicator};
use crate::backend::cuda::{CudaBackend, CudaTensor, DeviceDType};
use anyhow::{anyhow, bail, ensure, Context, Result};
use cudarc::driver::sys::{CUdeviceptr, CUmemorytype, CUstream, CUDA_MEMCPY2D};
use cudarc::driver::{CudaContext, CudaStream, DevicePtr, DevicePtrMut};
use cudarc::nccl::sys::{ncclComm_t, ncclDataType_t, ncclRedOp_t};
use library::{error_string, last_error, library, result_name, Library, NcclResult, Stream};
use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex, MutexGuard};

/// An `ncclComm_t`, used under [`NcclComm`]'s lock only.
struct RawComm(ncclComm_t);
// SAFETY: NCCL communicators may be used from any thread, one call at a time (the lock).
unsafe impl Send for RawComm {}

/// One rank's NCCL communicator, on one GPU (the [`CudaBackend`] it was made with). Calls on it
/// are serialised; every rank must make the same calls in the same order.
pub struct NcclComm {
    lib: &'static Library,
    comm: Mutex<RawComm>,
    rank: usize,
    size: usize,
    ordinal: usize,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// The ordered sums' device scratch (`ordered.rs`).
    scratch: Mutex<ordered::Scratch>,
}

fn nccl_type(dtype: DeviceDType) -> ncclDataType_t {
    match dtype {
        DeviceDType::Bf16 => ncclDataType_t::ncclBfloat16,
        DeviceDType::F32 => ncclDataType_t::ncclFloat32,
        DeviceDType::F64 => ncclDataType_t::ncclFloat64,
        DeviceDType::U32 => ncclDataType_t::ncclUint32,
        DeviceDType::I32 => ncclDataType_t::ncclInt32,
    }
}

impl NcclComm {
    /// Rank `rank` of `size`, on `backend`'s GPU, joining the communicator of `id`. Returns when
    /// every rank has joined: call it on every rank concurrently (see the module doc).
    pub fn new(backend: &CudaBackend, id: &NcclId, rank: usize, size: usize) -> Result<Self> {
        ensure!(
            rank < size && size <= c_int::MAX as usize,
            "NCCL init: rank {rank} of {size}"
        );
        let lib = library()?;
        let device = &backend.device;
        device
            .ctx
            .bind_to_thread()
            .context("NCCL init: binding the CUDA context")?;
        let mut comm: ncclComm_t = std::ptr::null_mut();
        // SAFETY: NCCL writes the handle; the id is passed by value.
        let r = unsafe { (lib.comm_init_rank)(&mut comm, size as c_int, id.0, rank as c_int) };
        if r != 0 {
            bail!(
                "ncclCommInitRank (rank {rank} of {size}, {}): {}: {}",
                device.describe(),
                result_name(r),
                last_error(lib, comm)
            );
        }
        let this = Self {
            lib,
            comm: Mutex::new(RawComm(comm)),
            rank,
            size,
            ordinal: device.ordinal,
            ctx: device.ctx.clone(),
            stream: device.stream.clone(),
            scratch: Mutex::default(),
        };
        let (mut count, mut user_rank) = (0, 0);
        {
            let guard = this.lock();
            // SAFETY: the live communicator; each writes one int.
            this.check(
                unsafe { (lib.comm_count)(guard.0, &mut count) },
                &guard,
                || "ncclCommCount".into(),
            )?;
            this.check(
                unsafe { (lib.comm_user_rank)(guard.0, &mut user_rank) },
                &guard,
                || "ncclCommUserRank".into(),
            )?;
        }
        ensure!(
            count as usize == size && user_rank as usize == rank,
            "NCCL init: asked for rank {rank} of {size}, NCCL says rank {user_rank} of {count}"
        );
        Ok(this)
    }

    /// [`NcclComm::new`] with the group of `host`: rank 0 draws the id and sends it to the others
    /// through `host` (an in-process [`super::local::LocalComm`], the TCP rendezvous, ...); every
    /// rank takes `host`'s rank and size. Call it on every rank concurrently.
    pub fn init(backend: &CudaBackend, host: &dyn Collectives) -> Result<Self> {
        let (rank, size) = (host.rank(), host.size());
        // Rank 0 sends an empty message when it cannot draw an id, so the others fail too
        // instead of waiting for it.
        let (mut bytes, drawn) = if rank == 0 {
            match NcclId::new() {
                Ok(id) => (id.to_bytes(), Ok(())),
                Err(e) => (Vec::new(), Err(e)),
            }
        } else {
            (Vec::new(), Ok(()))
        };
        host.broadcast_bytes(&mut bytes, 0)
            .with_context(|| format!("NCCL init: sending the id to rank {rank} of {size}"))?;
        drawn?;
        ensure!(
            !bytes.is_empty(),
            "NCCL init (rank {rank} of {size}): rank 0 could not draw an NCCL id"
        );
        Self::new(backend, &NcclId::from_bytes(&bytes)?, rank, size)
    }

    fn lock(&self) -> MutexGuard<'_, RawComm> {
        // A panic while holding the lock leaves nothing half-done on the host side.
        self.comm.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn check(&self, code: NcclResult, comm: &RawComm, what: impl FnOnce() -> String) -> Result<()> {
        if code == 0 {
            return Ok(());
        }
        bail!(
            "{} (rank {} of {}, cuda:{}): {} ({}): {}",
            what(),
            self.rank,
            self.size,
            self.ordinal,
            result_name(code),
            error_string(self.lib, code),
            last_error(self.lib, comm.0)
        )
    }

    /// The stream and checks of a tensor collective on `backend`.
    fn stream_of(&self, backend: &CudaBackend, what: &str) -> Result<Stream> {
        ensure!(
            backend.device.ordinal == self.ordinal,
            "NCCL {what} (rank {} of {}): the tensors are on {} but the communicator on cuda:{}",
            self.rank,
            self.size,
            backend.device.describe(),
            self.ordinal
        );
        backend
            .device
            .ctx
            .bind_to_thread()
            .with_context(|| format!("NCCL {what}: binding the CUDA context"))?;
        Ok(backend.device.stream.cu_stream() as Stream)
    }

    /// `bytes` from every rank, `bytes.len()` each, in rank order (through a device buffer).
    fn gather_equal(&self, bytes: &[u8]) -> Result<Vec<u8>> {
        let stream = &self.stream;
        let what = || format!("NCCL all-gather of {} host bytes", bytes.len());
        self.ctx.bind_to_thread().with_context(what)?;
        let send = stream.clone_htod(bytes).with_context(what)?;
        let mut recv = stream
            .alloc_zeros::<u8>(bytes.len() * self.size)
            .with_context(what)?;
        {
            let guard = self.lock();
            let (s, _s) = send.device_ptr(stream);
            let (r, _r) = recv.device_ptr_mut(stream);
            // SAFETY: `send` holds `bytes.len()` bytes and `recv` `size` times as many.
            let code = unsafe {
                (self.lib.all_gather)(
                    s as *const c_void,
                    r as *mut c_void,
                    bytes.len(),
                    ncclDataType_t::ncclUint8,
                    guard.0,
                    stream.cu_stream() as Stream,
                )
            };
            self.check(code, &guard, what)?;
        }
        let out = stream.clone_dtoh(&recv).with_context(what)?;
        stream.synchronize().with_context(what)?;
        Ok(out)
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        let comm = self.comm.get_mut().unwrap_or_else(|e| e.into_inner());
        if comm.0.is_null() {
            return;
        }
        let _ = self.ctx.bind_to_thread();
        // A rank unwinding from a failure aborts (no waiting on its pending work); otherwise
        // destroy, which finishes this rank's queued collectives first.
        // SAFETY: the live communicator, used by no one else (we own it).
        unsafe {
            if std::thread::panicking() {
                (self.lib.comm_abort)(comm.0);
            } else {
                (self.lib.comm_destroy)(comm.0);
            }
        }
        comm.0 = std::ptr::null_mut();
    }
}

impl Collectives for NcclComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    /// Two all-gathers on the device: every rank's length, then every rank's bytes padded to the
    /// longest.
    fn all_gather_bytes(&self, local: &[u8]) -> Result<Vec<Vec<u8>>> {
        let lengths = self.gather_equal(&(local.len() as u64).to_le_bytes())?;
        let lengths: Vec<usize> = lengths
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")) as usize)
            .collect();
        let longest = lengths.iter().copied().max().unwrap_or(0);
        if longest == 0 {
            return Ok(vec![Vec::new(); self.size]);
        }
        let mut padded = local.to_vec();
        padded.resize(longest, 0);
        let all = self.gather_equal(&padded)?;
        Ok(lengths
            .iter()
            .enumerate()
            .map(|(r, &len)| all[r * longest..][..len].to_vec())
            .collect())
    }
}

/// `height` rows of `width` bytes from `src` (rows `src_pitch` apart) to `dst` (rows
/// `dst_pitch` apart), on `stream`.
///
/// # Safety
/// Both extents must lie in live device memory.
unsafe fn copy_2d(
    stream: Stream,
    dst: CUdeviceptr,
    dst_pitch: usize,
    src: CUdeviceptr,
    src_pitch: usize,
    width: usize,
    height: usize,
) -> Result<()> {
    if width == 0 || height == 0 {
        return Ok(());
    }
    let copy = CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: CUmemorytype::CU_MEMORYTYPE_DEVICE,
        srcHost: std::ptr::null(),
        srcDevice: src,
        srcArray: std::ptr::null_mut(),
        srcPitch: src_pitch,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: CUmemorytype::CU_MEMORYTYPE_DEVICE,
        dstHost: std::ptr::null_mut(),
        dstDevice: dst,
        dstArray: std::ptr::null_mut(),
        dstPitch: dst_pitch,
        WidthInBytes: width,
        Height: height,
    };
    cudarc::driver::sys::cuMemcpy2DAsync_v2(&copy, stream as CUstream)
        .result()
        .map_err(|e| anyhow!("cuMemcpy2DAsync of {height} rows of {width} bytes: {e:?}"))
}

fn describe(t: &CudaTensor) -> String {
    format!("{:?} {:?}", t.shape(), t.dtype())
}

impl NcclComm {
    /// Checks a sum's dtype.
    fn summable(&self, what: &str, t: &CudaTensor) -> Result<()> {
        ensure!(
            matches!(t.dtype(), DeviceDType::Bf16 | DeviceDType::F32),
            "NCCL {what} (rank {} of {}): sums bf16 or f32 tensors, not {}",
            self.rank,
            self.size,
            describe(t)
        );
        Ok(())
    }

    fn same_dtype(&self, what: &str, a: &CudaTensor, b: &CudaTensor) -> Result<()> {
        ensure!(
            a.dtype() == b.dtype(),
            "NCCL {what} (rank {} of {}): {} into {}",
            self.rank,
            self.size,
            describe(a),
            describe(b)
        );
        Ok(())
    }
}

impl Communicator<CudaBackend> for NcclComm {
    /// The ordered all-reduce (`ordered.rs`): rank order, fp32, one rounding.
    fn all_reduce_sum(&self, backend: &CudaBackend, x: &mut CudaTensor) -> Result<()> {
        self.summable("all-reduce", x)?;
        if self.size == 1 {
            return self.stream_of(backend, "all-reduce").map(drop);
        }
        self.ordered_all_reduce(backend, x)
    }

    /// `ncclAllReduce` (ring or tree order): the data-parallel gradient sums, where the same
    /// bits on every rank is all that matters and a scratch the size of the gradients would not be.
    fn all_reduce_sum_any_order(&self, backend: &CudaBackend, x: &mut CudaTensor) -> Result<()> {
        self.summable("all-reduce", x)?;
        let stream = self.stream_of(backend, "all-reduce")?;
        if x.is_empty() {
            return Ok(());
        }
        let guard = self.lock();
        // SAFETY: in place over the tensor's own elements.
        let code = unsafe {
            (self.lib.all_reduce)(
                x.ptr() as *const c_void,
                x.ptr() as *mut c_void,
                x.len(),
                nccl_type(x.dtype()),
                ncclRedOp_t::ncclSum,
                guard.0,
                stream,
            )
        };
        self.check(code, &guard, || format!("ncclAllReduce of {}", describe(x)))
    }

    fn all_gather_rows(
        &self,
        backend: &CudaBackend,
        local: &CudaTensor,
        out: &mut CudaTensor,
    ) -> Result<()> {
        check_rows_scale(out.shape(), local.shape(), self.size, "NCCL all-gather")?;
        self.same_dtype("all-gather", local, out)?;
        let stream = self.stream_of(backend, "all-gather")?;
        if local.is_empty() {
            return Ok(());
        }
        let guard = self.lock();
        // SAFETY: `out` holds `size` times `local`'s elements (checked above).
        let code = unsafe {
            (self.lib.all_gather)(
                local.ptr() as *const c_void,
                out.ptr() as *mut c_void,
                local.len(),
                nccl_type(local.dtype()),
                guard.0,
                stream,
            )
        };
        self.check(code, &guard, || {
            format!(
                "ncclAllGather of {} into {}",
                describe(local),
                describe(out)
            )
        })
    }

    fn reduce_scatter_rows(
        &self,
        backend: &CudaBackend,
        full: &CudaTensor,
        out: &mut CudaTensor,
    ) -> Result<()> {
        check_rows_scale(full.shape(), out.shape(), self.size, "NCCL reduce-scatter")?;
        self.same_dtype("reduce-scatter", full, out)?;
        self.summable("reduce-scatter", full)?;
        self.ordered_reduce_scatter(backend, full, out)
    }

    fn all_gather_columns(
        &self,
        backend: &CudaBackend,
        local: &CudaTensor,
        widths: &[usize],
        out: &mut CudaTensor,
    ) -> Result<()> {
        let (local_shape, out_shape) = (local.shape(), out.shape());
        let total: usize = widths.iter().sum();
        ensure!(
            widths.len() == self.size
                && local_shape.len() == 2
                && out_shape.len() == 2
                && local_shape[0] == out_shape[0]
                && local_shape[1] == widths[self.rank]
                && out_shape[1] == total,
            "NCCL all-gather of columns (rank {} of {}): local {local_shape:?}, out {out_shape:?}, \
             widths {widths:?}",
            self.rank,
            self.size
        );
        self.same_dtype("all-gather of columns", local, out)?;
        let stream = self.stream_of(backend, "all-gather of columns")?;
        let (rows, es) = (local_shape[0], local.dtype().size());
        let widest = widths.iter().copied().max().unwrap_or(0);
        if rows == 0 || widest == 0 {
            return Ok(());
        }
        let what = || {
            format!(
                "NCCL all-gather of columns {} into {} (widths {widths:?})",
                describe(local),
                describe(out)
            )
        };
        // This rank's block padded to the widest: [rows, widest] (the padding is never read back).
        let padded = if widths[self.rank] == widest {
            None
        } else {
            let p = backend.alloc(&[rows, widest], local.dtype())?;
            // SAFETY: `local` is [rows, width], `p` [rows, widest] with widest > width.
            unsafe {
                copy_2d(
                    stream,
                    p.ptr(),
                    widest * es,
                    local.ptr(),
                    widths[self.rank] * es,
                    widths[self.rank] * es,
                    rows,
                )
            }
            .with_context(what)?;
            Some(p)
        };
        let send = padded.as_ref().map_or(local.ptr(), |p| p.ptr());
        let gathered = backend.alloc(&[self.size * rows, widest], local.dtype())?;
        {
            let guard = self.lock();
            // SAFETY: `send` holds rows * widest elements, `gathered` size times as many.
            let code = unsafe {
                (self.lib.all_gather)(
                    send as *const c_void,
                    gathered.ptr() as *mut c_void,
                    rows * widest,
                    nccl_type(local.dtype()),
                    guard.0,
                    stream,
                )
            };
            self.check(code, &guard, what)?;
        }
        let mut column = 0;
        for (r, &width) in widths.iter().enumerate() {
            // SAFETY: rank r's block [rows, widest] of `gathered` -> columns column..column+width
            // of `out` [rows, total].
            unsafe {
                copy_2d(
                    stream,
                    out.ptr() + (column * es) as u64,
                    total * es,
                    gathered.ptr() + (r * rows * widest * es) as u64,
                    widest * es,
                    width * es,
                    rows,
                )
            }
            .with_context(what)?;
            column += width;
        }
        Ok(())
    }

    fn broadcast(&self, backend: &CudaBackend, x: &mut CudaTensor, root: usize) -> Result<()> {
        ensure!(
            root < self.size,
            "NCCL broadcast from rank {root} of {}",
            self.size
        );
        let stream = self.stream_of(backend, "broadcast")?;
        if x.is_empty() {
            return Ok(());
        }
        let guard = self.lock();
        // SAFETY: in place over the tensor's own elements.
        let code = unsafe {
            (self.lib.broadcast)(
                x.ptr() as *const c_void,
                x.ptr() as *mut c_void,
                x.len(),
                nccl_type(x.dtype()),
                root as c_int,
                guard.0,
                stream,
            )
        };
        self.check(code, &guard, || {
            format!("ncclBroadcast of {} from rank {root}", describe(x))
        })
    }
}
