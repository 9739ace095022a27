//! Files into a pod: the host folder as a tar stream (made by the host's `tar`) fed to
//! `tar -x` running in the pod over exec. The archive is unpacked by the pod's own processes,
//! so every path resolves inside the pod's filesystem (as `docker cp` resolves inside the
//! container's root), and GNU tar replaces a symlink the agent planted where the archive has a
//! folder rather than following it.

use super::exec::{exec, ExecRequest};
use super::lifecycle::Pods;
use crate::env::{describe_end, shell_quote, Limits};
use anyhow::{bail, Context, Result};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// The host folder's contents as a tar archive (names relative to it: `./tests/x.py`).
pub fn tar_folder(dir: &Path) -> Result<Vec<u8>> {
    if !dir.is_dir() {
        bail!("{} is not a folder", dir.display());
    }
    let out = Command::new("tar")
        .arg("-C")
        .arg(dir)
        .args(["-cf", "-", "."])
        .output()
        .with_context(|| format!("running the host's tar on {}", dir.display()))?;
    if !out.status.success() {
        bail!(
            "tar -C {} -cf - . failed: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out.stdout)
}

/// The command unpacking an archive from stdin over `workdir` (made when missing), files owned
/// by the pod's user.
pub fn untar_command(workdir: &str) -> String {
    let dir = shell_quote(workdir);
    format!("mkdir -p {dir} && tar -x --no-same-owner -f - -C {dir}")
}

/// Copies `host_dir`'s contents over `workdir` in the pod `name`.
pub async fn copy_in(
    pods: &Pods,
    name: &str,
    host_dir: &Path,
    workdir: &str,
    limits: &Limits,
) -> Result<()> {
    let archive = tar_folder(host_dir)?;
    let command = untar_command(workdir);
    let request = ExecRequest {
        script: &command,
        stdin: Some(&archive),
        timeout: Duration::from_secs(600),
        output_bytes: 16 * 1024,
        dir: "/",
    };
    let out = exec(pods, name, &request, limits).await?;
    if !out.success() {
        bail!(
            "copying {} into {workdir} of the pod {name} failed ({}): {}",
            host_dir.display(),
            describe_end(&out),
            out.output.trim()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_archive_unpacks_over_the_workdir() {
        let tmp = tempfile::tempdir().unwrap();
        let source = tmp.path().join("source");
        std::fs::create_dir_all(source.join("tests")).unwrap();
        std::fs::write(source.join("tests/x.py"), "x = 1\n").unwrap();
        let archive = tar_folder(&source).unwrap();
        let target = tmp.path().join("work space");
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(untar_command(target.to_str().unwrap()))
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), &archive).unwrap();
        assert!(child.wait().unwrap().success());
        assert_eq!(
            std::fs::read_to_string(target.join("tests/x.py")).unwrap(),
            "x = 1\n"
        );
        assert!(tar_folder(&tmp.path().join("absent")).is_err());
    }
}
