//! Unit tests of the emulated CUDA device (`emu/`): compiles the runtime (`emu/runtime.cpp`,
//! `runtime_warp.cpp`, `runtime_memory.cpp`, `runtime_hopper.cpp`, `runtime_tma.cpp`) with the C++ test programs into
//! `CARGO_TARGET_TMPDIR` with g++ and runs them.
//!
//! - `emu/tests/unit.cpp`: ldmatrix / mma.sync fragment layouts against the PTX ISA and a scalar
//!   matmul, shuffles, votes, atomics, cp.async groups, shared memory.
//! - `emu/tests/unit_diagnostics.cpp`: every diagnostic on a bad kernel (and none on the good
//!   ones), the `SWERVE_EMU_SCHEDULE` modes, launches on several OS threads, guard pages.
//! - `emu/tests/unit_hopper.cpp`: sm_90a (`kernels/hopper.cuh`): wgmma in every canonical
//!   shared-memory layout against a scalar product and bit for bit against mma.sync, TMA boxes
//!   (swizzles, out-of-bounds fill, 3D), tensor-map checks, mbarrier phases, and a warp-specialised
//!   TMA + wgmma pipeline under every schedule; `unit_hopper_diagnostics.cpp`: its diagnostics.
//! - `emu/tests/unit_kernels.cpp`: the real `kernels/rmsnorm.cu` and `kernels/flash_attn.cu`
//!   (forward and backward) against float64 references, and two broken copies of the flash
//!   forward written here (`cp_async_wait<1>` made `<2>`: the emulator must report copies never
//!   waited for; the V `ldmatrix_x4_trans` made `ldmatrix_x4`: the output must mismatch).
//! - an untransformed `__shared__` declaration must not compile.
//!
//! Needs only g++ (no GPU, no SWERVE_EMU build of the crate).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// This process's build directory, with the runtime compiled once.
fn build_dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("emu_unit-{}", std::process::id()));
        fs::create_dir_all(&dir).expect("creating the build directory");
        for file in build_emu::RUNTIME_SOURCES {
            let object = runtime_object(&dir, file);
            let source = root().join("emu").join(file);
            compile(
                &[
                    source.to_str().unwrap(),
                    "-c",
                    "-o",
                    object.to_str().unwrap(),
                ],
                &[],
            );
        }
        dir
    })
}

/// The object a runtime source compiles to in `dir`.
fn runtime_object(dir: &Path, file: &str) -> PathBuf {
    dir.join(file.replace(".cpp", ".o"))
}

fn cxx() -> String {
    std::env::var("CXX").unwrap_or_else(|_| "g++".to_string())
}

fn base_flags() -> Vec<String> {
    let root = root();
    vec![
        "-std=c++17".into(),
        "-O2".into(),
        "-fno-strict-aliasing".into(),
        "-DSWERVE_EMU".into(),
        "-Wno-unknown-pragmas".into(),
        format!("-I{}", root.join("emu/include").display()),
        format!("-I{}", root.join("emu").display()),
        format!("-I{}", root.join("kernels").display()),
    ]
}

fn run_cxx(args: &[&str], include_dirs: &[&Path]) -> Output {
    let mut cmd = Command::new(cxx());
    cmd.args(base_flags());
    for dir in include_dirs {
        cmd.arg(format!("-I{}", dir.display()));
    }
    cmd.args(args);
    match cmd.output() {
        Ok(out) => out,
        Err(e) => panic!(
            "the emulated-device tests need a C++17 compiler: could not run `{}` ({e}); install g++ \
             (e.g. apt-get install g++) or set CXX",
            cxx()
        ),
    }
}

fn compile(args: &[&str], include_dirs: &[&Path]) {
    let out = run_cxx(args, include_dirs);
    assert!(
        out.status.success(),
        "{} {} failed:\n{}{}",
        cxx(),
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn compile_and_run(name: &str, source: &Path, include_dirs: &[&Path]) {
    let dir = build_dir();
    let exe = dir.join(name);
    let objects: Vec<PathBuf> = build_emu::RUNTIME_SOURCES
        .iter()
        .map(|file| runtime_object(dir, file))
        .collect();
    let mut args = vec![source.to_str().unwrap()];
    args.extend(objects.iter().map(|o| o.to_str().unwrap()));
    args.extend(["-o", exe.to_str().unwrap(), "-lpthread"]);
    compile(&args, include_dirs);
    let out = Command::new(&exe)
        .output()
        .expect("running the test program");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    if !stderr.is_empty() {
        println!("--- stderr (errors the emulator printed for the deliberately broken kernels) ---\n{stderr}");
    }
    assert!(
        out.status.success(),
        "{name} failed (exit status {:?}); see the FAIL lines above",
        out.status
    );
}

/// The emulated build's source transform, exactly as build.rs applies it (`emu/build_emu.rs`):
/// `extern __shared__ [__align__(N)] T name[];` becomes a pointer to the block's dynamic shared
/// memory, `__shared__ [__align__(N)] T name<dims>;` a reference to
/// `emu::block_shared<T<dims>>(ID)`, and the family's kernel table is appended.
#[path = "../emu/build_emu.rs"]
#[allow(dead_code)]
mod build_emu;

fn transform(src: &str, family: &str) -> String {
    build_emu::transform(src, family)
        .unwrap_or_else(|e| panic!("{family}: {e}"))
        .0
}

/// The forward's O += P V (attn_tile.cuh's `attn_tile_pv`) written out with V loaded by
/// `ldmatrix` without `.trans`: the layout mutation the emulator must turn into wrong output.
const PV_WITHOUT_TRANS: &str = "for (int kk = 0; kk < kAttnKeyTile / 16; ++kk) { uint32_t p_frag[4]; \
    p_frag[0] = pack_bf16x2(s_acc[2 * kk][0], s_acc[2 * kk][1]); \
    p_frag[1] = pack_bf16x2(s_acc[2 * kk][2], s_acc[2 * kk][3]); \
    p_frag[2] = pack_bf16x2(s_acc[2 * kk + 1][0], s_acc[2 * kk + 1][1]); \
    p_frag[3] = pack_bf16x2(s_acc[2 * kk + 1][2], s_acc[2 * kk + 1][3]); \
    for (int dp = 0; dp < D / 16; ++dp) { uint32_t b[4]; \
    const int r = kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8; const int c = dp * 16 + (lane / 16) * 8; \
    ldmatrix_x4(b, sV + r * S + c); mma_bf16_16816(o_acc[2 * dp], p_frag, b[0], b[1]); \
    mma_bf16_16816(o_acc[2 * dp + 1], p_frag, b[2], b[3]); } }";

/// `src` with `from` replaced by `to` inside flash_attn.cu's forward only (the template function
/// up to the entry-point macro); panics if the forward has no such text.
fn mutate_forward(src: &str, from: &str, to: &str) -> String {
    let start = src
        .find("void flash_attn_fwd(")
        .expect("flash_attn.cu: the forward's template function `flash_attn_fwd(` is gone");
    let end = start
        + src[start..]
            .find("#define FLASH_FWD_ENTRY")
            .expect("flash_attn.cu: FLASH_FWD_ENTRY is gone");
    let body = &src[start..end];
    assert!(
        body.contains(from),
        "flash_attn.cu's forward has no `{from}` left to mutate: update this test's mutation"
    );
    format!("{}{}{}", &src[..start], body.replace(from, to), &src[end..])
}

#[test]
fn emulator_unit_tests() {
    compile_and_run("unit", &root().join("emu/tests/unit.cpp"), &[]);
}

#[test]
fn emulator_hopper_wgmma_tma_mbarrier_and_pipeline() {
    compile_and_run(
        "unit_hopper",
        &root().join("emu/tests/unit_hopper.cpp"),
        &[],
    );
}

#[test]
fn emulator_hopper_diagnostics() {
    compile_and_run(
        "unit_hopper_diagnostics",
        &root().join("emu/tests/unit_hopper_diagnostics.cpp"),
        &[],
    );
}

#[test]
fn emulator_diagnostics_schedules_threads_and_guard_pages() {
    compile_and_run(
        "unit_diagnostics",
        &root().join("emu/tests/unit_diagnostics.cpp"),
        &[],
    );
}

#[test]
fn real_kernels_against_references_and_mutations() {
    let dir = build_dir().join("kernels");
    fs::create_dir_all(&dir).unwrap();
    let read = |f: &str| fs::read_to_string(root().join("kernels").join(f)).unwrap();
    let flash_src = read("flash_attn.cu");
    let flash = transform(&flash_src, "flash_attn");
    fs::write(
        dir.join("rmsnorm.emu.cpp"),
        transform(&read("rmsnorm.cu"), "rmsnorm"),
    )
    .unwrap();
    fs::write(dir.join("flash_attn.emu.cpp"), &flash).unwrap();
    fs::write(
        dir.join("flash_attn_mut_wait.emu.cpp"),
        transform(
            &mutate_forward(&flash_src, "cp_async_wait<1>()", "cp_async_wait<2>()"),
            "flash_attn_mut_wait",
        ),
    )
    .unwrap();
    fs::write(
        dir.join("flash_attn_mut_trans.emu.cpp"),
        transform(
            &mutate_forward(
                &flash_src,
                "attn_tile_pv<D>(o_acc, s_acc, sV, S, lane);",
                PV_WITHOUT_TRANS,
            ),
            "flash_attn_mut_trans",
        ),
    )
    .unwrap();
    compile_and_run(
        "unit_kernels",
        &root().join("emu/tests/unit_kernels.cpp"),
        &[&dir],
    );
}

#[test]
fn untransformed_shared_does_not_compile() {
    let dir = build_dir();
    let src = dir.join("untransformed.cpp");
    fs::write(
        &src,
        "#include \"emu_cuda.h\"\n__global__ void k(float* o) { __shared__ float s[32]; s[0] = 1; o[0] = s[0]; }\n",
    )
    .unwrap();
    let out = run_cxx(&["-fsyntax-only", src.to_str().unwrap()], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("untransformed __shared__"),
        "an untransformed __shared__ must be a compile error naming the transform; got status {:?}:\n{stderr}",
        out.status
    );
}

#[test]
fn transform_matches_the_documented_forms() {
    let src = "    extern __shared__ __align__(16) unsigned char smem[];\n  __shared__ float a[4][8];  // x\n__shared__ __align__(16) float b[N];\n__shared__ unsigned long long key;\n";
    let want = "    unsigned char* smem = reinterpret_cast<unsigned char*>(emu::dynamic_smem());\n  auto& a = emu::block_shared<float[4][8]>(0);  // x\nauto& b = emu::block_shared<float[N]>(1);\nauto& key = emu::block_shared<unsigned long long>(2);\n";
    let got = transform(src, "documented");
    let (declarations, table) = got
        .split_once("\n// ---- generated by build.rs")
        .expect("the kernel table follows the source");
    assert_eq!(declarations, want);
    assert!(table.contains("swerve_emu_kernels_documented[]"), "{table}");
}
