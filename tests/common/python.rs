//! Python clients for the server tests, provisioned in virtual environments under cargo's target
//! folder (once; later runs reuse them): `SWERVE_PYTHON` names an interpreter that already has
//! what a test needs; else `python3` when it imports it; else a venv is made with the pinned
//! requirements. Where that is impossible a test fails with the one command that fixes it: it
//! never skips.

use super::root;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A set of pinned Python packages.
pub struct PythonEnv {
    /// Folder name under the target folder.
    pub venv: String,
    /// Requirement files (under tests/) installed with their dependencies.
    pub requirements: &'static [&'static str],
    /// Requirement files installed without their dependencies (a package whose declared
    /// dependencies are much larger than what the test imports).
    pub no_deps: &'static [&'static str],
    /// Python that must run without error (imports, version checks).
    pub check: String,
}

fn passes(python: &Path, check: &str) -> bool {
    Command::new(python)
        .args(["-c", check])
        .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        .env("MSWEA_SILENT_STARTUP", "1")
        .env("MSWEA_GLOBAL_CONFIG_DIR", std::env::temp_dir())
        .output()
        .is_ok_and(|o| o.status.success())
}

fn pip(python: &Path, args: &[&str], file: &str, fix: &str) {
    let out = Command::new(python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .args(args)
        .arg("-r")
        .arg(root().join("tests").join(file))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cannot install tests/{file} into {}: {fix}\n{}",
        python.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl PythonEnv {
    /// An interpreter that passes `check`, provisioning the venv if needed.
    pub fn python(&self) -> PathBuf {
        if let Some(python) = std::env::var_os("SWERVE_PYTHON") {
            return PathBuf::from(python);
        }
        let system = PathBuf::from("python3");
        if passes(&system, &self.check) {
            return system;
        }
        // One test at a time provisions (tests of one binary run in parallel threads and would
        // race on the same folder's `venv --clear`).
        static PROVISIONING: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one_at_a_time = PROVISIONING.lock().unwrap_or_else(|e| e.into_inner());
        let venv = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(&self.venv);
        let python = venv.join("bin/python3");
        if passes(&python, &self.check) {
            return python;
        }
        let files: Vec<String> = self
            .requirements
            .iter()
            .chain(self.no_deps)
            .map(|f| format!("tests/{f}"))
            .collect();
        let fix = format!(
            "apt-get install python3-venv (or set SWERVE_PYTHON to a Python with `pip install -r` {})",
            files.join(", ")
        );
        let made = Command::new("python3")
            .args(["-m", "venv", "--clear"])
            .arg(&venv)
            .output()
            .unwrap_or_else(|e| panic!("this test needs python3 ({e}): {fix}"));
        assert!(
            made.status.success(),
            "cannot create a virtual environment: {fix}\n{}",
            String::from_utf8_lossy(&made.stderr)
        );
        for file in self.requirements {
            pip(&python, &[], file, &fix);
        }
        for file in self.no_deps {
            pip(&python, &["--no-deps"], file, &fix);
        }
        assert!(
            passes(&python, &self.check),
            "{} fails `{}` after installing {}",
            python.display(),
            self.check,
            files.join(", ")
        );
        python
    }
}
