//! `swerve-train report` end to end: real runs (a rollout through the bubblewrap sandbox with a
//! replayed agent that prints hostile HTML and makes a format error, the oracle's resolved
//! rollout, a short `rl` toy run with `--save-rollouts`) written as pages, which headless
//! Chromium (Debian's `chromium`) opens: its DOM holds the conversation, with the planted
//! `<script>` and `</details>` as text, and a screenshot of the first episode's page lands in
//! `target/test-output/report/`. Bad input is an error naming the file and line.
//!
//! Chromium is required, not optional: without it the test fails saying how to install it
//! (`apt-get install chromium`; `SWERVE_CHROMIUM` names another binary).

mod common;

use common::bin_path;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Runs `swerve-train ARGS`, which must succeed; returns its stderr.
fn train(args: &[&str]) -> String {
    let out = Command::new(bin_path("swerve-train"))
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "swerve-train {args:?} failed:\n{stderr}"
    );
    stderr
}

/// Runs `swerve-train ARGS`, which must fail; returns its stderr.
fn train_fails(args: &[&str]) -> String {
    let out = Command::new(bin_path("swerve-train"))
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "swerve-train {args:?} succeeded:\n{stderr}"
    );
    stderr
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// Where this test leaves what a person may want to look at: `target/test-output/report/`.
fn output_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .join("test-output/report");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The Chromium binary: `SWERVE_CHROMIUM`, else Debian's `chromium`; a clear failure without.
fn chromium() -> PathBuf {
    let binary = std::env::var_os("SWERVE_CHROMIUM")
        .map_or_else(|| PathBuf::from("chromium"), PathBuf::from);
    let found = Command::new(&binary)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "{} not found: the report test opens the pages in headless Chromium. Install it with \
         `apt-get install chromium` (Debian's package; .ci/run does), or set SWERVE_CHROMIUM to a \
         Chromium binary",
        binary.display()
    );
    binary
}

/// Headless Chromium on `page` with `args` (a screenshot, or the DOM on stdout), killed past
/// two minutes.
fn run_chromium(page: &Path, args: &[String], profile: &Path) -> Output {
    let mut child = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(format!("file://{}", page.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            panic!("chromium on {} ran over two minutes", page.display());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "chromium {args:?} on {} failed:\n{}",
        page.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The DOM Chromium built from `page`, serialised.
fn rendered_dom(page: &Path, profile: &Path) -> String {
    String::from_utf8(run_chromium(page, &["--dump-dom".into()], profile).stdout).unwrap()
}

const WIDTH: u32 = 1280;
const HEIGHT: u32 = 1600;

/// A screenshot of `page` at WIDTH x HEIGHT into `png`; returns its bytes.
fn screenshot(page: &Path, png: &Path, profile: &Path) -> Vec<u8> {
    let _ = std::fs::remove_file(png);
    run_chromium(
        page,
        &[
            format!("--screenshot={}", png.display()),
            format!("--window-size={WIDTH},{HEIGHT}"),
        ],
        profile,
    );
    std::fs::read(png).unwrap_or_else(|e| panic!("chromium wrote no {}: {e}", png.display()))
}

/// CRC-32 (ISO-HDLC, as PNG uses), bitwise.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = 0xffff_ffffu32;
    for &b in bytes {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// Checks `png` is a whole PNG (signature, every chunk's CRC, IHDR first, IEND last) and
/// returns its (width, height).
fn png_size(png: &[u8]) -> (u32, u32) {
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    let mut at = 8;
    let mut names = Vec::new();
    let mut size = (0, 0);
    while at < png.len() {
        let len = u32::from_be_bytes(png[at..at + 4].try_into().unwrap()) as usize;
        let kind = &png[at + 4..at + 8];
        let data = &png[at + 8..at + 8 + len];
        let crc = u32::from_be_bytes(png[at + 8 + len..at + 12 + len].try_into().unwrap());
        assert_eq!(
            crc32(&png[at + 4..at + 8 + len]),
            crc,
            "chunk {:?} CRC",
            String::from_utf8_lossy(kind)
        );
        if kind == b"IHDR" {
            size = (
                u32::from_be_bytes(data[0..4].try_into().unwrap()),
                u32::from_be_bytes(data[4..8].try_into().unwrap()),
            );
        }
        names.push(String::from_utf8_lossy(kind).into_owned());
        at += 12 + len;
    }
    assert_eq!(names.first().map(String::as_str), Some("IHDR"), "{names:?}");
    assert_eq!(names.last().map(String::as_str), Some("IEND"), "{names:?}");
    assert!(names.iter().any(|n| n == "IDAT"), "{names:?}");
    size
}

/// The replayed agent of the first task: a command whose output is hostile HTML (the command's
/// text spells `<script>` apart, so only the observation has it whole), a call to a tool that
/// does not exist (a format error), an edit that puts HTML in the diff in a `.pth` file (flagged
/// suspicious by its path), then submit.
const REPLAY: &str = r#"{"task": "paginate-last-page", "tool_calls": [
  {"name": "bash", "arguments": {"command": "printf '<scr''ipt>document.title=\"pwned\"</scr''ipt></details><b>bold</b>\\n'; ls"}},
  {"name": "rm_rf", "arguments": {"path": "/"}},
  {"name": "str_replace_editor", "arguments": {"command": "create", "path": "notes.pth", "file_text": "<script>alert(1)</script>\nimport builtins\n"}}
]}"#;

#[test]
fn a_rollouts_report_opens_in_chromium_with_the_first_episodes_conversation() {
    let dir = tempfile::tempdir().unwrap();
    let replay = dir.path().join("replay.jsonl");
    std::fs::write(&replay, REPLAY.replace('\n', " ") + "\n").unwrap();
    let run = dir.path().join("run");
    let policy = format!("replay:{}", replay.display());
    train(&[
        "rollout",
        "--tasks",
        "builtin:python-bugs",
        "--limit-tasks",
        "1",
        "--group",
        "2",
        "--concurrency",
        "2",
        "--policy",
        &policy,
        "--out",
        run.to_str().unwrap(),
    ]);
    let html_dir = output_dir().join("rollout");
    let _ = std::fs::remove_dir_all(&html_dir);
    let stderr = train(&[
        "report",
        run.to_str().unwrap(),
        "--out",
        html_dir.to_str().unwrap(),
    ]);
    assert!(stderr.contains("wrote 2 episode pages"), "{stderr}");
    let index = read(&html_dir.join("index.html"));
    assert!(
        index.contains("<a href=\"rollout/index.html\">rollout</a>"),
        "{index}"
    );
    // A scripted policy's run records no model: its ids are the embedded Qwen2.5 tokenizer's.
    assert!(index.contains("the embedded Qwen2.5 tokenizer"), "{index}");
    let set = read(&html_dir.join("rollout/index.html"));
    assert!(set.contains("<code>paginate-last-page</code>"), "{set}");
    assert!(
        set.contains(
            "<a class=\"episode suspicious-episode\" href=\"episode-000001.html\">#0 · 0.00 · 4 turns · submitted · 1 format error ⚠</a>"
        ),
        "{set}"
    );

    let first = html_dir.join("rollout/episode-000001.html");
    let profile = dir.path().join("chromium-profile");
    let dom = rendered_dom(&first, &profile);
    std::fs::write(output_dir().join("rollout-episode-dom.html"), &dom).unwrap();
    for text in [
        // The suspicious flag, first, with its reason.
        "⚠ SUSPICIOUS",
        "notes.pth is a .pth file (run at interpreter start)",
        // The first user message (the task prompt), an assistant tool call and its observation.
        "The pager drops the last page when the number of items is not a multiple of the page size.",
        "<span class=\"tool-name\">bash</span>",
        "printf '&lt;scr''ipt&gt;document.title=\"pwned\"",
        "&lt;script&gt;document.title=\"pwned\"&lt;/script&gt;&lt;/details&gt;&lt;b&gt;bold&lt;/b&gt;",
        // The format error, marked and masked, and the scaffold's answer.
        "masked: not trained",
        "unknown tool `rm_rf`",
        // The edit, as a call and in the diff (coloured, escaped).
        "<code>create</code> <code>notes.pth</code>",
        "<span class=\"add\">+&lt;script&gt;alert(1)&lt;/script&gt;</span>",
        // Grading: submitted with the bug in place, so the hidden tests fail.
        "Verdict: <b class=\"unresolved\">not resolved</b>",
    ] {
        assert!(dom.contains(text), "the rendered DOM lacks {text:?}");
    }
    // Nothing planted became an element or ran.
    assert!(!dom.contains("<script"), "a script element in the DOM");
    assert!(!dom.contains("pwned</title>") && dom.contains("<title>paginate-last-page #0</title>"));
    assert!(!dom.contains("<b>bold</b>"));

    let png_path = output_dir().join("rollout-first-episode.png");
    let png = screenshot(&first, &png_path, &profile);
    assert_eq!(png_size(&png), (WIDTH, HEIGHT), "{}", png_path.display());
    // Non-trivial: far more than a blank page of the same size compresses to.
    let blank = dir.path().join("blank.html");
    std::fs::write(&blank, "<!DOCTYPE html><html><body></body></html>").unwrap();
    let blank_png = screenshot(&blank, &dir.path().join("blank.png"), &profile);
    assert_eq!(png_size(&blank_png), (WIDTH, HEIGHT));
    assert!(
        png.len() > 5 * blank_png.len() && png.len() > 20_000,
        "the screenshot {} is {} bytes, a blank page's {}",
        png_path.display(),
        png.len(),
        blank_png.len()
    );
}

#[test]
fn the_oracles_resolved_episodes_show_the_verdict_and_the_coloured_diff() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("oracle");
    train(&[
        "rollout",
        "--tasks",
        "builtin:python-bugs",
        "--limit-tasks",
        "2",
        "--group",
        "1",
        "--concurrency",
        "2",
        "--policy",
        "oracle",
        "--out",
        run.to_str().unwrap(),
    ]);
    // The default place: RUN/report.
    train(&["report", run.to_str().unwrap()]);
    let html_dir = run.join("report");
    let set = read(&html_dir.join("rollout/index.html"));
    assert!(
        set.contains("<td class=\"num resolved\">1 / 1</td>"),
        "{set}"
    );
    let page = read(&html_dir.join("rollout/episode-000001.html"));
    assert!(
        page.contains("Verdict: <b class=\"resolved\">resolved</b>"),
        "{page}"
    );
    assert!(
        page.contains("<span class=\"file\">diff --git a/"),
        "{page}"
    );
    assert!(
        page.contains("<span class=\"add\">+") && page.contains("<span class=\"del\">-"),
        "{page}"
    );
    assert!(page.contains("<h3>Test log"), "{page}");
    assert!(
        page.contains("<a href=\"episode-000002.html\">next episode →</a>"),
        "{page}"
    );
    // A second report replaces the first; a folder that is not a report is never written over.
    train(&["report", run.to_str().unwrap()]);
    let foreign = dir.path().join("mine");
    std::fs::create_dir(&foreign).unwrap();
    std::fs::write(foreign.join("notes.txt"), "keep").unwrap();
    let stderr = train_fails(&[
        "report",
        run.to_str().unwrap(),
        "--out",
        foreign.to_str().unwrap(),
    ]);
    assert!(stderr.contains("not a swerve report"), "{stderr}");
    assert_eq!(read(&foreign.join("notes.txt")), "keep");
}

#[test]
fn an_rl_runs_iterations_decode_with_the_runs_own_tokenizer() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("rl");
    train(&[
        "rl",
        "--model",
        "preset:toy",
        "--tasks",
        "builtin:toy",
        "--out",
        run.to_str().unwrap(),
        "--iterations",
        "2",
        "--no-rft-first",
        "--tasks-per-iteration",
        "2",
        "--group",
        "4",
        "--save-rollouts",
        "--seed",
        "0",
        "--device",
        "cpu",
    ]);
    let html_dir = output_dir().join("rl");
    let _ = std::fs::remove_dir_all(&html_dir);
    train(&[
        "report",
        run.to_str().unwrap(),
        "--out",
        html_dir.to_str().unwrap(),
    ]);
    let index = read(&html_dir.join("index.html"));
    for i in 1..=2 {
        assert!(
            index.contains(&format!(
                "<a href=\"iteration-{i:06}/index.html\">iteration {i} (dapo)</a>"
            )),
            "{index}"
        );
    }
    // preset:toy's own word-level tokenizer, from the model folder the run wrote.
    let tokenizer = run.join("base-model/tokenizer.json");
    assert!(index.contains(&tokenizer.display().to_string()), "{index}");
    let set = read(&html_dir.join("iteration-000001/index.html"));
    assert_eq!(set.matches("<a class=\"episode").count(), 8, "{set}");
    assert!(set.contains(" · A "), "the group advantages: {set}");
    // Every episode's tokens are decoded in spans by mask; the toy's calls are its words.
    let mut format_errors = 0;
    for n in 1..=8 {
        let page = read(&html_dir.join(format!("iteration-000001/episode-{n:06}.html")));
        assert!(
            page.contains("<span class=\"mask-1\""),
            "no trained span in episode {n}"
        );
        assert!(
            page.contains("<span class=\"mask-0\" title=\"tokens 0.."),
            "episode {n}"
        );
        assert!(page.contains("Decoded with"), "episode {n}");
        format_errors += page.matches("masked: not trained</span>").count();
    }
    // The random toy model writes about as many non-calls as calls.
    assert!(
        format_errors > 0,
        "no format error in 8 random toy episodes"
    );
}

#[test]
fn bad_input_is_an_error_naming_the_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    std::fs::create_dir(&run).unwrap();
    let stderr = train_fails(&["report", run.to_str().unwrap()]);
    assert!(
        stderr.contains("no episodes: expected trajectories.jsonl"),
        "{stderr}"
    );
    std::fs::write(
        run.join("iterations.jsonl"),
        "{\"iteration\": 1, \"phase\": \"dapo\"}\n",
    )
    .unwrap();
    let stderr = train_fails(&["report", run.to_str().unwrap()]);
    assert!(stderr.contains("rerun it with --save-rollouts"), "{stderr}");
    let good = r#"{"task": "t", "sample": 0, "reward": 0.0, "resolved": false, "turns": 1, "finish": "max_turns"}"#;
    let trajectories = run.join("trajectories.jsonl");
    for (second, want) in [
        (
            "{\"task\": \"t\", \"sample\": 1",
            "trajectories.jsonl:2: not valid JSON",
        ),
        (
            r#"{"task": "t", "sample": "one", "reward": 0.0, "resolved": false, "turns": 1, "finish": "max_turns"}"#,
            "trajectories.jsonl:2: `sample`: invalid type: string \"one\"",
        ),
        (
            r#"{"task": "t", "sample": 1, "reward": 0.0, "resolved": false, "finish": "max_turns"}"#,
            "trajectories.jsonl:2: no `turns`",
        ),
        (
            r#"{"task": "t", "sample": 1, "reward": 0.0, "resolved": false, "turns": 1, "finish": "max_turns", "tokens": [1, 2], "action_mask": [1]}"#,
            "trajectories.jsonl:2: 2 tokens but 1 action_mask entries",
        ),
    ] {
        std::fs::write(&trajectories, format!("{good}\n{second}\n")).unwrap();
        let stderr = train_fails(&["report", run.to_str().unwrap()]);
        assert!(stderr.contains(want), "{want:?} not in {stderr}");
    }
    let stderr = train_fails(&["report", dir.path().join("absent").to_str().unwrap()]);
    assert!(stderr.contains("absent: no such folder"), "{stderr}");
}
