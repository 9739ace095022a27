//! Opening libnccl at run time and what needs only the library: [`probe`], [`NcclId`], the
//! result codes and error texts. `libnccl.so.2` (the file NCCL's packages and the
//! `nvidia-nccl-cu13` wheel ship), else `libnccl.so`; in an emulated build the stand-in libnccl
//! (`emu/nccl.cpp`). cudarc's `nccl` module gives the types, but its loader is not used: it looks
//! only for other file names (`libnccl.so`, `libnccl.so.13`, ...) and panics when none opens.

use crate::backend::cuda;
use anyhow::{anyhow, bail, ensure, Result};
use cudarc::nccl::sys::{ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclUniqueId};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::OnceLock;

/// What [`probe`] and [`super::NcclComm::new`] say when no libnccl opens (followed by the loader's
/// reasons).
pub const NOT_FOUND: &str =
    "NCCL (libnccl.so.2) not found: install nvidia-nccl-cu13 or set LD_LIBRARY_PATH";

/// The file names tried, in order, outside an emulated build.
const LIBRARY_NAMES: [&str; 2] = ["libnccl.so.2", "libnccl.so"];

/// An `ncclResult_t`, read as an integer: newer NCCL versions add codes.
pub(super) type NcclResult = c_int;
pub(super) type Stream = *mut c_void;

/// The entry points swerve calls, resolved once when the library opens.
pub(super) struct Library {
    pub(super) path: String,
    pub(super) get_version: unsafe extern "C" fn(*mut c_int) -> NcclResult,
    pub(super) get_unique_id: unsafe extern "C" fn(*mut ncclUniqueId) -> NcclResult,
    pub(super) comm_init_rank:
        unsafe extern "C" fn(*mut ncclComm_t, c_int, ncclUniqueId, c_int) -> NcclResult,
    pub(super) comm_destroy: unsafe extern "C" fn(ncclComm_t) -> NcclResult,
    pub(super) comm_abort: unsafe extern "C" fn(ncclComm_t) -> NcclResult,
    pub(super) comm_count: unsafe extern "C" fn(ncclComm_t, *mut c_int) -> NcclResult,
    pub(super) comm_user_rank: unsafe extern "C" fn(ncclComm_t, *mut c_int) -> NcclResult,
    pub(super) all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        ncclDataType_t,
        ncclRedOp_t,
        ncclComm_t,
        Stream,
    ) -> NcclResult,
    pub(super) all_gather: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        ncclDataType_t,
        ncclComm_t,
        Stream,
    ) -> NcclResult,
    pub(super) broadcast: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        ncclDataType_t,
        c_int,
        ncclComm_t,
        Stream,
    ) -> NcclResult,
    pub(super) send: unsafe extern "C" fn(
        *const c_void,
        usize,
        ncclDataType_t,
        c_int,
        ncclComm_t,
        Stream,
    ) -> NcclResult,
    pub(super) recv: unsafe extern "C" fn(
        *mut c_void,
        usize,
        ncclDataType_t,
        c_int,
        ncclComm_t,
        Stream,
    ) -> NcclResult,
    pub(super) group_start: unsafe extern "C" fn() -> NcclResult,
    pub(super) group_end: unsafe extern "C" fn() -> NcclResult,
    pub(super) get_error_string: unsafe extern "C" fn(NcclResult) -> *const c_char,
    pub(super) get_last_error: unsafe extern "C" fn(ncclComm_t) -> *const c_char,
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
            broadcast: function(handle, name, "ncclBroadcast")?,
            send: function(handle, name, "ncclSend")?,
            recv: function(handle, name, "ncclRecv")?,
            group_start: function(handle, name, "ncclGroupStart")?,
            group_end: function(handle, name, "ncclGroupEnd")?,
            get_error_string: function(handle, name, "ncclGetErrorString")?,
            get_last_error: function(handle, name, "ncclGetLastError")?,
        })
    }
}

/// The library, opened once: the emulator's stand-in in an emulated build (after the stand-in
/// libcuda it needs), else [`LIBRARY_NAMES`].
pub(super) fn library() -> Result<&'static Library> {
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

pub(super) fn result_name(code: NcclResult) -> String {
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
pub struct NcclId(pub(super) ncclUniqueId);

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

pub(super) fn last_error(lib: &Library, comm: ncclComm_t) -> String {
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

pub(super) fn error_string(lib: &Library, code: NcclResult) -> String {
    // SAFETY: returns a static C string (or null).
    let p = unsafe { (lib.get_error_string)(code) };
    if p.is_null() {
        return String::new();
    }
    // SAFETY: a NUL-terminated string from NCCL.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
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
