//! The locating and carrying script run as grading runs it, on a virtual environment whose
//! site-packages holds copies of a work tree's packages; each refusal is a hole a red-team pass
//! found (a framework's or start-up's package, a folder distributions share, a path under a
//! link, code in a copy taken for library code).

use super::SCRIPT;
use std::path::{Path, PathBuf};
use std::process::Command;

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// A virtual environment (no pip) and its site-packages.
fn venv(dir: &Path) -> (PathBuf, PathBuf) {
    let status = Command::new("python3")
        .args(["-m", "venv", "--without-pip"])
        .arg(dir.join("venv"))
        .status()
        .expect("python3 is needed for this test");
    assert!(
        status.success(),
        "python3 -m venv failed (python3-venv is needed)"
    );
    let python = dir.join("venv/bin/python");
    let out = Command::new(&python)
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ])
        .output()
        .unwrap();
    (
        python,
        PathBuf::from(String::from_utf8(out.stdout).unwrap().trim()),
    )
}

/// `python -I [-S] -c SCRIPT ARGS` from `/`, as grading runs it; its stdout.
fn run(python: &Path, flags: &[&str], args: &[&str], stdin: &str) -> String {
    use std::io::Write;
    let mut child = Command::new(python)
        .args(flags)
        .arg("-c")
        .arg(SCRIPT)
        .args(args)
        .current_dir("/")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// A tree with packages `shapes` (copied), `shared` (its copy holds another distribution's
/// module too), `plug` (a pytest plugin's package) and `_distutils_hack` (loaded at start-up),
/// each with a same-size copy in site-packages.
fn layout(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let (python, site) = venv(dir);
    let tree = dir.join("tree");
    for package in ["shapes", "shared", "plug", "_distutils_hack"] {
        for (file, text) in [
            ("__init__.py", "A = 1\n"),
            ("area.py", "def f():\n    return 1\n"),
        ] {
            write(&tree.join(package).join(file), text);
            write(&site.join(package).join(file), text);
        }
    }
    write(&site.join("shared/other.py"), "# another distribution's\n");
    write(
        &site.join("plug-1.0.dist-info/METADATA"),
        "Metadata-Version: 2.1\nName: plug\nVersion: 1.0\n",
    );
    write(
        &site.join("plug-1.0.dist-info/entry_points.txt"),
        "[pytest11]\nplug = plug.area\n",
    );
    write(
        &site.join("shapes/__pycache__/area.cpython-311.pyc"),
        "stale",
    );
    (python, site, tree)
}

#[test]
fn only_a_copy_of_the_trees_own_package_is_located_and_the_change_reaches_only_it() {
    let dir = tempfile::tempdir().unwrap();
    let (python, site, tree) = layout(dir.path());
    let tree_arg = tree.to_str().unwrap();
    let located = run(&python, &["-I"], &["locate", tree_arg], "");
    let copies: Vec<super::InstalledCopy> = located
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let names: Vec<&str> = copies.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["shapes"], "{located}");
    assert_eq!(
        Path::new(&copies[0].location).canonicalize().unwrap(),
        site.join("shapes").canonicalize().unwrap()
    );
    // The change: one file edited, one added in a new folder, one deleted, a link, a file
    // under a link to a folder, and a path outside any copy.
    write(&tree.join("shapes/area.py"), "def f():\n    return 2\n");
    write(&tree.join("shapes/sub/new.py"), "B = 2\n");
    std::fs::remove_file(tree.join("shapes/__init__.py")).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", tree.join("shapes/link.py")).unwrap();
    std::os::unix::fs::symlink("/usr/lib", tree.join("shapes/lib")).unwrap();
    write(&tree.join("shared/area.py"), "def f():\n    return 3\n");
    let changes = serde_json::json!([
        ["M", "shapes/area.py"],
        ["A", "shapes/sub/new.py"],
        ["D", "shapes/__init__.py"],
        ["A", "shapes/link.py"],
        ["D", "shapes/lib/os.py"],
        ["M", "shared/area.py"]
    ]);
    let request = serde_json::json!({"copies": copies, "changes": changes}).to_string();
    let out = run(&python, &["-I", "-S"], &["carry", tree_arg], &request);
    assert!(out.contains("carried 3"), "{out}");
    assert!(out.contains(r#""path": "shapes/link.py""#), "{out}");
    assert!(
        out.contains(r#""why": "under a link in the tree""#),
        "{out}"
    );
    let read = |p: &str| std::fs::read_to_string(site.join(p)).ok();
    assert_eq!(
        read("shapes/area.py").as_deref(),
        Some("def f():\n    return 2\n")
    );
    assert_eq!(read("shapes/sub/new.py").as_deref(), Some("B = 2\n"));
    assert_eq!(read("shapes/__init__.py"), None);
    assert_eq!(read("shapes/__pycache__/area.cpython-311.pyc"), None);
    assert!(!site.join("shapes/link.py").exists() && !site.join("shapes/lib").exists());
    // Nothing reached the copies that were not located.
    assert_eq!(
        read("shared/area.py").as_deref(),
        Some("def f():\n    return 1\n")
    );
}

#[test]
fn code_in_a_copy_is_the_changes_for_the_graders_checks() {
    let dir = tempfile::tempdir().unwrap();
    write(
        &dir.path().join("swerve_grader_check.py"),
        include_str!("../grader_check.py"),
    );
    let check = "import swerve_grader_check as c, sys; \
        print(c._inside('/copy/pkg/a.py', '/work'), c._inside('/copy/pkgx/a.py', '/work'), \
        c._inside('/work/a.py', '/work'))";
    let out = Command::new("python3")
        .args(["-c", check])
        .env("PYTHONPATH", dir.path())
        .env("SWERVE_GRADER_COPIES", r#"["/copy/pkg"]"#)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "True False True",
        "{out:?}"
    );
}
