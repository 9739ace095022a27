//! The stand-in `libcublasLt` of the emulated CUDA device (`emu/cublaslt.cpp`, issue 14), tested
//! through its C API the way cudarc calls it: the library is built with the flags build.rs uses,
//! and `emu/tests/cublaslt_test.cpp` dlopens it (`RTLD_LOCAL`, like libloading), looks every entry
//! point up by name and compares GEMMs (transposes, odd shapes, ld > rows, bf16/fp32 outputs,
//! accumulation, bias, strided batches) with a float64 reference, checks the refusals of
//! unsupported uses, and, through a fake emulated driver loaded as `libcuda.so.1`, that a GEMM is
//! handed to the stream and replays with its call-time values. The split-K cases (issue 25) check
//! that the heuristic's split-K count depends on the problem's size, that the chunked summation
//! order is exactly what the header says, that an algo pinned without split-K gives a row the same
//! bits at every row count while per-problem choices do not, and the algo config attributes and
//! `cublasLtMatmulAlgoCheck`. A last test proves the comparison can fail: a swapped transpose flag
//! must be reported as a mismatch.
//!
//! Needs `g++` (C++17) on PATH, as CI has; the programs are built into `CARGO_TARGET_TMPDIR`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

struct Built {
    lib: PathBuf,
    driver: PathBuf,
    test: PathBuf,
}

fn gxx(args: &[&str], what: &str) {
    let out = Command::new("g++").args(args).output().unwrap_or_else(|e| {
        panic!("g++ is required to build the emulated cuBLASLt ({what}) but could not run: {e}")
    });
    assert!(
        out.status.success(),
        "g++ failed building {what}:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn built() -> &'static Built {
    static BUILT: OnceLock<Built> = OnceLock::new();
    BUILT.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("emu_cublaslt");
        std::fs::create_dir_all(&dir).unwrap();
        let src = root.join("emu/cublaslt.cpp");
        let test_src = root.join("emu/tests/cublaslt_test.cpp");
        let (src, test_src) = (src.to_str().unwrap(), test_src.to_str().unwrap());
        let b = Built {
            lib: dir.join("libcublasLt.so"),
            driver: dir.join("libcuda.so.1"),
            test: dir.join("cublaslt_test"),
        };
        let common = ["-std=c++17", "-O2", "-Wall", "-Wextra"];
        let lib = b.lib.to_str().unwrap();
        let driver = b.driver.to_str().unwrap();
        let test = b.test.to_str().unwrap();
        // The library exactly as build.rs builds it.
        let mut args = common.to_vec();
        args.extend(["-fPIC", "-shared", "-Wl,-soname,libcublasLt.so"]);
        args.extend([src, "-o", lib]);
        gxx(&args, "libcublasLt.so");
        let mut args = common.to_vec();
        args.extend(["-fPIC", "-shared", "-DSWERVE_FAKE_DRIVER"]);
        args.extend(["-Wl,-soname,libcuda.so.1", test_src, "-o", driver]);
        gxx(&args, "the fake driver");
        let mut args = common.to_vec();
        args.extend([test_src, "-o", test, "-ldl"]);
        gxx(&args, "the test program");
        b
    })
}

fn run(extra: &[&Path]) -> Output {
    let b = built();
    let out = Command::new(&b.test)
        .arg(&b.lib)
        .args(extra)
        .output()
        .expect("running the cuBLASLt test program");
    println!("{}", String::from_utf8_lossy(&out.stdout));
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    out
}

#[test]
fn gemms_match_a_float64_reference_and_unsupported_uses_are_refused() {
    let out = run(&[]);
    assert!(
        out.status.success(),
        "the emulated cuBLASLt failed its checks: {:?}",
        out.status
    );
}

#[test]
fn gemms_go_through_the_emulated_stream_and_replay_their_call_time_values() {
    let b = built();
    let out = run(&[Path::new("--driver"), &b.driver]);
    assert!(
        out.status.success(),
        "the emulated cuBLASLt failed its checks behind the fake driver: {:?}",
        out.status
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("ok replay: recorded alpha, bias pointer; current memory"),
        "the stream cases did not run"
    );
}

#[test]
fn a_swapped_transpose_flag_is_reported_as_a_mismatch() {
    let out = run(&[Path::new("--flip-transpose")]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    // Exit 1 with MISMATCH: the GEMM ran and its values were wrong (2 would be an API failure).
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("MISMATCH"), "{stdout}");
    assert!(stdout.contains("flipped TRANSA detected"), "{stdout}");
}
