//! NCCL: collectives between GPUs (DESIGN.md decision 11). One [`NcclComm`] per GPU rank, made
//! from an id that rank 0 draws ([`NcclId::new`]) and every rank receives through a host
//! [`Collectives`] ([`NcclComm::init`]), then [`Communicator<CudaBackend>`] on the device: every
//! tensor collective is one NCCL call on the backend's stream (no host copy), and the host
//! [`Collectives`] go through a device buffer.
//!
//! ```text
//!  rank 0: NcclId::new ─► broadcast_bytes over LocalComm / TCP ─► every rank: ncclCommInitRank
//!  all_reduce_sum       ncclAllReduce (sum, in place; bf16 or f32)
//!  all_gather_rows      ncclAllGather          reduce_scatter_rows   ncclReduceScatter (sum)
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
//! `ncclGroupStart`/`ncclGroupEnd`, which this module does not do). Real NCCL refuses two ranks on
//! one GPU ("Duplicate GPU detected"); the emulated device allows it.
//!
//! **Numbers**: gathers and broadcasts are exact. Sums are in NCCL's ring or tree order, the same
//! bits on every rank but not the rank-order sum of [`Collectives`]' host path; bf16 partial sums
//! are rounded to bf16 along the way. Against the rank-order f32 sum rounded once, an element of a
//! sum over `n` ranks differs by at most about `2 (n - 1) 2^-24 Σ|x_r|` (f32) or `n 2^-8 Σ|x_r|`
//! (bf16). With one rank every collective is a copy, exact. The emulated libnccl (`emu/nccl.cpp`)
//! sums in rank order, in f32 with one final rounding, so there the two paths agree bit for bit.
//!
//! **The library** is opened at run time, like libcuda: `libnccl.so.2` (the file NCCL's packages
//! and the `nvidia-nccl-cu13` wheel ship), else `libnccl.so`; in an emulated build the stand-in
//! libnccl. cudarc's `nccl` module gives the types; its loader is not used, because it looks only
//! for other file names (`libnccl.so`, `libnccl.so.13`, ...) and panics when none opens. A missing
//! library is an error from [`probe`] and [`NcclComm::new`], never a panic.

use super::{check_rows_scale, Collectives, Communicator};
use crate::backend::cuda::{self, CudaBackend, CudaTensor, DeviceDType};
use anyhow::{anyhow, bail, ensure, Context, Result};
use cudarc::driver::sys::{CUdeviceptr, CUmemorytype, CUstream, CUDA_MEMCPY2D};
use cudarc::driver::{CudaContext, CudaStream, DevicePtr, DevicePtrMut};
use cudarc::nccl::sys::{ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclUniqueId};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// What [`probe`] and [`NcclComm::new`] say when no libnccl opens (followed by the loader's
/// reasons).
pub const NOT_FOUND: &str =
    "NCCL (libnccl.so.2) not found: install nvidia-nccl-cu13 or set LD_LIBRARY_PATH";

/// The file names tried, in order, outside an emulated build.
const LIBRARY_NAMES: [&str; 2] = ["libnccl.so.2", "libnccl.so"];

/// An `ncclResult_t`, read as an integer: newer NCCL versions add codes.
type NcclResult = c_int;
type Stream = *mut c_void;

/// The entry points swerve calls, resolved once when the library opens.
struct Library {
    path: String,
    get_version: unsafe extern "C" fn(*mut c_int) -> NcclResult,
    get_unique_id: unsafe extern "C" fn(*mut ncclUniqueId) -> NcclResult,
    comm_init_rank: unsafe extern "C" fn(*mut ncclComm_t, c_int, ncclUniqueId, c_int) -> NcclResult,
    comm_destroy: unsafe extern "C" fn(ncclComm_t) -> NcclResult,
    comm_abort: unsafe extern "C" fn(ncclComm_t) -> NcclResult,
    comm_count: unsafe extern "C" fn(ncclComm_t, *mut c_int) -> NcclResult,
    comm_user_rank: unsafe extern "C" fn(ncclComm_t, *mut c_int) -> NcclResult,
    all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        ncclDataType_t,
        ncclRedOp_t,
        ncclComm_t,
        Stream,
    ) -> NcclResult,
    all_gather: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        ncclDataType_t,
        ncclComm_t,
        Stream,
    ) -> NcclResult,
    reduce_scatter: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        ncclDataType_t,
        ncclRedOp_t,
        ncclComm_t,
        Stream,
    ) -> NcclResult,
    broadcast: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        ncclDataType_t,
        c_int,
        ncclComm_t,
        Stream,
    ) -> NcclResult,
    get_error_string: unsafe extern "C" fn(NcclResult) -> *const c_char,
    get_last_error: unsafe extern "C" fn(ncclComm_t) -> *const c_char,
}

/// The first of `names` that opens with every entry point, or why none did (the message starts
/// with [`NOT_FOUND`] when no file opened).
fn open_library(names: &[&str]) -> std::result::Result<Library, String> {
    let mut reasons = Vec::new();
    for name in names {
        let c_name = CString::new(*name).map_err(|e| e.to_string())?;
        // SAFETY: dlopen of a library name; the handle is kept for the life of the process.
        let handle = unsafe { libc::dlopen(c_name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            reasons.push(dlerror());
            continue;
        }
        return resolve(handle, name);
    }
    Err(format!("{NOT_FOUND} ({})", reasons.join("; ")))
}

fn dlerror() -> String {
    // SAFETY: dlerror returns a thread-local C string or null.
    unsafe {
        let e = libc::dlerror();
        if e.is_null() {
            "unknown dlopen error".to_string()
        } else {
            CStr::from_ptr(e).to_string_lossy().into_owned()
        }
    }
}

/// The address of `symbol` in the library `handle` (opened as `name`).
fn address(
    handle: *mut c_void,
    name: &str,
    symbol: &str,
) -> std::result::Result<*mut c_void, String> {
    let c_symbol = CString::new(symbol).expect("symbol names have no NUL");
    // SAFETY: dlsym on a handle dlopen returned.
    let p = unsafe { libc::dlsym(handle, c_symbol.as_ptr()) };
    if p.is_null() {
        Err(format!("{name} has no {symbol} (an NCCL older than 2.13?)"))
    } else {
        Ok(p)
    }
}

/// `symbol` as the function pointer type `F`.
///
/// # Safety
/// `F` must be an `unsafe extern "C" fn` with the symbol's C signature.
unsafe fn function<F: Copy>(
    handle: *mut c_void,
    name: &str,
    symbol: &str,
) -> std::result::Result<F, String> {
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    let p = address(handle, name, symbol)?;
    Ok(std::mem::transmute_copy::<*mut c_void, F>(&p))
}

fn resolve(handle: *mut c_void, name: &str) -> std::result::Result<Library, String> {
    let path = {
        let p = address(handle, name, "ncclGetVersion")?;
        // SAFETY: dladdr fills `info` for an address inside a loaded object.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        if unsafe { libc::dladdr(p, &mut info) } != 0 && !info.dli_fname.is_null() {
            // SAFETY: dli_fname is a C string owned by the loader.
            unsafe { CStr::from_ptr(info.dli_fname) }
                .to_string_lossy()
                .into_owned()
        } else {
            name.to_string()
        }
    };
    // SAFETY: each field's type spells out the C signature (nccl.h) of the NCCL function named.
    unsafe {
        Ok(Library {
            path,
            get_version: function(handle, name, "ncclGetVersion")?,
            get_unique_id: function(handle, name, "ncclGetUniqueId")?,
            comm_init_rank: function(handle, name, "ncclCommInitRank")?,
            comm_destroy: function(handle, name, "ncclCommDestroy")?,
            comm_abort: function(handle, name, "ncclCommAbort")?,
            comm_count: function(handle, name, "ncclCommCount")?,
            comm_user_rank: function(handle, name, "ncclCommUserRank")?,
            all_reduce: function(handle, name, "ncclAllReduce")?,
            all_gather: function(handle, name, "ncclAllGather")?,
            reduce_scatter: function(handle, name, "ncclReduceScatter")?,
            broadcast: function(handle, name, "ncclBroadcast")?,
            get_error_string: function(handle, name, "ncclGetErrorString")?,
            get_last_error: function(handle, name, "ncclGetLastError")?,
        })
    }
}

/// The library, opened once: the emulator's stand-in in an emulated build (after the stand-in
/// libcuda it needs), else [`LIBRARY_NAMES`].
fn library() -> Result<&'static Library> {
    static LIBRARY: OnceLock<std::result::Result<Library, String>> = OnceLock::new();
    LIBRARY
        .get_or_init(|| {
            if !cuda::is_emulated() {
                return open_library(&LIBRARY_NAMES);
            }
            if !cuda::driver_present() {
                return Err(
                    "the emulated CUDA libraries did not load (rebuild with SWERVE_EMU=1)".into(),
                );
            }
            let path = cuda::embedded::EMULATOR_LIBRARIES
                .iter()
                .find(|p| p.ends_with("/libnccl.so"))
                .ok_or("this emulated build has no stand-in libnccl")?;
            open_library(&[path])
        })
        .as_ref()
        .map_err(|e| anyhow!("{e}"))
}

/// `"NCCL 2.27.3 (/path/to/libnccl.so.2)"`, or why NCCL cannot be used here (no library: the
/// message starts with [`NOT_FOUND`]). Loads nothing but libnccl (and, in an emulated build, the
/// emulator's libraries): no GPU is needed.
pub fn probe() -> Result<String> {
    let lib = library()?;
    let mut code: c_int = 0;
    // SAFETY: writes one int.
    let r = unsafe { (lib.get_version)(&mut code) };
    ensure!(r == 0, "ncclGetVersion failed: {}", result_name(r));
    let (major, minor, patch) = if code >= 10000 {
        (code / 10000, code / 100 % 100, code % 100)
    } else {
        (code / 1000, code / 100 % 10, code % 100)
    };
    let emulated = if cuda::is_emulated() {
        ": swerve's emulated libnccl, ranks are threads of this process"
    } else {
        ""
    };
    Ok(format!(
        "NCCL {major}.{minor}.{patch} ({}{emulated})",
        lib.path
    ))
}

fn result_name(code: NcclResult) -> String {
    match code {
        0 => "ncclSuccess".into(),
        1 => "ncclUnhandledCudaError".into(),
        2 => "ncclSystemError".into(),
        3 => "ncclInternalError".into(),
        4 => "ncclInvalidArgument".into(),
        5 => "ncclInvalidUsage".into(),
        6 => "ncclRemoteError".into(),
        7 => "ncclInProgress".into(),
        other => format!("NCCL result {other}"),
    }
}

/// The 128-byte id every rank of one communicator initialises with.
#[derive(Clone, Copy)]
pub struct NcclId(ncclUniqueId);

impl NcclId {
    /// A fresh id (`ncclGetUniqueId`; on real NCCL, rank 0's bootstrap address).
    pub fn new() -> Result<Self> {
        let lib = library()?;
        let mut id = ncclUniqueId { internal: [0; 128] };
        // SAFETY: writes the 128-byte id.
        let r = unsafe { (lib.get_unique_id)(&mut id) };
        if r != 0 {
            bail!(
                "ncclGetUniqueId: {}: {}",
                result_name(r),
                last_error(lib, std::ptr::null_mut())
            );
        }
        Ok(Self(id))
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        self.0.internal.iter().map(|&c| c as u8).collect()
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        ensure!(
            bytes.len() == 128,
            "an NCCL id is 128 bytes, not {}",
            bytes.len()
        );
        let mut id = ncclUniqueId { internal: [0; 128] };
        for (d, &s) in id.internal.iter_mut().zip(bytes) {
            *d = s as c_char;
        }
        Ok(Self(id))
    }
}

fn last_error(lib: &Library, comm: ncclComm_t) -> String {
    // SAFETY: returns a C string owned by the library (or null).
    let p = unsafe { (lib.get_last_error)(comm) };
    let text = if p.is_null() {
        String::new()
    } else {
        // SAFETY: a NUL-terminated string from NCCL.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    };
    if text.is_empty() {
        "no further detail (NCCL_DEBUG=WARN prints NCCL's own)".into()
    } else {
        text
    }
}

fn error_string(lib: &Library, code: NcclResult) -> String {
    // SAFETY: returns a static C string (or null).
    let p = unsafe { (lib.get_error_string)(code) };
    if p.is_null() {
        return String::new();
    }
    // SAFETY: a NUL-terminated string from NCCL.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

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
    fn all_reduce_sum(&self, backend: &CudaBackend, x: &mut CudaTensor) -> Result<()> {
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
        let stream = self.stream_of(backend, "reduce-scatter")?;
        if out.is_empty() {
            return Ok(());
        }
        let guard = self.lock();
        // SAFETY: `full` holds `size` times `out`'s elements (checked above).
        let code = unsafe {
            (self.lib.reduce_scatter)(
                full.ptr() as *const c_void,
                out.ptr() as *mut c_void,
                out.len(),
                nccl_type(out.dtype()),
                ncclRedOp_t::ncclSum,
                guard.0,
                stream,
            )
        };
        self.check(code, &guard, || {
            format!(
                "ncclReduceScatter of {} into {}",
                describe(full),
                describe(out)
            )
        })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_an_error_naming_the_fix() {
        let Err(message) = open_library(&["libswerve-no-such-nccl.so.2"]) else {
            panic!("a library that does not exist opened");
        };
        assert!(message.starts_with(NOT_FOUND), "{message}");
        assert!(message.contains("libswerve-no-such-nccl.so.2"), "{message}");
    }

    #[test]
    fn ids_round_trip_through_bytes() {
        let bytes: Vec<u8> = (0..128).map(|i| (i * 7 + 3) as u8).collect();
        assert_eq!(NcclId::from_bytes(&bytes).unwrap().to_bytes(), bytes);
        assert!(NcclId::from_bytes(&bytes[..100]).is_err());
    }
}
