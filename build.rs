//! Compiles every `kernels/*.cu` with nvcc into a fatbin (sm_90a machine code + compute_80 PTX)
//! and embeds them in the library through `$OUT_DIR/kernels.rs`:
//!
//! ```text
//! pub const CUDA_KERNELS_COMPILED: bool;
//! pub static FATBINS: &[(&str, &[u8])];   // (kernel family = file stem, fatbin bytes)
//! ```
//!
//! nvcc is found through `NVCC`, then `CUDA_HOME`/`CUDA_PATH` (`bin/nvcc`), then `PATH`. Without it
//! the build is CPU-only and says so in one cargo warning; with `SWERVE_REQUIRE_CUDA=1` a missing
//! nvcc (or a failed compile) is a build error. The ptxas resource report (registers, shared
//! memory, stack, spills) of every kernel goes to `$OUT_DIR/ptxas-report.txt` and to this script's
//! output (`cargo build -vv`); `SWERVE_PTXAS_VERBOSE=1` also prints it as cargo warnings, and any
//! spill is always a warning.

use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "emu/build_emu.rs"]
mod build_emu;

/// Flags added after `--use_fast_math` for one kernel family. `adamw`: keep denormals
/// (`--use_fast_math` flushes them), so the optimizer's explicitly rounded arithmetic equals the
/// CPU reference's bit for bit even for tiny gradients and decayed second moments.
const FAMILY_FLAGS: [(&str, &[&str]); 1] = [("adamw", &["--ftz=false"])];

const GENCODES: [&str; 2] = [
    "-gencode=arch=compute_90a,code=sm_90a",
    "-gencode=arch=compute_80,code=compute_80",
];

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    let kernel_dir = manifest_dir.join("kernels");
    for var in [
        "NVCC",
        "CUDA_HOME",
        "CUDA_PATH",
        "PATH",
        "SWERVE_REQUIRE_CUDA",
        "SWERVE_PTXAS_VERBOSE",
        "SWERVE_EMU",
        "CXX",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed={}", kernel_dir.display());

    let mut sources = Vec::new();
    let mut entries: Vec<PathBuf> = fs::read_dir(&kernel_dir)
        .map(|dir| dir.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    entries.sort();
    for path in entries {
        match path.extension().and_then(|e| e.to_str()) {
            Some("cu") => {
                println!("cargo:rerun-if-changed={}", path.display());
                sources.push(path);
            }
            Some("cuh") | Some("h") => println!("cargo:rerun-if-changed={}", path.display()),
            _ => {}
        }
    }

    write_builtin_tasks(&manifest_dir, &out_dir);

    // `cfg(swerve_emu)`: GPU tests run (instead of being ignored) in emulated builds.
    println!("cargo::rustc-check-cfg=cfg(swerve_emu)");
    if env::var("SWERVE_EMU").is_ok_and(|v| v == "1") {
        match build_emu::build(&manifest_dir, &out_dir, &sources) {
            Ok(emu) => {
                println!("cargo:rustc-cfg=swerve_emu");
                println!(
                    "cargo:warning=swerve: SWERVE_EMU=1: kernels compiled for the emulated CUDA device (CPU), not for GPUs"
                );
                write_kernels_rs(&out_dir, true, &emu.families, &emu.libraries, None);
                return;
            }
            Err(e) => fail(&format!("SWERVE_EMU=1: {e}")),
        }
    } else if let Some(v) = env::var_os("SWERVE_EMU").filter(|v| !v.is_empty() && v != "0") {
        fail(&format!(
            "SWERVE_EMU={} must be 1 (emulated CUDA device) or 0/unset",
            v.to_string_lossy()
        ));
    }

    let require_cuda = env::var("SWERVE_REQUIRE_CUDA").is_ok_and(|v| v == "1");
    let verbose = env::var("SWERVE_PTXAS_VERBOSE").is_ok_and(|v| v == "1");
    let Some(nvcc) = find_nvcc() else {
        if require_cuda {
            fail("SWERVE_REQUIRE_CUDA=1 but no nvcc was found (looked at NVCC, CUDA_HOME/bin, CUDA_PATH/bin, PATH); run scripts/install-cuda-toolchain.sh and set NVCC to the path it prints");
        }
        println!("cargo:warning=swerve: no nvcc found (NVCC, CUDA_HOME, CUDA_PATH, PATH): building CPU-only, CUDA kernels are not embedded (scripts/install-cuda-toolchain.sh installs nvcc)");
        write_kernels_rs(&out_dir, false, &[], &[], None);
        return;
    };

    // The files are independent: compile them in parallel, as many at once as cargo's job count.
    let commands: Vec<Command> = sources
        .iter()
        .map(|src| {
            let stem = src.file_stem().unwrap().to_string_lossy().into_owned();
            let fatbin = out_dir.join(format!("{stem}.fatbin"));
            let mut cmd = Command::new(&nvcc);
            cmd.arg("-fatbin")
                .args(GENCODES)
                .args(["-O3", "-std=c++17", "--use_fast_math", "-lineinfo"])
                .args(
                    FAMILY_FLAGS
                        .iter()
                        .filter(|(family, _)| *family == stem)
                        .flat_map(|(_, flags)| flags.iter()),
                )
                .args(["-Xptxas", "-v", "-Xptxas", "-warn-spills"])
                .arg("-I")
                .arg(&kernel_dir)
                .arg("-o")
                .arg(&fatbin)
                .arg(src);
            cmd
        })
        .collect();
    let outputs = build_emu::run_bounded(commands);
    let jobs = sources.iter().zip(outputs).map(|(src, output)| {
        let stem = src.file_stem().unwrap().to_string_lossy().into_owned();
        let fatbin = out_dir.join(format!("{stem}.fatbin"));
        let output =
            output.unwrap_or_else(|e| fail(&format!("could not run {}: {e}", nvcc.display())));
        (stem, fatbin, output)
    });

    let mut report = String::new();
    let mut compiled = Vec::new();
    for (stem, fatbin, output) in jobs {
        let text = String::from_utf8_lossy(&output.stderr).into_owned()
            + &String::from_utf8_lossy(&output.stdout);
        if !output.status.success() {
            eprintln!("{text}");
            fail(&format!("nvcc failed on kernels/{stem}.cu:\n{text}"));
        }
        let _ = writeln!(report, "== kernels/{stem}.cu");
        let mut function = String::new();
        for line in text.lines() {
            let _ = writeln!(report, "{line}");
            if let Some(name) = line.split("Compiling entry function '").nth(1) {
                function = name.split('\'').next().unwrap_or("").to_string();
                if let Some(arch) = line.split("for '").nth(1) {
                    function = format!("{function} ({}", arch.trim_end_matches('\''));
                    function.push(')');
                }
            }
            let spilled = line.contains("bytes spill stores")
                && !line.contains(" 0 bytes spill stores, 0 bytes spill loads");
            if spilled {
                println!(
                    "cargo:warning=swerve: register spill in {stem}.cu {function}: {}",
                    line.trim()
                );
            } else if verbose && line.contains("Used ") {
                println!(
                    "cargo:warning=ptxas {stem}.cu {function}: {}",
                    line.trim()
                        .trim_start_matches("ptxas info")
                        .trim_start_matches([' ', ':'])
                );
            }
        }
        compiled.push((stem, fatbin));
    }
    eprintln!("{report}");
    let report_path = out_dir.join("ptxas-report.txt");
    fs::write(&report_path, &report).unwrap();
    write_kernels_rs(&out_dir, true, &compiled, &[], Some(&report_path));
}

fn find_nvcc() -> Option<PathBuf> {
    if let Some(path) = env::var_os("NVCC").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        if path.is_file() {
            return Some(path);
        }
        fail(&format!("NVCC={} does not name a file", path.display()));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(root) = env::var_os(var).filter(|p| !p.is_empty()) {
            let candidate = Path::new(&root).join("bin").join("nvcc");
            if candidate.is_file() {
                return Some(candidate);
            }
        }
    }
    env::split_paths(&env::var_os("PATH")?)
        .map(|dir| dir.join("nvcc"))
        .find(|candidate| candidate.is_file())
}

fn write_kernels_rs(
    out_dir: &Path,
    compiled: bool,
    fatbins: &[(String, PathBuf)],
    emulator_libraries: &[PathBuf],
    ptxas_report: Option<&Path>,
) {
    let mut rs = format!("pub const CUDA_KERNELS_COMPILED: bool = {compiled};\n");
    // The ptxas resource report of the GPU build (`swerve-bench kernels --static`); empty in an
    // emulated or CPU-only build.
    match ptxas_report {
        Some(path) => {
            let _ = writeln!(
                rs,
                "pub static PTXAS_REPORT: &str = include_str!({:?});",
                path.display().to_string()
            );
        }
        None => rs.push_str("pub static PTXAS_REPORT: &str = \"\";\n"),
    }
    let _ = writeln!(
        rs,
        "pub const CUDA_EMULATED: bool = {};",
        !emulator_libraries.is_empty()
    );
    rs.push_str("pub static EMULATOR_LIBRARIES: &[&str] = &[\n");
    for path in emulator_libraries {
        let _ = writeln!(rs, "    {:?},", path.display().to_string());
    }
    rs.push_str("];\n");
    rs.push_str("pub static FATBINS: &[(&str, &[u8])] = &[\n");
    for (stem, path) in fatbins {
        let _ = writeln!(
            rs,
            "    ({stem:?}, include_bytes!({:?})),",
            path.display().to_string()
        );
    }
    rs.push_str("];\n");
    fs::write(out_dir.join("kernels.rs"), rs).unwrap();
}

fn fail(message: &str) -> ! {
    eprintln!("error: swerve build: {message}");
    std::process::exit(1);
}

/// Embeds every file under `tasks/` (the built-in task sets, `--tasks builtin:NAME`) as
/// `BUILTIN_TASK_FILES: &[(relative path, bytes)]` in `$OUT_DIR/builtin_tasks.rs`.
fn write_builtin_tasks(manifest_dir: &Path, out_dir: &Path) {
    let root = manifest_dir.join("tasks");
    println!("cargo:rerun-if-changed={}", root.display());
    let mut files = Vec::new();
    fn walk(dir: &Path, files: &mut Vec<PathBuf>) {
        let Ok(entries) = fs::read_dir(dir) else {
            return;
        };
        let mut entries: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        entries.sort();
        for path in entries {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name.starts_with('.') || name == "__pycache__" {
                continue;
            }
            println!("cargo:rerun-if-changed={}", path.display());
            if path.is_dir() {
                walk(&path, files);
            } else if path.is_file() {
                files.push(path);
            }
        }
    }
    walk(&root, &mut files);
    let mut code = String::from("pub const BUILTIN_TASK_FILES: &[(&str, &[u8])] = &[\n");
    for path in &files {
        let rel = path
            .strip_prefix(&root)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        code.push_str(&format!(
            "    ({rel:?}, include_bytes!({:?})),\n",
            path.display().to_string()
        ));
    }
    code.push_str("];\n");
    fs::write(out_dir.join("builtin_tasks.rs"), code).expect("writing builtin_tasks.rs");
}
