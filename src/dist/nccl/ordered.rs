//! The ordered sums of [`super::NcclComm`]: an all-reduce and a reduce-scatter whose every
//! element is `x_0 + x_1 + ... + x_{n-1}` in rank order, in fp32, rounded once to the tensor's
//! dtype, whatever the message size and whichever of the two collectives asks (DESIGN.md
//! decision 10). NCCL's own `ncclAllReduce` / `ncclReduceScatter` promise no order (ring or
//! tree, chunked by message size, bf16 partial sums rounded to bf16), so they are not used for
//! tensor-parallel sums.
//!
//! ```text
//!  rank r's message x [n slices of s]          s = ceil(count / n) (the last slice may be short)
//!   ncclGroupStart
//!     ncclSend slice p of x ─► rank p           ncclRecv rank p's slice r ─► partials[p]
//!   ncclGroupEnd                               (an all-to-all, self included; empty slices skip)
//!   rank_sum kernel: partials [n, s] ─► Σ_p partials[p] in rank order, fp32, one rounding
//!   reduce-scatter: into `out` (s = out's length)           done
//!   all-reduce: into slice r of x (count % n == 0; then ncclAllGather in place), else into
//!               slice r of a padded [n * s] buffer, ncclAllGather there, copy count back to x
//! ```
//!
//! **Cost** against `ncclAllReduce` (ring): the same bytes on the wire per rank, `2 (n - 1) / n`
//! of the message (the all-to-all's `(n - 1) / n`, then the all-gather's), plus one small kernel
//! that reads the `n` partial slices once and writes one slice, and a copy of the message when
//! `count % n != 0`. The reduce-scatter moves what `ncclReduceScatter` moves, `(n - 1) / n` of
//! the full message, plus the kernel.
//!
//! **Scratch**: one device buffer per communicator, grown and never shrunk: `n * s` elements of
//! the dtype (the message rounded up to `n` slices) for an all-reduce, twice that when `count %
//! n != 0` (the padded gather buffer), the full input for a reduce-scatter; the largest of these
//! over the communicator's life. Growing it inside a CUDA-graph capture is an error (the capture
//! then fails and the step runs eagerly; the engine's eager warm-up before each capture sizes it).
//! A buffer that a capture used is kept, not freed, when the scratch grows: a graph bakes its
//! address in.

use super::{describe, nccl_type, NcclComm};
use crate::backend::cuda::{CudaBackend, CudaTensor};
use anyhow::{anyhow, ensure, Context, Result};
use cudarc::driver::sys::{CUdeviceptr, CUstreamCaptureStatus};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use std::ffi::c_void;
use std::sync::Arc;

/// The ordered sums' device scratch (see the module doc).
#[derive(Default)]
pub(super) struct Scratch {
    /// The buffer and its address (taken once, outside any capture: cudarc's per-use event
    /// records stay out of graphs).
    buffer: Option<(CudaSlice<u8>, CUdeviceptr)>,
    /// `buffer` was used while its stream captured a graph.
    captured: bool,
    /// Outgrown buffers some capture used: alive as long as the communicator.
    retired: Vec<CudaSlice<u8>>,
}

fn capturing(stream: &CudaStream) -> Result<bool> {
    let status = stream
        .capture_status()
        .map_err(|e| anyhow!("asking whether the stream captures a graph: {e:?}"))?;
    Ok(status != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

impl Scratch {
    /// At least `bytes` of device memory on `stream`, for the collective `what`.
    fn reserve(
        &mut self,
        stream: &Arc<CudaStream>,
        bytes: usize,
        what: &str,
    ) -> Result<CUdeviceptr> {
        let in_capture = capturing(stream)?;
        let held = self.buffer.as_ref().map_or(0, |(b, _)| b.len());
        if held < bytes {
            ensure!(
                !in_capture,
                "{what}: its scratch would grow from {held} to {bytes} bytes inside a CUDA graph \
                 capture (run the same step eagerly first)"
            );
            let grown = stream
                .alloc_zeros::<u8>(bytes.max(held.saturating_mul(2)))
                .with_context(|| format!("{what}: allocating {bytes} bytes of scratch"))?;
            let ptr = grown.device_ptr(stream).0;
            if let Some((old, _)) = self.buffer.replace((grown, ptr)) {
                if self.captured {
                    self.retired.push(old);
                }
            }
            self.captured = false;
        }
        self.captured |= in_capture;
        Ok(self.buffer.as_ref().expect("reserved above").1)
    }
}

/// Elements of slice `p` when `count` elements are cut into slices of `s`.
fn slice_len(count: usize, s: usize, p: usize) -> usize {
    count.saturating_sub(p * s).min(s)
}

impl NcclComm {
    /// The ordered all-reduce of `x` in place (see the module doc).
    pub(super) fn ordered_all_reduce(
        &self,
        backend: &CudaBackend,
        x: &mut CudaTensor,
    ) -> Result<()> {
        let what = format!("NCCL ordered all-reduce of {}", describe(x));
        let stream = self.stream_of(backend, "all-reduce")?;
        let (n, count, es, dtype) = (self.size, x.len(), x.dtype().size(), x.dtype());
        if count == 0 {
            return Ok(());
        }
        let s = count.div_ceil(n);
        let padded = count % n != 0;
        let mut scratch = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let base = scratch.reserve(&self.stream, n * s * es * (1 + padded as usize), &what)?;
        let partials = base;
        let gathered = if padded {
            base + (n * s * es) as u64
        } else {
            x.ptr()
        };
        let mine = gathered + (self.rank * s * es) as u64;
        // SAFETY: `x` holds `count` elements cut into slices of `s`; `partials` n * s elements;
        // `gathered` n * s elements (x itself when count == n * s).
        unsafe {
            self.exchange_slices(stream, x.ptr(), partials, count, s, x, &what)?;
            backend.device.rank_sum_raw(
                mine,
                partials,
                dtype,
                n,
                s,
                slice_len(count, s, self.rank),
            )?;
        }
        let guard = self.lock();
        // SAFETY: `mine` is slice `rank` of `gathered` (NCCL's in-place all-gather).
        let code = unsafe {
            (self.lib.all_gather)(
                mine as *const c_void,
                gathered as *mut c_void,
                s,
                nccl_type(dtype),
                guard.0,
                stream,
            )
        };
        self.check(code, &guard, || format!("{what}: ncclAllGather"))?;
        drop(guard);
        if padded {
            let copied = unsafe {
                cudarc::driver::sys::cuMemcpyDtoDAsync_v2(
                    x.ptr(),
                    gathered,
                    count * es,
                    stream as _,
                )
            };
            copied
                .result()
                .map_err(|e| anyhow!("{what}: copying the sum back: {e:?}"))?;
        }
        Ok(())
    }

    /// The ordered reduce-scatter: `out` = this rank's slice of `full` summed over the ranks
    /// (shapes and dtypes checked by the caller).
    pub(super) fn ordered_reduce_scatter(
        &self,
        backend: &CudaBackend,
        full: &CudaTensor,
        out: &mut CudaTensor,
    ) -> Result<()> {
        let what = format!(
            "NCCL ordered reduce-scatter of {} into {}",
            describe(full),
            describe(out)
        );
        let stream = self.stream_of(backend, "reduce-scatter")?;
        let (n, s, es) = (self.size, out.len(), out.dtype().size());
        if s == 0 {
            return Ok(());
        }
        let mut scratch = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let partials = scratch.reserve(&self.stream, n * s * es, &what)?;
        // SAFETY: `full` holds n * s elements, `partials` as many, `out` s.
        unsafe {
            self.exchange_slices(stream, full.ptr(), partials, n * s, s, full, &what)?;
            backend
                .device
                .rank_sum_raw(out.ptr(), partials, out.dtype(), n, s, s)
        }
    }

    /// The all-to-all: slice p of `send` (`count` elements in slices of `s`) to rank p, rank p's
    /// slice `rank` into row p of `partials` [n, s], in one NCCL group.
    ///
    /// # Safety
    /// `send` must hold `count` elements of `like`'s dtype and `partials` `n * s`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn exchange_slices(
        &self,
        stream: super::Stream,
        send: CUdeviceptr,
        partials: CUdeviceptr,
        count: usize,
        s: usize,
        like: &CudaTensor,
        what: &str,
    ) -> Result<()> {
        let (es, ty) = (like.dtype().size(), nccl_type(like.dtype()));
        let mine = slice_len(count, s, self.rank);
        let guard = self.lock();
        self.check((self.lib.group_start)(), &guard, || {
            format!("{what}: ncclGroupStart")
        })?;
        // Every call of the group is made even after a failure, so ncclGroupEnd closes it.
        let mut first_error = Ok(());
        for p in 0..self.size {
            let offset = (p * s * es) as u64;
            let calls = [
                ("ncclSend", "to", slice_len(count, s, p), send + offset),
                ("ncclRecv", "from", mine, partials + offset),
            ];
            for (name, direction, n, at) in calls {
                if n == 0 {
                    continue;
                }
                let code = match name {
                    "ncclSend" => {
                        (self.lib.send)(at as *const c_void, n, ty, p as _, guard.0, stream)
                    }
                    _ => (self.lib.recv)(at as *mut c_void, n, ty, p as _, guard.0, stream),
                };
                let r = self.check(code, &guard, || {
                    format!("{what}: {name} of {n} {direction} rank {p}")
                });
                first_error = first_error.and(r);
            }
        }
        let ended = self.check((self.lib.group_end)(), &guard, || {
            format!("{what}: ncclGroupEnd")
        });
        first_error.and(ended)
    }
}
