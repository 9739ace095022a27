//! Integration tests of the local bubblewrap sandbox (`swerve::env::local`); they need root and
//! /usr/bin/bwrap. Every hostile command must come back as a plain observation (an exit status,
//! `timed_out` or `output_overflow`, with output saying why), leave no process behind (checked on
//! the host's /proc: by the episode's uid, and by a marker the command puts in its children's
//! argv), and leave the next command and the next episode working. Each test has its own
//! LocalConfig root (under a tempdir) and its own uid range, so the tests run in parallel.

use std::io::ErrorKind;
use std::ops::Range;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use swerve::env::diff::{filter_diff, raw_diff, snapshot};
use swerve::env::grading::grade_fresh;
use swerve::env::local::{LocalConfig, LocalEnvironment};
use swerve::env::{
    describe_end, load_tasks, CommandOutput, Environment, Grading, Limits, Sandbox, Task,
};

const BUGGY: &str = "def div(a, b):\n    return a * b\n";
// Not BUGGY's size: an edit of the same size in the same second would run a stale .pyc.
const FIXED: &str = "def div(a, b):\n    return a / b  # fixed\n";
const REAL_TEST: &str = "import unittest\nfrom calc import div\n\n\nclass T(unittest.TestCase):\n    def test_div(self):\n        self.assertEqual(div(6, 3), 2)\n";
const FAKE_TEST: &str =
    "import unittest\n\n\nclass T(unittest.TestCase):\n    def test_div(self):\n        pass\n";
const TEST_COMMAND: &str = "python3 -m unittest -v tests.test_x";
const SECOND: Duration = Duration::from_secs(1);

fn limits() -> Limits {
    Limits {
        command_timeout: Duration::from_secs(10),
        output_bytes: 4096,
        output_kill_bytes: 1 << 20,
        memory_bytes: 1 << 30,
        processes: 64,
        file_bytes: 1 << 20,
    }
}

struct Fx {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    env: LocalEnvironment,
    task: Task,
    uids: Range<u32>,
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// A task (calc.py whose `div` multiplies, tests/test_x.py) and an environment over a fresh root;
/// `bind_root` also binds that root read-only into every sandbox (to test its permissions).
fn fixture(uid_base: u32, limits: Limits, bind_root: bool) -> Fx {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write(&dir.join("repo/calc.py"), BUGGY);
    write(&dir.join("tests/tests/__init__.py"), "");
    write(&dir.join("tests/tests/test_x.py"), REAL_TEST);
    let root = dir.join("root");
    std::fs::create_dir_all(&root).unwrap();
    let config = LocalConfig {
        limits,
        root: root.clone(),
        read_only_binds: if bind_root {
            vec![root.clone()]
        } else {
            vec![]
        },
        uid_base,
    };
    let env = LocalEnvironment::new(config).expect("a bubblewrap sandbox (root, bwrap installed)");
    // Through the task file format (not a struct literal): new Task fields take their defaults.
    write(
        &dir.join("tasks.jsonl"),
        &format!(
            r#"{{"id": "div", "repo": "repo", "tests": "tests", "problem_statement": "div multiplies", "test_command": "{TEST_COMMAND}", "timeout_s": 30}}"#
        ),
    );
    let task = load_tasks(&dir.join("tasks.jsonl")).unwrap().remove(0);
    Fx {
        _tmp: tmp,
        root,
        env,
        task,
        uids: uid_base..uid_base + 8,
    }
}

impl Fx {
    fn start(&self, episode: &str) -> Box<dyn Sandbox> {
        self.env.start(&self.task, episode).unwrap()
    }

    /// Waits (3 s at most) until no live host process runs as one of this env's uids or has
    /// `marker` in its argv.
    fn assert_nothing_left(&self, marker: &str) {
        let deadline = Instant::now() + 3 * SECOND;
        loop {
            let left = live_processes(&self.uids, marker);
            if left.is_empty() {
                return;
            }
            if Instant::now() > deadline {
                panic!("processes of the episode survived: {left:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Live (not zombie) host processes, as (pid, uid, argv), whose real uid is in `uids` or whose
/// argv contains `marker` (when not empty).
fn live_processes(uids: &Range<u32>, marker: &str) -> Vec<(u32, u32, String)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        let field = |name: &str| {
            let line = status
                .lines()
                .find(|l| l.starts_with(name))
                .unwrap_or_default();
            line[name.len()..]
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_string()
        };
        if field("State:") == "Z" {
            continue;
        }
        let uid: u32 = field("Uid:").parse().unwrap_or(0);
        let argv = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let argv = String::from_utf8_lossy(&argv).replace('\0', " ");
        if uids.contains(&uid) || (!marker.is_empty() && argv.contains(marker)) {
            found.push((pid, uid, argv));
        }
    }
    found
}

/// A name no other process on the host has.
fn marker(what: &str) -> String {
    format!("swerve-mark-{what}-{}", std::process::id())
}

/// Shell text starting `sleep 1000` in the background under the name `/tmp/MARKER`.
fn sleeper(marker: &str) -> String {
    format!("ln -s /bin/sleep /tmp/{marker}; /tmp/{marker} 1000 & ")
}

fn run(sb: &mut Box<dyn Sandbox>, command: &str) -> CommandOutput {
    let timeout = sb.limits().command_timeout;
    sb.run(command, None, timeout).unwrap()
}

fn ok(sb: &mut Box<dyn Sandbox>, command: &str) -> String {
    let out = run(sb, command);
    assert!(out.success(), "`{command}` failed: {out:?}");
    out.output
}

fn fails(sb: &mut Box<dyn Sandbox>, command: &str, says: &str) -> CommandOutput {
    let out = run(sb, command);
    assert!(
        !out.success() && out.exit_code.is_some(),
        "`{command}` should fail: {out:?}"
    );
    assert!(
        out.output.contains(says),
        "`{command}` should say {says:?}: {out:?}"
    );
    out
}

#[test]
fn writes_outside_the_workspace_neither_reach_the_host_nor_persist() {
    let fx = fixture(310_000, limits(), false);
    let passwd = std::fs::read("/etc/passwd").unwrap();
    let mut sb = fx.start("ep");
    for dir in ["/etc", "/usr", "/usr/local", "/bin", "/lib"] {
        fails(
            &mut sb,
            &format!("echo x > {dir}/swerve-x"),
            "Read-only file system",
        );
        assert!(!Path::new(dir).join("swerve-x").exists());
    }
    ok(&mut sb, "ln -s /etc/passwd pw");
    fails(&mut sb, "echo pwned >> pw", "cannot create pw");
    // /tmp and / are per-command: gone in the next command, never on the host.
    assert_eq!(ok(&mut sb, "echo t > /tmp/f && cat /tmp/f"), "t\n");
    fails(&mut sb, "cat /tmp/f", "No such file");
    run(
        &mut sb,
        "echo r > /swerve-root-x; echo e > /workspace/../swerve-escape",
    );
    ok(
        &mut sb,
        "test ! -e /swerve-root-x && test ! -e /swerve-escape",
    );
    assert!(!Path::new("/swerve-root-x").exists() && !Path::new("/swerve-escape").exists());
    let mut entries: Vec<_> = std::fs::read_dir(fx.root.join("ep"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    entries.sort();
    assert_eq!(entries, ["home", "workspace"]);
    // $HOME persists across the episode's commands, and is not another episode's.
    ok(&mut sb, "echo h > $HOME/note");
    assert_eq!(ok(&mut sb, "cd /; cat $HOME/note"), "h\n");
    let mut other = fx.start("ep2");
    assert_eq!(ok(&mut other, "echo $HOME; ls -A $HOME"), "/home/agent\n");
    fails(&mut other, "cat /home/agent/note", "No such file");
    sb.close().unwrap();
    other.close().unwrap();
    assert_eq!(std::fs::read("/etc/passwd").unwrap(), passwd);
    fx.assert_nothing_left("");
}

#[test]
fn no_network_not_even_the_host_loopback() {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixListener};
    let fx = fixture(320_000, limits(), false);
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    tcp.set_nonblocking(true).unwrap();
    let port = tcp.local_addr().unwrap().port();
    let name = marker("unix");
    let unix = UnixListener::bind_addr(&SocketAddr::from_abstract_name(&name).unwrap()).unwrap();
    unix.set_nonblocking(true).unwrap();
    let script = format!(
        r#"import socket
def tcp(host, port):
    try:
        socket.create_connection((host, port), timeout=3)
        return "CONNECTED"
    except OSError as e:
        return type(e).__name__
print("loopback", tcp("127.0.0.1", {port}))
print("external", tcp("1.1.1.1", 53))
try:
    socket.getaddrinfo("example.com", 80)
    print("dns RESOLVED")
except OSError as e:
    print("dns", type(e).__name__)
s = socket.socket(socket.AF_UNIX)
try:
    s.connect("\0{name}")
    print("abstract CONNECTED")
except OSError as e:
    print("abstract", type(e).__name__)
"#
    );
    let mut sb = fx.start("ep");
    let out = sb
        .run("python3 -", Some(script.as_bytes()), 10 * SECOND)
        .unwrap();
    assert!(out.success(), "{out:?}");
    for line in [
        "loopback ConnectionRefusedError",
        "external OSError",
        "dns gaierror",
        "abstract",
    ] {
        assert!(
            out.output.contains(line),
            "{line:?} missing: {}",
            out.output
        );
    }
    assert!(
        !out.output.contains("CONNECTED") && !out.output.contains("RESOLVED"),
        "{}",
        out.output
    );
    let interfaces = ok(
        &mut sb,
        "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '",
    );
    assert_eq!(interfaces, "lo\n");
    // Nothing arrived on the host; and the listeners were reachable from the host itself.
    assert_eq!(tcp.accept().unwrap_err().kind(), ErrorKind::WouldBlock);
    assert_eq!(unix.accept().unwrap_err().kind(), ErrorKind::WouldBlock);
    std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    std::os::unix::net::UnixStream::connect_addr(&SocketAddr::from_abstract_name(&name).unwrap())
        .unwrap();
    drop(sb);
    fx.assert_nothing_left("");
}

#[test]
fn a_burst_of_processes_stops_at_the_process_limit() {
    let lim = Limits {
        command_timeout: 30 * SECOND,
        processes: 64,
        ..limits()
    };
    let fx = fixture(330_000, lim, false);
    let m = marker("burst");
    let mut sb = fx.start("ep");
    // Sample the episode's processes on the host while the burst runs (an upper bound only: a
    // loaded host may sample too rarely to see the peak).
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (stop, uids) = (stop.clone(), fx.uids.clone());
        std::thread::spawn(move || {
            let mut most = 0;
            while !stop.load(Ordering::SeqCst) {
                most = most.max(live_processes(&uids, "").len());
                std::thread::sleep(Duration::from_millis(2));
            }
            most
        })
    };
    // dash fails at the first fork the limit refuses ("Cannot fork"), where bash would retry for
    // 15 s; every sleep it started is alive until the command ends, so the "started" lines count
    // the episode's processes at once, whatever the host's load.
    let command = format!(
        "ln -s /bin/sleep /tmp/{m}; sh -c 'for i in $(seq 5000); do /tmp/{m} 30 & echo \"started $!\"; done; echo finished'"
    );
    let out = run(&mut sb, &command);
    stop.store(true, Ordering::SeqCst);
    let most = watcher.join().unwrap();
    let started = out.output.matches("started ").count();
    assert!(
        !out.success() && !out.timed_out && !out.output.contains("finished"),
        "{out:?}"
    );
    assert!(out.output.contains("Cannot fork"), "{out:?}");
    assert!(
        started > 48 && started < 64,
        "{started} processes started at once under a limit of 64: {out:?}"
    );
    assert!(most <= 64, "{most} processes of the episode at once");
    fx.assert_nothing_left(&m);
    assert!(std::process::Command::new("true")
        .status()
        .unwrap()
        .success());
    assert_eq!(
        ok(
            &mut sb,
            "for i in 1 2 3 4 5 6 7 8; do sleep 0.1 & done; wait; echo ok"
        ),
        "ok\n"
    );
    drop(sb);
    let mut next = fx.start("ep-next");
    assert_eq!(ok(&mut next, "echo ok"), "ok\n");
}

fn high_water_mark_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 1024
}

#[test]
fn a_flood_of_output_is_cut_and_killed() {
    let fx = fixture(340_000, limits(), false);
    let mut sb = fx.start("ep");
    for command in ["yes", "head -c 3G /dev/zero | tr '\\0' x", "yes >&2"] {
        let out = run(&mut sb, command);
        assert!(
            out.output_overflow && !out.timed_out && out.exit_code.is_none(),
            "{out:?}"
        );
        assert_eq!(describe_end(&out), "killed for printing too much output");
        assert!(out.elapsed < 5 * SECOND, "{command}: {:?}", out.elapsed);
        assert!(
            out.output.len() < 4096 + 100,
            "{command}: {} bytes",
            out.output.len()
        );
        assert!(out.output.contains("bytes of output omitted"), "{command}");
        assert!(
            out.omitted_bytes >= (1 << 20) - 4096,
            "{command}: {}",
            out.omitted_bytes
        );
        fx.assert_nothing_left("");
    }
    assert!(
        high_water_mark_bytes() < 512 << 20,
        "{} bytes",
        high_water_mark_bytes()
    );
    assert_eq!(ok(&mut sb, "echo ok"), "ok\n");
}

#[test]
fn endless_commands_time_out_and_leave_nothing() {
    let fx = fixture(350_000, limits(), false);
    let m = marker("endless");
    let mut sb = fx.start("ep");
    let cases = [
        "sleep 1000".to_string(),
        format!("trap '' TERM INT HUP; {} while :; do :; done", sleeper(&m)),
        format!(
            "ln -s /bin/sleep /tmp/{m}; setsid nohup /tmp/{m} 1000 >/dev/null 2>&1 & sleep 1000"
        ),
    ];
    for command in &cases {
        let out = sb.run(command, None, SECOND).unwrap();
        assert!(
            out.timed_out && out.exit_code.is_none() && !out.success(),
            "{out:?}"
        );
        assert!(
            out.elapsed >= SECOND && out.elapsed < 3 * SECOND,
            "{:?}",
            out.elapsed
        );
        assert!(
            describe_end(&out).starts_with("timed out after"),
            "{}",
            describe_end(&out)
        );
        fx.assert_nothing_left(&m);
    }
    // A command that leaves a child behind ends with its shell, and takes the child along.
    let out = sb
        .run(&format!("{} echo started", sleeper(&m)), None, 10 * SECOND)
        .unwrap();
    assert!(out.success() && out.output == "started\n", "{out:?}");
    assert!(out.elapsed < SECOND, "{:?}", out.elapsed);
    fx.assert_nothing_left(&m);
    assert_eq!(ok(&mut sb, "echo ok"), "ok\n");
}

#[test]
fn episodes_cannot_see_each_other() {
    // The root is bound into every sandbox, so only permissions keep A's folder from B.
    let fx = fixture(360_000, limits(), true);
    let root = fx.root.display().to_string();
    let (mut a, mut b) = (fx.start("ep-a"), fx.start("ep-b"));
    let (uid_a, uid_b) = (ok(&mut a, "id -u"), ok(&mut b, "id -u"));
    assert_eq!((uid_a.trim(), uid_b.trim()), ("360000", "360001"));
    ok(
        &mut a,
        "echo TOPSECRET > secret.txt; echo TOPSECRET > $HOME/secret.txt; chmod 644 secret.txt",
    );
    assert!(ok(&mut b, &format!("ls {root}/ep-b/workspace")).contains("calc.py"));
    // A runs a command (and a background process) while B looks for it.
    let m = marker("iso");
    let command = format!("{} sleep 3; echo done", sleeper(&m));
    let episode_a = std::thread::spawn(move || {
        let out = a.run(&command, None, 10 * SECOND).unwrap();
        (a, out)
    });
    let deadline = Instant::now() + 3 * SECOND;
    let pid = loop {
        let found = live_processes(&(0..0), &m);
        if let Some((pid, _, _)) = found.iter().find(|p| p.2.starts_with(&format!("/tmp/{m}"))) {
            break *pid;
        }
        assert!(
            Instant::now() < deadline,
            "A's sleeper never started: {found:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    for command in [
        format!("cat {root}/ep-a/workspace/secret.txt"),
        format!("cat {root}/ep-a/home/secret.txt"),
        format!("ls {root}/ep-a"),
        format!("ls {root}"),
        format!("cat /proc/{pid}/root/workspace/secret.txt"),
        format!("cat /proc/{pid}/cwd/secret.txt"),
        format!("kill -9 {pid}"),
    ] {
        let out = run(&mut b, &command);
        assert!(
            !out.success() && !out.output.contains("TOPSECRET"),
            "`{command}`: {out:?}"
        );
    }
    let ps = ok(&mut b, "ps -e -o args=");
    assert!(!ps.contains(&m) && ps.lines().count() <= 4, "B sees: {ps}");
    assert!(
        Path::new(&format!("/proc/{pid}")).exists(),
        "B's kill reached A"
    );
    let (mut a, out) = episode_a.join().unwrap();
    assert!(out.success() && out.output == "done\n", "{out:?}");
    fx.assert_nothing_left(&m);
    assert_eq!(ok(&mut a, "cat secret.txt"), "TOPSECRET\n");
}

#[test]
fn memory_past_the_limit_is_a_memory_error() {
    let fx = fixture(
        370_000,
        Limits {
            memory_bytes: 512 << 20,
            ..limits()
        },
        false,
    );
    let mut sb = fx.start("ep");
    let out = fails(
        &mut sb,
        "python3 -c 'x = bytearray(1 << 30)'",
        "MemoryError",
    );
    assert_eq!(out.exit_code, Some(1));
    assert_eq!(
        ok(&mut sb, "python3 -c 'print(len(bytearray(64 << 20)))'"),
        "67108864\n"
    );
    drop(sb);
    fx.assert_nothing_left("");
}

#[test]
fn files_past_the_size_limit_are_cut() {
    let fx = fixture(380_000, limits(), false);
    let mut sb = fx.start("ep");
    for path in ["big", "/tmp/big", "$HOME/big"] {
        let out = fails(
            &mut sb,
            &format!("head -c 10M /dev/zero > {path}"),
            "File size limit",
        );
        assert_ne!(out.exit_code, Some(0));
    }
    assert_eq!(
        std::fs::metadata(fx.root.join("ep/workspace/big"))
            .unwrap()
            .len(),
        1 << 20
    );
    assert_eq!(
        ok(&mut sb, "head -c 1000 /dev/zero > small && wc -c < small"),
        "1000\n"
    );
}

#[test]
fn close_removes_a_locked_workspace_and_refuses_commands() {
    let fx = fixture(390_000, limits(), false);
    let mut sb = fx.start("ep");
    ok(
        &mut sb,
        "mkdir -p a/b/c && touch a/b/c/f a/g && chmod 000 a/b/c && chmod 555 a/b a",
    );
    run(&mut sb, "chmod -R 000 /workspace /home/agent");
    let dir = fx.root.join("ep");
    let mode = |p: PathBuf| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(
        (mode(dir.join("workspace")), mode(dir.join("home"))),
        (0, 0)
    );
    sb.close().unwrap();
    assert!(!dir.exists());
    let err = sb.run("echo hi", None, SECOND).unwrap_err().to_string();
    assert!(err.contains("closed"), "{err}");
    assert!(sb.copy_in(fx.root.as_path()).is_err());
    sb.close().unwrap();
    // The same episode name starts over from the task's repo; dropping closes too.
    let mut again = fx.start("ep");
    assert_eq!(ok(&mut again, "ls -A; ls -A $HOME"), "calc.py\n");
    drop(again);
    assert!(!dir.exists());
    fx.assert_nothing_left("");
}

/// Grades the agent's change in a fresh sandbox (an error fails the test: the agent's state
/// must not stop grading) and says whether it resolved, checking the real test ran.
fn resolved(fx: &Fx, sb: &mut Box<dyn Sandbox>, tree: &str) -> bool {
    let Grading::Tests(plan) = &fx.task.grading else {
        panic!("a task with tests")
    };
    let raw = raw_diff(sb.as_mut(), tree).unwrap().unwrap();
    let diff = filter_diff(&raw, &plan.owned_paths().unwrap());
    let g = grade_fresh(&fx.env, &fx.task, plan, &diff.patch, "grade").unwrap();
    // The real test ran (the fake one has no `div` call to fail).
    assert!(g.output.output.contains("test_div"), "{g:?}");
    assert!(
        g.resolved || g.output.output.contains("AssertionError"),
        "{g:?}"
    );
    g.resolved
}

/// Writes `text` to `path` through a command's stdin, as an agent's file edit does.
fn put(sb: &mut Box<dyn Sandbox>, path: &str, text: &str) {
    let out = sb
        .run(&format!("cat > {path}"), Some(text.as_bytes()), 5 * SECOND)
        .unwrap();
    assert!(out.success(), "{out:?}");
}

#[test]
fn grading_uses_the_real_tests_whatever_the_agent_did_to_them() {
    let fx = fixture(400_000, limits(), false);
    let mut sb = fx.start("ep");
    let tree = snapshot(sb.as_mut()).unwrap();
    assert!(!resolved(&fx, &mut sb, &tree));
    // Writing a passing test file where the hidden one goes passes the test command, but not
    // grading (grading never touches this workspace: the tests are not here).
    ok(&mut sb, "mkdir tests && touch tests/__init__.py");
    put(&mut sb, "tests/test_x.py", FAKE_TEST);
    ok(&mut sb, TEST_COMMAND);
    assert!(!resolved(&fx, &mut sb, &tree));
    // Nor does replacing `tests` with a symlink to a folder of passing tests.
    ok(
        &mut sb,
        "mkdir $HOME/fake && touch $HOME/fake/__init__.py && rm -r tests && ln -s $HOME/fake tests",
    );
    put(&mut sb, "tests/test_x.py", FAKE_TEST);
    ok(&mut sb, TEST_COMMAND);
    assert!(!resolved(&fx, &mut sb, &tree));
    // Nor read-only folders and files, nor a folder where the test file goes.
    let mut ro = fx.start("ep-ro");
    let ro_tree = snapshot(ro.as_mut()).unwrap();
    ok(&mut ro, "mkdir tests && touch tests/__init__.py");
    put(&mut ro, "tests/test_x.py", FAKE_TEST);
    ok(
        &mut ro,
        "chmod 444 tests/test_x.py && chmod 555 tests /workspace",
    );
    ok(&mut ro, TEST_COMMAND);
    assert!(!resolved(&fx, &mut ro, &ro_tree));
    ok(
        &mut ro,
        "chmod 755 /workspace tests && rm -rf tests && mkdir -p tests/test_x.py/x && chmod 000 tests/test_x.py",
    );
    assert!(!resolved(&fx, &mut ro, &ro_tree));
    // A real fix, written through `run` with stdin, resolves in both.
    for (sandbox, tree) in [(&mut sb, &tree), (&mut ro, &ro_tree)] {
        put(sandbox, "calc.py", FIXED);
        assert!(resolved(&fx, sandbox, tree));
    }
    drop((sb, ro));
    fx.assert_nothing_left("");
}

#[test]
fn missing_bubblewrap_is_a_clear_error() {
    if std::env::var_os("SWERVE_TEST_NO_BWRAP").is_some() {
        // The child: PATH has no bwrap.
        let tmp = tempfile::tempdir().unwrap();
        let config = LocalConfig {
            root: tmp.path().join("root"),
            ..LocalConfig::new(limits())
        };
        let err = format!(
            "{:#}",
            LocalEnvironment::new(config)
                .err()
                .expect("no bwrap: an error")
        );
        println!("ERROR: {err}");
        assert!(
            err.contains("bubblewrap") && err.contains("`bwrap` is not on PATH"),
            "{err}"
        );
        assert!(!tmp.path().join("root").exists());
        return;
    }
    // PATH is process-wide: change it in a child run of this one test, not under the others.
    let empty = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "missing_bubblewrap_is_a_clear_error",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("SWERVE_TEST_NO_BWRAP", "1")
        .env("PATH", empty.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("1 passed") && stdout.contains("needs bubblewrap"),
        "{stdout}"
    );
}
