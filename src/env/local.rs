//! The `local` environment: a bubblewrap sandbox per command over a per-episode workspace.
//!
//! ```text
//!   ROOT/ (0711)
//!     ep-17/ (0700, owned by the episode's uid)
//!       workspace/   a fresh copy of the task's repo  ──bind rw──► /workspace (the only
//!       home/        $HOME, kept across commands      ──bind rw──► /home/agent  writable places)
//!   /usr /bin /lib* /etc   read-only          /tmp  a tmpfs per command
//!   no network (empty net namespace), own PID / IPC / UTS / user namespaces, new session
//! ```
//!
//! Each command is `bwrap ... sh -c COMMAND`: the sandbox's PID namespace dies with it, so nothing
//! a command starts outlives it (no daemons between turns, nothing left when the episode ends).
//! Limits: a wall-clock timeout per command (the sandbox is killed whole), address space, file
//! size and core dumps by rlimit, and the process count by RLIMIT_NPROC under a uid of the
//! episode's own: run as root, episode slot `k` runs as uid/gid `uid_base + k`, so concurrent
//! episodes neither count against each other nor can read each other's files. As another user,
//! every episode runs as that user and the process limit is not enforced (a warning says so).
//! Without bubblewrap this environment refuses to start: commands never run unsandboxed.

use super::output::run_captured;
use super::{run_setup, CommandOutput, Environment, Limits, RepoSource, Sandbox, Task};
use anyhow::{anyhow, bail, Context, Result};
use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Where the workspace appears inside the sandbox.
pub const WORKDIR: &str = "/workspace";
const HOME: &str = "/home/agent";
/// Where `copy_in` mounts the host folder it copies from.
const COPY_SOURCE: &str = "/run/swerve-copy-in";
/// Read-only system paths bound when they exist (a symlink such as `/bin -> usr/bin` is recreated
/// as the same symlink).
const SYSTEM_PATHS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc",
];
const SANDBOX_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

#[derive(Clone, Debug)]
pub struct LocalConfig {
    pub limits: Limits,
    /// Folder holding the episodes' workspaces (created 0700).
    pub root: PathBuf,
    /// More host paths bound read-only at the same place (a toolchain outside /usr, say).
    pub read_only_binds: Vec<PathBuf>,
    /// As root, episode slot k runs as uid and gid `uid_base + k`.
    pub uid_base: u32,
}

impl LocalConfig {
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            root: std::env::temp_dir().join(format!("swerve-episodes-{}", std::process::id())),
            read_only_binds: Vec::new(),
            uid_base: 200_000,
        }
    }
}

pub struct LocalEnvironment {
    bwrap: PathBuf,
    config: LocalConfig,
    as_root: bool,
    /// Episode slots in use (as root: uids).
    slots: Arc<Mutex<BTreeSet<u32>>>,
}

fn find_in_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

impl LocalEnvironment {
    /// Finds bubblewrap and checks that it can build a sandbox here.
    pub fn new(config: LocalConfig) -> Result<Self> {
        let bwrap = find_in_path("bwrap").ok_or_else(|| {
            anyhow!(
                "the local environment needs bubblewrap (`bwrap` is not on PATH): install it \
                 with `apt-get install bubblewrap` (Debian/Ubuntu) or `dnf install bubblewrap`; \
                 agent commands never run unsandboxed"
            )
        })?;
        for bind in &config.read_only_binds {
            if !bind.is_absolute() || !bind.exists() {
                bail!(
                    "--sandbox-bind {}: expected an absolute path that exists",
                    bind.display()
                );
            }
        }
        create_private_dir(&config.root)?;
        let as_root = is_root();
        if !as_root {
            eprintln!(
                "warning: the local environment runs as a non-root user: episodes share its uid, \
                 so the process-count limit is not enforced (run as root for per-episode uids)"
            );
        }
        let env = Self {
            bwrap,
            config,
            as_root,
            slots: Arc::new(Mutex::new(BTreeSet::new())),
        };
        env.probe()?;
        Ok(env)
    }

    /// Runs `true` in a throwaway sandbox: a clear error here beats one per episode.
    fn probe(&self) -> Result<()> {
        let task_dir = self.config.root.join("probe");
        let slot = self.acquire_slot()?;
        let mut sandbox = self.open(&task_dir, Some(slot))?;
        let out = sandbox.run("true", None, Duration::from_secs(30))?;
        sandbox.close()?;
        if !out.success() {
            bail!(
                "bubblewrap ({}) cannot create a sandbox on this machine ({}): {}\n(it needs \
                 unprivileged user namespaces: sysctl kernel.unprivileged_userns_clone=1 and \
                 user.max_user_namespaces > 0)",
                self.bwrap.display(),
                super::describe_end(&out),
                out.output.trim()
            );
        }
        Ok(())
    }

    fn acquire_slot(&self) -> Result<u32> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let slot = (0..65_536)
            .find(|k| !slots.contains(k))
            .ok_or_else(|| anyhow!("65536 episodes at once: no free sandbox slot"))?;
        slots.insert(slot);
        Ok(slot)
    }

    /// A sandbox over `dir/workspace` (already filled) and `dir/home`.
    fn open(&self, dir: &Path, slot: Option<u32>) -> Result<LocalSandbox> {
        let workspace = dir.join("workspace");
        let home = dir.join("home");
        std::fs::create_dir_all(&workspace)
            .with_context(|| format!("creating {}", workspace.display()))?;
        std::fs::create_dir_all(&home).with_context(|| format!("creating {}", home.display()))?;
        let ids = match (self.as_root, slot) {
            (true, Some(slot)) => {
                let id = self.config.uid_base + slot;
                chown_tree(dir, id)?;
                Some(id)
            }
            _ => None,
        };
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        Ok(LocalSandbox {
            bwrap: self.bwrap.clone(),
            dir: dir.to_path_buf(),
            workspace,
            home,
            id: ids,
            limits: self.config.limits.clone(),
            read_only_binds: self.config.read_only_binds.clone(),
            slot: slot.map(|s| (s, self.slots.clone())),
            closed: false,
        })
    }
}

impl Drop for LocalEnvironment {
    /// The episodes' root goes when it is empty (every sandbox closed).
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.config.root);
    }
}

impl Environment for LocalEnvironment {
    fn name(&self) -> &'static str {
        "local"
    }

    fn limits(&self) -> &Limits {
        &self.config.limits
    }

    fn start(&self, task: &Task, episode: &str) -> Result<Box<dyn Sandbox>> {
        if let RepoSource::Toy { .. } = task.repo {
            bail!(
                "task {} ({}) is a toy task: it runs in process (`--tasks builtin:toy` picks the toy environment)",
                task.id,
                task.origin
            );
        }
        let RepoSource::Folder(repo) = &task.repo else {
            bail!(
                "task {} ({}) lives in a container image ({}): run it with --env docker",
                task.id,
                task.origin,
                task.image.as_deref().unwrap_or("no image")
            );
        };
        if episode.is_empty() || episode.contains('/') || episode.starts_with('.') {
            bail!("episode name {episode:?} cannot name a folder");
        }
        // Another environment of this process may have removed an empty root on drop.
        create_private_dir(&self.config.root)?;
        let dir = self.config.root.join(episode);
        if dir.exists() {
            force_remove(&dir)?;
        }
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        copy_tree(repo, &dir.join("workspace"))
            .with_context(|| format!("copying task {}'s repo {}", task.id, repo.display()))?;
        let slot = self.acquire_slot()?;
        let mut sandbox = match self.open(&dir, Some(slot)) {
            Ok(s) => s,
            Err(e) => {
                self.slots
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&slot);
                let _ = force_remove(&dir);
                return Err(e);
            }
        };
        run_setup(&mut sandbox, task, &self.config.limits)?;
        Ok(Box::new(sandbox))
    }
}

pub struct LocalSandbox {
    bwrap: PathBuf,
    dir: PathBuf,
    workspace: PathBuf,
    home: PathBuf,
    /// uid = gid the commands run as (root only).
    id: Option<u32>,
    limits: Limits,
    read_only_binds: Vec<PathBuf>,
    slot: Option<(u32, Arc<Mutex<BTreeSet<u32>>>)>,
    closed: bool,
}

impl LocalSandbox {
    /// The bwrap command line around `sh -c command`, `extra` binds added read-only.
    pub fn command(&self, command: &str, extra: &[(&Path, &str)]) -> Command {
        let mut c = Command::new(&self.bwrap);
        c.args(["--unshare-all", "--die-with-parent", "--new-session"]);
        for path in SYSTEM_PATHS {
            let p = Path::new(path);
            match std::fs::read_link(p) {
                Ok(target) => {
                    c.arg("--symlink").arg(target).arg(path);
                }
                Err(_) if p.is_dir() => {
                    c.args(["--ro-bind", path, path]);
                }
                Err(_) => {}
            }
        }
        c.args(["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]);
        // After /tmp's tmpfs, which would hide a bind under /tmp.
        for bind in &self.read_only_binds {
            c.arg("--ro-bind").arg(bind).arg(bind);
        }
        c.arg("--bind").arg(&self.workspace).arg(WORKDIR);
        c.arg("--bind").arg(&self.home).arg(HOME);
        for (host, inside) in extra {
            c.arg("--ro-bind").arg(host).arg(inside);
        }
        c.args(["--chdir", WORKDIR, "--clearenv"]);
        for (key, value) in [
            ("PATH", SANDBOX_PATH),
            ("HOME", HOME),
            ("LANG", "C.UTF-8"),
            ("TERM", "dumb"),
            ("PAGER", "cat"),
            ("GIT_PAGER", "cat"),
            ("PYTHONUNBUFFERED", "1"),
            // A same-size edit within one second would otherwise rerun a stale .pyc.
            ("PYTHONDONTWRITEBYTECODE", "1"),
        ] {
            c.args(["--setenv", key, value]);
        }
        c.args(["--", "sh", "-c", command]);
        if let Some(id) = self.id {
            c.uid(id).gid(id);
        }
        let limits = (
            self.limits.memory_bytes,
            self.limits.file_bytes,
            self.id.map(|_| self.limits.processes),
        );
        // SAFETY: the closure only calls setrlimit, which is async-signal-safe, and touches no
        // memory the parent could hold locked.
        unsafe {
            c.pre_exec(move || {
                let set = |resource, value: u64| {
                    let lim = libc::rlimit {
                        rlim_cur: value as libc::rlim_t,
                        rlim_max: value as libc::rlim_t,
                    };
                    if libc::setrlimit(resource, &lim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                };
                set(libc::RLIMIT_AS, limits.0)?;
                set(libc::RLIMIT_FSIZE, limits.1)?;
                set(libc::RLIMIT_CORE, 0)?;
                if let Some(processes) = limits.2 {
                    set(libc::RLIMIT_NPROC, processes)?;
                }
                Ok(())
            });
        }
        c
    }

    fn check_open(&self) -> Result<()> {
        if self.closed {
            bail!("the sandbox of {} is closed", self.dir.display());
        }
        Ok(())
    }
}

/// Killing bwrap kills its sandbox: the PID namespace's first process has `--die-with-parent`,
/// and every process in a PID namespace dies with the first.
fn kill_sandbox(child: &mut Child) {
    let _ = child.kill();
}

impl Sandbox for LocalSandbox {
    fn workdir(&self) -> &str {
        WORKDIR
    }

    fn limits(&self) -> &Limits {
        &self.limits
    }

    fn exec(
        &mut self,
        command: &str,
        stdin: Option<&[u8]>,
        timeout: Duration,
        output_bytes: usize,
    ) -> Result<CommandOutput> {
        self.check_open()?;
        run_captured(
            self.command(command, &[]),
            stdin,
            timeout,
            output_bytes,
            &self.limits,
            &kill_sandbox,
        )
    }

    fn copy_in(&mut self, host_dir: &Path) -> Result<()> {
        self.check_open()?;
        if !host_dir.is_dir() {
            bail!("{} is not a folder", host_dir.display());
        }
        // First make room where the agent left something `cp` cannot replace: a symlink or file
        // where the folder has a directory (`tests` -> elsewhere), a directory where it has a
        // file, a directory without write access (visited top-down, so parents come first).
        let script = format!(
            "chmod u+rwx {WORKDIR}; cd {COPY_SOURCE} && find . -mindepth 1 -exec sh -c 'for p; do w=\"{WORKDIR}/$p\"; \
             if [ -d \"$p\" ] && [ ! -L \"$p\" ]; then \
               if [ -L \"$w\" ] || {{ [ -e \"$w\" ] && [ ! -d \"$w\" ]; }}; then rm -f \"$w\"; fi; \
               if [ -d \"$w\" ]; then chmod u+rwx \"$w\"; fi; \
             elif [ -d \"$w\" ] && [ ! -L \"$w\" ]; then chmod -R u+rwx \"$w\"; rm -rf \"$w\"; fi; \
             done' sh {{}} +; cp -rT --remove-destination {COPY_SOURCE} {WORKDIR}"
        );
        let command = self.command(&script, &[(host_dir, COPY_SOURCE)]);
        let out = run_captured(
            command,
            None,
            Duration::from_secs(600),
            self.limits.output_bytes,
            &self.limits,
            &kill_sandbox,
        )?;
        if !out.success() {
            bail!(
                "copying {} into the workspace failed ({}): {}",
                host_dir.display(),
                super::describe_end(&out),
                out.output.trim()
            );
        }
        Ok(())
    }

    fn close(&mut self) -> Result<()> {
        if self.closed {
            return Ok(());
        }
        self.closed = true;
        let removed = force_remove(&self.dir);
        if let Some((slot, slots)) = self.slot.take() {
            slots
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&slot);
        }
        removed
    }
}

impl Drop for LocalSandbox {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

/// The episodes' root: others may pass through (each episode's uid reaches its own folder) but
/// not list it.
fn create_private_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))
        .with_context(|| format!("making {} private", dir.display()))
}

/// Copies files, folders and symlinks (as symlinks), keeping permission bits.
pub fn copy_tree(src: &Path, dst: &Path) -> Result<()> {
    std::fs::create_dir_all(dst).with_context(|| format!("creating {}", dst.display()))?;
    for entry in std::fs::read_dir(src).with_context(|| format!("reading {}", src.display()))? {
        let entry = entry?;
        let from = entry.path();
        let to = dst.join(entry.file_name());
        let kind = entry.file_type()?;
        if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&from)?, &to)
                .with_context(|| format!("linking {}", to.display()))?;
        } else if kind.is_dir() {
            copy_tree(&from, &to)?;
        } else {
            std::fs::copy(&from, &to)
                .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
        }
    }
    Ok(())
}

fn chown_tree(path: &Path, id: u32) -> Result<()> {
    std::os::unix::fs::lchown(path, Some(id), Some(id))
        .with_context(|| format!("chown {}", path.display()))?;
    if std::fs::symlink_metadata(path)?.is_dir() {
        for entry in std::fs::read_dir(path)? {
            chown_tree(&entry?.path(), id)?;
        }
    }
    Ok(())
}

/// Removes a tree even where the agent took the write bit off its folders.
fn force_remove(path: &Path) -> Result<()> {
    if std::fs::remove_dir_all(path).is_ok() || !path.exists() {
        return Ok(());
    }
    fn open_up(path: &Path) {
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            if meta.is_dir() {
                let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700));
                if let Ok(entries) = std::fs::read_dir(path) {
                    for entry in entries.flatten() {
                        open_up(&entry.path());
                    }
                }
            }
        }
    }
    open_up(path);
    std::fs::remove_dir_all(path).with_context(|| format!("removing {}", path.display()))
}
