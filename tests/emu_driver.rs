//! The emulated CUDA driver (`emu/driver.cpp`, `SWERVE_EMU=1` builds only) refuses what the real
//! driver refuses, so the GPU suite run on it finds what a GPU would: capture on the legacy
//! stream, host copies and allocations inside a capture, dynamic shared memory without the
//! function attribute or above the architecture's opt-in limit, grid and block limits, and
//! kernels touching device memory out of bounds or after it was freed. Graph replay runs the
//! recorded launches with their recorded arguments on the memory as it is at replay time.
//!
//! Cases that end the process (a kernel faulting on a guard page) run in a child process: the test
//! executable re-runs itself with `SWERVE_EMU_DRIVER_CHILD` naming the case.
#![cfg(swerve_emu)]

use cudarc::driver::result::DriverError;
use cudarc::driver::sys::{
    CUfunction_attribute, CUgraphInstantiate_flags, CUresult, CUstreamCaptureMode,
};
use cudarc::driver::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use half::bf16;
use std::process::Command;
use std::sync::Arc;
use swerve::backend::cuda::CudaDevice;

const CHILD: &str = "SWERVE_EMU_DRIVER_CHILD";

fn device() -> CudaDevice {
    CudaDevice::open(0).expect("the emulated device opens in a SWERVE_EMU=1 build")
}

fn code(result: Result<(), DriverError>) -> CUresult {
    match result {
        Ok(()) => CUresult::CUDA_SUCCESS,
        Err(e) => e.0,
    }
}

fn config(blocks: u32, threads: u32, smem: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: smem,
    }
}

/// `convert_f32_to_bf16(out, in, n)` with raw device pointers.
fn convert(
    stream: &Arc<CudaStream>,
    f: &CudaFunction,
    out: u64,
    input: u64,
    n: i64,
    cfg: LaunchConfig,
) -> Result<(), DriverError> {
    let mut launch = stream.launch_builder(f);
    launch.arg(&out).arg(&input).arg(&n);
    // SAFETY: the kernel's signature; the cases choose the pointers on purpose.
    unsafe { launch.launch(cfg) }.map(|_| ())
}

fn alloc_f32(dev: &CudaDevice, values: &[f32]) -> cudarc::driver::CudaSlice<f32> {
    dev.stream.clone_htod(values).unwrap()
}

fn ptr<T>(dev: &CudaDevice, slice: &cudarc::driver::CudaSlice<T>) -> u64 {
    use cudarc::driver::DevicePtr;
    let (p, _sync) = slice.device_ptr(&dev.stream);
    p
}

#[test]
fn capture_is_refused_on_the_legacy_stream_and_allowed_on_a_created_one() {
    let dev = device();
    let legacy = dev.ctx.default_stream();
    let refused = legacy.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED);
    assert_eq!(
        code(refused),
        CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
    );
    dev.stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
        .unwrap();
    let graph = dev.stream.end_capture(CUgraphInstantiate_flags(0)).unwrap();
    assert!(graph.is_some(), "an empty capture still makes a graph");
}

#[test]
fn a_replay_runs_the_recorded_launch_on_the_memory_of_replay_time() {
    let dev = device();
    let f = dev.function("convert", "convert_f32_to_bf16").unwrap();
    let input = alloc_f32(&dev, &[1.0, 2.0, 3.0, 4.0]);
    let out = dev.stream.alloc_zeros::<u16>(4).unwrap();
    let (pi, po) = (ptr(&dev, &input), ptr(&dev, &out));
    dev.stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
        .unwrap();
    let mut n = 4i64;
    convert(&dev.stream, &f, po, pi, n, config(1, 32, 0)).unwrap();
    n = 1; // the launch recorded n = 4: a later change of the host variable must not reach it
    let _ = n;
    let graph = dev
        .stream
        .end_capture(CUgraphInstantiate_flags(0))
        .unwrap()
        .unwrap();
    let before: Vec<u16> = dev.stream.clone_dtoh(&out).unwrap();
    assert_eq!(before, vec![0; 4], "a capture records; it does not run");
    let mut input = input;
    dev.stream
        .memcpy_htod(&[5.0f32, 6.0, 7.0, 8.0], &mut input)
        .unwrap();
    graph.launch().unwrap();
    let after: Vec<f32> = dev
        .stream
        .clone_dtoh(&out)
        .unwrap()
        .into_iter()
        .map(|b| bf16::from_bits(b).to_f32())
        .collect();
    assert_eq!(after, vec![5.0, 6.0, 7.0, 8.0]);
}

#[test]
fn host_copies_and_allocations_invalidate_a_capture() {
    let dev = device();
    let out = dev.stream.alloc_zeros::<f32>(4).unwrap();
    let po = ptr(&dev, &out);
    let host = vec![1.0f32; 4];
    for case in ["pageable copy", "allocation", "synchronize"] {
        dev.stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
            .unwrap();
        let refused = match case {
            // SAFETY: a 16-byte copy into a 16-byte allocation (refused before it runs).
            "pageable copy" => unsafe {
                cudarc::driver::result::memcpy_htod_async(po, &host, dev.stream.cu_stream())
            },
            "allocation" => dev.stream.alloc_zeros::<f32>(8).map(|_| ()),
            _ => dev.stream.synchronize(),
        };
        assert_eq!(
            code(refused),
            CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
            "{case}"
        );
        let ended = dev
            .stream
            .end_capture(CUgraphInstantiate_flags(0))
            .map(|_| ());
        assert_eq!(
            code(ended),
            CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
            "{case}: the capture must be invalid"
        );
    }
}

#[test]
fn dynamic_shared_memory_needs_the_attribute_and_stays_within_the_opt_in_limit() {
    let dev = device();
    let f = dev.function("convert", "convert_f32_to_bf16").unwrap();
    let input = alloc_f32(&dev, &[1.0; 8]);
    let out = dev.stream.alloc_zeros::<u16>(8).unwrap();
    let (pi, po) = (ptr(&dev, &input), ptr(&dev, &out));
    let run = |smem: u32| code(convert(&dev.stream, &f, po, pi, 8, config(1, 32, smem)));
    assert_eq!(run(48 * 1024), CUresult::CUDA_SUCCESS);
    assert_eq!(run(48 * 1024 + 16), CUresult::CUDA_ERROR_INVALID_VALUE);
    let attr = CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
    let limit = dev
        .ctx
        .attribute(
            cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
        )
        .unwrap();
    let expected = match std::env::var("SWERVE_EMU_ARCH").as_deref() {
        Ok("sm_80") => 163 * 1024,
        Ok("sm_89") => 99 * 1024,
        _ => 227 * 1024,
    };
    assert_eq!(limit, expected);
    assert_eq!(
        code(f.set_attribute(attr, limit + 1)),
        CUresult::CUDA_ERROR_INVALID_VALUE
    );
    f.set_attribute(attr, 64 * 1024).unwrap();
    assert_eq!(run(64 * 1024), CUresult::CUDA_SUCCESS);
    assert_eq!(run(64 * 1024 + 16), CUresult::CUDA_ERROR_INVALID_VALUE);
}

#[test]
fn grid_and_block_limits_are_enforced() {
    let dev = device();
    let f = dev.function("convert", "convert_f32_to_bf16").unwrap();
    let input = alloc_f32(&dev, &[1.0; 8]);
    let out = dev.stream.alloc_zeros::<u16>(8).unwrap();
    let (pi, po) = (ptr(&dev, &input), ptr(&dev, &out));
    let run = |grid: (u32, u32, u32), block: (u32, u32, u32)| {
        let cfg = LaunchConfig {
            grid_dim: grid,
            block_dim: block,
            shared_mem_bytes: 0,
        };
        code(convert(&dev.stream, &f, po, pi, 8, cfg))
    };
    assert_eq!(run((1, 1, 1), (1024, 1, 1)), CUresult::CUDA_SUCCESS);
    assert_eq!(
        run((1, 1, 1), (1025, 1, 1)),
        CUresult::CUDA_ERROR_INVALID_VALUE
    );
    assert_eq!(
        run((1, 1, 1), (32, 32, 2)),
        CUresult::CUDA_ERROR_INVALID_VALUE
    );
    assert_eq!(
        run((1, 1, 1), (1, 1, 65)),
        CUresult::CUDA_ERROR_INVALID_VALUE
    );
    assert_eq!(
        run((1, 65536, 1), (32, 1, 1)),
        CUresult::CUDA_ERROR_INVALID_VALUE
    );
    assert_eq!(
        run((0, 1, 1), (32, 1, 1)),
        CUresult::CUDA_ERROR_INVALID_VALUE
    );
}

/// In a child process: the corrupted slack stays behind the live allocation until it is freed,
/// and the driver checks every allocation's slack after every launch, so the other tests'
/// launches running beside this one in threads would be failed by it.
#[test]
fn a_write_past_the_end_of_an_allocation_fails_the_launch() {
    const CASE: &str = "a_write_past_the_end_of_an_allocation_fails_the_launch";
    if std::env::var(CHILD).as_deref() == Ok(CASE) {
        let dev = device();
        let f = dev.function("convert", "convert_f32_to_bf16").unwrap();
        let input = alloc_f32(&dev, &[1.0; 64]);
        // 10 bf16 = 20 bytes: the write of 64 lands in the NaN-filled slack before the guard page.
        let out = dev.stream.alloc_zeros::<u16>(10).unwrap();
        let (pi, po) = (ptr(&dev, &input), ptr(&dev, &out));
        let result = code(convert(&dev.stream, &f, po, pi, 64, config(1, 64, 0)));
        eprintln!("launch result: {result:?}");
        std::process::exit(i32::from(result != CUresult::CUDA_ERROR_LAUNCH_FAILED));
    }
    let (status, stderr) = in_child(CASE, &[]);
    assert_eq!(status, Some(0), "{stderr}");
    assert!(
        stderr.contains("kernel convert_f32_to_bf16 wrote out of bounds"),
        "{stderr}"
    );
}

/// Runs `case` in a child process and returns its exit code and stderr.
fn in_child(case: &str, env: &[(&str, &str)]) -> (Option<i32>, String) {
    let output = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", case, "--nocapture", "--test-threads=1"])
        .env(CHILD, case)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn a_kernel_reading_past_an_allocation_stops_the_process_naming_it() {
    const CASE: &str = "a_kernel_reading_past_an_allocation_stops_the_process_naming_it";
    if std::env::var(CHILD).as_deref() == Ok(CASE) {
        let dev = device();
        let f = dev.function("convert", "convert_f32_to_bf16").unwrap();
        let input = alloc_f32(&dev, &[1.0; 100]);
        let out = dev.stream.alloc_zeros::<u16>(4096).unwrap();
        let (pi, po) = (ptr(&dev, &input), ptr(&dev, &out));
        let _ = convert(&dev.stream, &f, po, pi, 4096, config(4, 256, 0));
        eprintln!("the out-of-bounds read went unnoticed");
        std::process::exit(0);
    }
    let (status, stderr) = in_child(CASE, &[]);
    assert_eq!(status, Some(134), "{stderr}");
    assert!(
        stderr.contains("out-of-bounds global memory access by convert_f32_to_bf16"),
        "{stderr}"
    );
}

#[test]
fn a_kernel_reading_freed_memory_stops_the_process_naming_it() {
    const CASE: &str = "a_kernel_reading_freed_memory_stops_the_process_naming_it";
    if std::env::var(CHILD).as_deref() == Ok(CASE) {
        let dev = device();
        let f = dev.function("convert", "convert_f32_to_bf16").unwrap();
        let input = alloc_f32(&dev, &[1.0; 64]);
        let out = dev.stream.alloc_zeros::<u16>(64).unwrap();
        let (pi, po) = (ptr(&dev, &input), ptr(&dev, &out));
        drop(input);
        let _ = convert(&dev.stream, &f, po, pi, 64, config(1, 64, 0));
        eprintln!("the read of freed memory went unnoticed");
        std::process::exit(0);
    }
    let (status, stderr) = in_child(CASE, &[]);
    assert_eq!(status, Some(134), "{stderr}");
    assert!(stderr.contains("already freed"), "{stderr}");
}

#[test]
fn each_emulated_architecture_has_its_opt_in_limit() {
    const CASE: &str =
        "dynamic_shared_memory_needs_the_attribute_and_stays_within_the_opt_in_limit";
    if std::env::var(CHILD).is_ok() {
        return;
    }
    for arch in ["sm_80", "sm_89"] {
        let (status, stderr) = in_child(CASE, &[("SWERVE_EMU_ARCH", arch)]);
        assert_eq!(status, Some(0), "{arch}: {stderr}");
    }
    let (status, stderr) = in_child(CASE, &[("SWERVE_EMU_ARCH", "sm_75")]);
    assert_ne!(status, Some(0));
    assert!(stderr.contains("SWERVE_EMU_ARCH=sm_75"), "{stderr}");
}

#[test]
fn every_binary_says_it_runs_on_the_emulated_device_first() {
    for bin in [
        env!("CARGO_BIN_EXE_swerve-train"),
        env!("CARGO_BIN_EXE_swerve-serve"),
        env!("CARGO_BIN_EXE_swerve-bench"),
    ] {
        let output = Command::new(bin).arg("--help").output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr
                .lines()
                .next()
                .is_some_and(|l| l.starts_with("CUDA: emulated device")),
            "{bin}: {stderr}"
        );
    }
}

/// `cuTensorMapEncodeTiled` (the sm_90a kernels' TMA maps) is exported and checks its arguments
/// as the Driver API documents: a valid 128B-swizzled bf16 map encodes, a misaligned global
/// address or a box above 256 is `CUDA_ERROR_INVALID_VALUE`.
#[test]
fn tensor_maps_are_encoded_and_checked() {
    use cudarc::driver::sys::{
        cuTensorMapEncodeTiled, CUtensorMap, CUtensorMapDataType, CUtensorMapFloatOOBfill,
        CUtensorMapInterleave, CUtensorMapL2promotion, CUtensorMapSwizzle,
    };
    let dev = device();
    let buf = alloc_f32(&dev, &vec![0.0f32; 64 * 64]);
    let base = ptr(&dev, &buf);
    let encode = |addr: u64, box1: u32| {
        // SAFETY: a CUtensorMap is plain bytes; every pointer names a live local array.
        let mut map: CUtensorMap = unsafe { std::mem::zeroed() };
        let dims = [64u64, 128];
        let strides = [128u64];
        let boxes = [64u32, box1];
        let element_strides = [1u32, 1];
        unsafe {
            cuTensorMapEncodeTiled(
                &mut map,
                CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                2,
                addr as *mut std::ffi::c_void,
                dims.as_ptr(),
                strides.as_ptr(),
                boxes.as_ptr(),
                element_strides.as_ptr(),
                CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
                CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_NONE,
                CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        }
    };
    assert_eq!(encode(base, 64), CUresult::CUDA_SUCCESS);
    assert_eq!(encode(base + 8, 64), CUresult::CUDA_ERROR_INVALID_VALUE);
    assert_eq!(encode(base, 300), CUresult::CUDA_ERROR_INVALID_VALUE);
}
