//! Every command line of `swerve-train`, `swerve-serve` and `swerve-bench` that README.md and
//! `docs/*.md` show in a fenced code block parses with the current command-line interface
//! (issue 28 item 4). Nothing runs: each binary is started once per command line with
//! `SWERVE_PARSE_ONLY=1` (src/parse_only.rs), which parses the arguments with clap and exits 0
//! (or 2 with clap's error) before it reads a file or loads a model. Placeholders such as `DIR`
//! or `IN.jsonl` are fine: only parsing is checked.
//!
//! What counts as a command line, in a fenced block:
//! - lines joined at a trailing `\`; a leading `$ ` is a prompt (in a block that has prompts, or
//!   is marked `text`/`console`, only prompt lines are commands: the rest is output);
//! - shell words as `sh` splits them (quotes, `\`, `$(...)`), a `#` starting a word begins a
//!   comment, `|`, `;`, `&&` and `&` separate commands, redirections are skipped;
//! - in each command, after `NAME=value` assignments: the binary itself (`swerve-train`, or a path
//!   ending in it), `cargo run ... --bin swerve-train -- ARGS` (`cargo build --bin` and `cargo
//!   test` are builds, not runs), or a known launcher (`torchrun`, `srun`, `sudo`, `docker run`,
//!   ...) followed somewhere by the binary; a binary named after any other command is an error
//!   until that command is listed here as a launcher or as one that only handles files;
//! - in any block, an exec-form array (`["swerve-train", "rl", ...]`, as YAML and Dockerfiles
//!   write it), read as JSON.
//!
//! A line that shows an error on purpose ends with `# fails: TEXT`: it must exit 2 and its error
//! must contain TEXT.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The binaries whose command lines are checked.
const BINARIES: &[&str] = &["swerve-train", "swerve-serve", "swerve-bench"];
/// Commands that run the program named after them (and their own flags before it).
const LAUNCHERS: &[&str] = &[
    "torchrun", "srun", "mpirun", "sudo", "env", "exec", "time", "nohup", "timeout", "nice",
    "numactl", "taskset", "docker", "podman", "kubectl", "ssh",
];
/// Commands that take a binary's path as a file, not as a program to run.
const FILE_COMMANDS: &[&str] = &[
    "cp",
    "mv",
    "ln",
    "ls",
    "rm",
    "install",
    "chmod",
    "strip",
    "file",
    "ldd",
    "du",
    "scp",
    "rsync",
    "tar",
    "which",
    "readelf",
    "objdump",
    "cat",
    "stat",
    "sha256sum",
    "echo",
    "grep",
];
/// Fence languages of shell text; the first ones show a session (commands on `$ ` lines only).
const SESSION_LANGUAGES: &[&str] = &["text", "txt", "console", "shell-session", "sh-session"];
const SHELL_LANGUAGES: &[&str] = &["", "sh", "bash", "shell", "zsh"];
/// How long a parse may take before the binary is taken to be running for real.
const PARSE_TIMEOUT: Duration = Duration::from_secs(60);

/// One command line of a documented binary.
#[derive(Debug, Clone, PartialEq)]
struct Invocation {
    /// `docs/x.md:12`: where the command line starts.
    place: String,
    binary: String,
    args: Vec<String>,
    /// `# fails: TEXT`: the command must fail with TEXT in its error.
    expected_error: Option<String>,
}

/// A fenced code block: its language and its lines with their 1-based line numbers.
struct Block {
    /// The line of its opening fence.
    fence_line: usize,
    language: String,
    lines: Vec<(usize, String)>,
}

/// The fenced code blocks of a Markdown text (``` or ~~~, indented or not); an unclosed fence is
/// an error naming its line.
fn fenced_blocks(file: &str, text: &str) -> Result<Vec<Block>, String> {
    let mut blocks = Vec::new();
    let mut open: Option<(char, usize, usize, Block)> = None; // fence char, length, indent
    for (index, line) in text.lines().enumerate() {
        let number = index + 1;
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        let fence_char = trimmed.chars().next().filter(|c| *c == '`' || *c == '~');
        let fence_len = fence_char.map_or(0, |c| trimmed.chars().take_while(|&x| x == c).count());
        match &mut open {
            None if fence_len >= 3 => {
                let info = trimmed[fence_len..].trim();
                let language = info.split_whitespace().next().unwrap_or("").to_lowercase();
                let block = Block {
                    fence_line: number,
                    language,
                    lines: Vec::new(),
                };
                open = Some((fence_char.unwrap(), fence_len, indent, block));
            }
            None => {}
            Some((c, len, _, _))
                if fence_char == Some(*c)
                    && fence_len >= *len
                    && trimmed[fence_len..].trim().is_empty() =>
            {
                blocks.push(open.take().unwrap().3);
            }
            Some((_, _, fence_indent, block)) => {
                let cut = indent.min(*fence_indent);
                block.lines.push((number, line[cut..].to_string()));
            }
        }
    }
    match open {
        Some((_, _, _, block)) => Err(format!(
            "{file}:{}: a code fence that is never closed",
            block.fence_line
        )),
        None => Ok(blocks),
    }
}

/// The block's shell lines, continuations joined: (line number of the first, text).
fn logical_lines(block: &Block) -> Vec<(usize, String)> {
    let session = SESSION_LANGUAGES.contains(&block.language.as_str())
        || block
            .lines
            .iter()
            .any(|(_, l)| l.trim_start().starts_with("$ "));
    let mut joined: Vec<(usize, String)> = Vec::new();
    let mut continuing = false;
    for (number, line) in &block.lines {
        let (text, continues) = match line.trim_end().strip_suffix('\\') {
            Some(head) => (head.to_string(), true),
            None => (line.trim_end().to_string(), false),
        };
        match joined.last_mut() {
            Some(last) if continuing => {
                last.1.push(' ');
                last.1.push_str(text.trim_start());
            }
            _ => joined.push((*number, text)),
        }
        continuing = continues;
    }
    if !session {
        return joined;
    }
    joined
        .into_iter()
        .filter_map(|(n, l)| {
            l.trim_start()
                .strip_prefix("$ ")
                .map(|c| (n, c.to_string()))
        })
        .collect()
}

/// A shell line split as `sh` would: simple commands of words, and the comment, if any.
#[derive(Debug, Default, PartialEq)]
struct ShellLine {
    commands: Vec<Vec<String>>,
    comment: Option<String>,
}

/// The state of [`shell_split`]: the line so far, the command and the word being read.
#[derive(Default)]
struct Splitter {
    line: ShellLine,
    command: Vec<String>,
    word: String,
    in_word: bool,
    /// The next word is a redirection's target, not an argument.
    skip_next_word: bool,
}

impl Splitter {
    fn end_word(&mut self) {
        if self.in_word && !std::mem::take(&mut self.skip_next_word) {
            self.command.push(std::mem::take(&mut self.word));
        }
        self.word.clear();
        self.in_word = false;
    }

    fn end_command(&mut self) {
        self.end_word();
        if !self.command.is_empty() {
            self.line.commands.push(std::mem::take(&mut self.command));
        }
    }

    fn push(&mut self, chars: &[char]) {
        self.word.extend(chars);
        self.in_word = true;
    }
}

/// Splits a shell line into commands and words (quotes, escapes, `$(...)`, comments, command
/// separators, redirections); an unclosed quote is an error.
fn shell_split(line: &str) -> Result<ShellLine, String> {
    let chars: Vec<char> = line.chars().collect();
    let closing = |from: usize, quote: char, what: &str| {
        chars[from..]
            .iter()
            .position(|&x| x == quote)
            .map(|p| from + p)
            .ok_or(format!("{what} that is never closed"))
    };
    let mut s = Splitter::default();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            ' ' | '\t' => s.end_word(),
            '#' if !s.in_word => {
                let comment: String = chars[i + 1..].iter().collect();
                s.line.comment = Some(comment.trim().to_string());
                break;
            }
            '\'' => {
                let close = closing(i + 1, '\'', "a single quote")?;
                s.push(&chars[i + 1..close]);
                i = close;
            }
            '`' => {
                let close = closing(i + 1, '`', "a backquote")?;
                s.push(&chars[i..=close]);
                i = close;
            }
            '"' => {
                s.in_word = true;
                i = double_quoted(&chars, i + 1, &mut s.word)?;
            }
            '\\' => {
                s.push(chars.get(i + 1).map(std::slice::from_ref).unwrap_or(&[]));
                i += 1;
            }
            '$' if chars.get(i + 1) == Some(&'(') => {
                let close = substitution_end(&chars, i + 1)?;
                s.push(&chars[i..=close]);
                i = close;
            }
            '|' | ';' | '&' => {
                s.end_command();
                while chars
                    .get(i + 1)
                    .is_some_and(|&x| matches!(x, '|' | '&' | ';'))
                {
                    i += 1;
                }
            }
            '>' | '<' => {
                // `2>`: the digits were a file descriptor, not a word.
                if s.in_word && s.word.chars().all(|x| x.is_ascii_digit()) {
                    s.word.clear();
                    s.in_word = false;
                }
                s.end_word();
                while chars
                    .get(i + 1)
                    .is_some_and(|&x| matches!(x, '>' | '<' | '&'))
                {
                    i += 1;
                }
                s.skip_next_word = true;
            }
            _ => s.push(&[c]),
        }
        i += 1;
    }
    s.end_command();
    Ok(s.line)
}

/// Reads a double-quoted string from `start` (after the quote) into `word`; returns the index of
/// the closing quote.
fn double_quoted(chars: &[char], start: usize, word: &mut String) -> Result<usize, String> {
    let mut i = start;
    while i < chars.len() {
        match chars[i] {
            '"' => return Ok(i),
            '\\' if chars
                .get(i + 1)
                .is_some_and(|&x| matches!(x, '"' | '\\' | '$' | '`')) =>
            {
                word.push(chars[i + 1]);
                i += 1;
            }
            c => word.push(c),
        }
        i += 1;
    }
    Err("a double quote that is never closed".into())
}

/// The index of the `)` closing the `(` at `open`.
fn substitution_end(chars: &[char], open: usize) -> Result<usize, String> {
    let mut depth = 0;
    for (i, &c) in chars.iter().enumerate().skip(open) {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return Ok(i);
                }
            }
            _ => {}
        }
    }
    Err("a $( that is never closed".into())
}

/// The documented binary a word names (`swerve-train`, `./target/release/swerve-train`).
fn binary_named(word: &str) -> Option<&'static str> {
    let base = word.rsplit('/').next().unwrap_or(word);
    BINARIES.iter().copied().find(|b| *b == base)
}

/// What a simple command runs: `Ok(Some((binary, args)))`, `Ok(None)` when it runs none of the
/// binaries, an error when it names one in a way this test cannot read.
fn invocation_in(words: &[String]) -> Result<Option<(&'static str, Vec<String>)>, String> {
    let Some(first) = words.iter().position(|w| !is_assignment(w)) else {
        return Ok(None);
    };
    let program = words[first].as_str();
    let rest = &words[first + 1..];
    if let Some(binary) = binary_named(program) {
        return Ok(Some((binary, rest.to_vec())));
    }
    if program == "cargo" {
        return Ok(cargo_run(rest));
    }
    let Some(at) = rest.iter().position(|w| binary_named(w).is_some()) else {
        return Ok(None);
    };
    if LAUNCHERS.contains(&program) {
        return Ok(binary_named(&rest[at]).map(|b| (b, rest[at + 1..].to_vec())));
    }
    if FILE_COMMANDS.contains(&program) {
        return Ok(None);
    }
    Err(format!(
        "`{program}` is followed by `{}`: list `{program}` in tests/doc_commands.rs as a launcher \
         (LAUNCHERS) or as a command that only handles files (FILE_COMMANDS)",
        rest[at]
    ))
}

/// `cargo run ... --bin NAME ... -- ARGS` (the words after `cargo`): the binary and ARGS. `cargo
/// build --bin NAME` and `cargo test` build and run no binary: `None`.
fn cargo_run(words: &[String]) -> Option<(&'static str, Vec<String>)> {
    let (at, binary) = words.iter().enumerate().find_map(|(i, w)| {
        let name = match w.strip_prefix("--bin=") {
            Some(name) => name,
            None if w == "--bin" => words.get(i + 1)?.as_str(),
            None => return None,
        };
        binary_named(name).map(|b| (i, b))
    })?;
    if !words[..at].iter().any(|w| w == "run") {
        return None;
    }
    let args = match words[at..].iter().position(|w| w == "--") {
        Some(dashes) => words[at + dashes + 1..].to_vec(),
        None => Vec::new(),
    };
    Some((binary, args))
}

/// `NAME=value` before a command (`SWERVE_EMU=1 cargo ...`).
fn is_assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(name, _)| {
        !name.is_empty()
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !name.starts_with(|c: char| c.is_ascii_digit())
    })
}

/// Every command line of the documented binaries in a Markdown text, and the problems met while
/// reading them (`file:line: what`).
fn extract(file: &str, text: &str) -> (Vec<Invocation>, Vec<String>) {
    let blocks = match fenced_blocks(file, text) {
        Ok(blocks) => blocks,
        Err(e) => return (Vec::new(), vec![e]),
    };
    let mut found = Vec::new();
    let mut problems = Vec::new();
    for block in &blocks {
        exec_arrays(file, block, &mut found, &mut problems);
        let language = block.language.as_str();
        if !SHELL_LANGUAGES.contains(&language) && !SESSION_LANGUAGES.contains(&language) {
            continue;
        }
        for (number, line) in logical_lines(block) {
            let place = format!("{file}:{number}");
            if !BINARIES.iter().any(|b| line.contains(b)) {
                continue;
            }
            let shell = match shell_split(&line) {
                Ok(shell) => shell,
                Err(e) => {
                    problems.push(format!("{place}: {e}: {line}"));
                    continue;
                }
            };
            let expected_error = shell
                .comment
                .as_deref()
                .and_then(|c| c.strip_prefix("fails:").map(|t| t.trim().to_string()));
            for words in &shell.commands {
                match invocation_in(words) {
                    Ok(Some((binary, args))) => found.push(Invocation {
                        place: place.clone(),
                        binary: binary.to_string(),
                        args,
                        expected_error: expected_error.clone(),
                    }),
                    Ok(None) => {}
                    Err(e) => problems.push(format!("{place}: {e}")),
                }
            }
        }
    }
    (found, problems)
}

/// Exec-form arrays naming a binary (`["swerve-train", "rl", ...]`), read as JSON up to their
/// closing bracket, across lines.
fn exec_arrays(file: &str, block: &Block, found: &mut Vec<Invocation>, problems: &mut Vec<String>) {
    for (index, (number, line)) in block.lines.iter().enumerate() {
        let Some(start) = array_start(line) else {
            continue;
        };
        let mut text = line[start..].to_string();
        for (_, next) in &block.lines[index + 1..] {
            if text.contains(']') {
                break;
            }
            text.push('\n');
            text.push_str(next);
        }
        let place = format!("{file}:{number}");
        let end = text.find(']').map_or(text.len(), |e| e + 1);
        match serde_json::from_str::<Vec<String>>(&text[..end]) {
            Ok(words) => {
                if let Some(binary) = words.first().and_then(|w| binary_named(w)) {
                    found.push(Invocation {
                        place,
                        binary: binary.to_string(),
                        args: words[1..].to_vec(),
                        expected_error: None,
                    });
                }
            }
            Err(e) => problems.push(format!("{place}: a command array that is not JSON ({e})")),
        }
    }
}

/// Where an array whose first element is a documented binary starts in a line.
fn array_start(line: &str) -> Option<usize> {
    line.match_indices('[').map(|(i, _)| i).find(|&i| {
        let rest = line[i + 1..].trim_start();
        rest.strip_prefix('"').is_some_and(|r| {
            let name = r.split('"').next().unwrap_or("");
            binary_named(name).is_some()
        })
    })
}

/// The path cargo built a binary at.
fn binary_path(binary: &str) -> &'static str {
    match binary {
        "swerve-train" => env!("CARGO_BIN_EXE_swerve-train"),
        "swerve-serve" => env!("CARGO_BIN_EXE_swerve-serve"),
        "swerve-bench" => env!("CARGO_BIN_EXE_swerve-bench"),
        other => panic!("not a documented binary: {other}"),
    }
}

/// Runs the binary with `SWERVE_PARSE_ONLY=1` in an empty folder (so a binary that ignored the
/// variable would write nothing here); `Err` says what is wrong with the command line.
fn check(invocation: &Invocation, scratch: &Path) -> Result<(), String> {
    let mut child = Command::new(binary_path(&invocation.binary))
        .args(&invocation.args)
        .env("SWERVE_PARSE_ONLY", "1")
        .current_dir(scratch)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("could not start {}: {e}", invocation.binary))?;
    let started = Instant::now();
    while child.try_wait().map_err(|e| e.to_string())?.is_none() {
        if started.elapsed() > PARSE_TIMEOUT {
            child.kill().ok();
            child.wait().ok();
            return Err(format!(
                "still running after {PARSE_TIMEOUT:?}: does it honour SWERVE_PARSE_ONLY?"
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let output = child.wait_with_output().map_err(|e| e.to_string())?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let code = output.status.code();
    match &invocation.expected_error {
        None if code == Some(0) && stdout.contains(": the arguments parse") => Ok(()),
        None if code == Some(0) => Err(format!(
            "exited 0 without saying the arguments parse (SWERVE_PARSE_ONLY ignored?): {stdout}"
        )),
        None => Err(format!("does not parse (exit {code:?}): {}", stderr.trim())),
        Some(text) if code == Some(2) && stderr.contains(text.as_str()) => Ok(()),
        Some(text) if code == Some(2) => Err(format!(
            "fails as marked, but its error does not contain {text:?}: {}",
            stderr.trim()
        )),
        Some(text) => Err(format!(
            "marked `# fails: {text}`, but exits {code:?} (2 expected): {}{}",
            stdout.trim(),
            stderr.trim()
        )),
    }
}

/// Extracts and checks a document's command lines: (how many, what failed).
fn check_document(file: &str, text: &str) -> (usize, Vec<String>) {
    let scratch = tempfile::tempdir().unwrap();
    let (found, mut failures) = extract(file, text);
    for invocation in &found {
        if let Err(problem) = check(invocation, scratch.path()) {
            let command = format!("{} {}", invocation.binary, invocation.args.join(" "));
            failures.push(format!("{}: {command}\n    {problem}", invocation.place));
        }
    }
    (found.len(), failures)
}

/// README.md and every `docs/*.md`, as (path from the repository root, text).
fn documents() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut paths = vec!["README.md".to_string()];
    let mut pages: Vec<String> = std::fs::read_dir(root.join("docs"))
        .expect("docs/ is readable")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    pages.sort();
    paths.extend(pages);
    paths
        .into_iter()
        .map(|p| {
            let text =
                std::fs::read_to_string(root.join(&p)).unwrap_or_else(|e| panic!("{p}: {e}"));
            (p, text)
        })
        .collect()
}

#[test]
fn every_documented_command_line_parses() {
    let mut failures = Vec::new();
    let mut counts = Vec::new();
    for (path, text) in documents() {
        let (count, failed) = check_document(&path, &text);
        counts.push(format!("{path}: {count}"));
        failures.extend(failed);
    }
    println!("command lines checked: {}", counts.join(", "));
    assert!(
        failures.is_empty(),
        "{} documented command lines do not parse as shown:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // The quick start's command, and the pages' examples, were found at all.
    assert!(counts[0] != "README.md: 0", "{counts:?}");
    let total: usize = counts
        .iter()
        .map(|c| c.rsplit(' ').next().unwrap().parse::<usize>().unwrap())
        .sum();
    assert!(total >= 20, "only {total} command lines found: {counts:?}");
}

/// The extractor on every form the documents use, without running anything.
#[test]
fn extractor_reads_shell_forms() {
    let doc = r#"Intro.

```sh
cargo run --release --bin swerve-train -- rl --model preset:toy --out runs/toy   # a comment
cargo test --release                       # not a binary
cargo build --release --bin swerve-serve
SWERVE_EMU=1 cargo run --release --bin swerve-train -- score --device cuda --input IN --output OUT
swerve-bench plan --gpus 8 \
    --gpu-memory 80 --mode serve
```

```text
swerve-bench plan: qwen2.5-72b (72.71 B parameters) on 8 GPUs
$ target/release/swerve-bench decode --batch-sizes 1,8 2>&1 | tee log
```

```sh
torchrun --nnodes 2 --no-python swerve-train rl \
    --model "/models/with space" --tasks 'a b.jsonl' --out $OUT
srun --kill-on-bad-exit=1 swerve-serve --model M && swerve-bench kernels > k.txt
cp target/release/swerve-train /usr/local/bin/
swerve-train dapo --model M --data D --out O --eps-low 1.5  # fails: eps-low
```

```yaml
          command: ["swerve-train", "rl", "--model", "/m",
                    "--tensor-parallel", "8"]
```
"#;
    let (found, problems) = extract("doc.md", doc);
    assert!(problems.is_empty(), "{problems:?}");
    let shown: Vec<String> = found
        .iter()
        .map(|i| format!("{} {} {}", i.place, i.binary, i.args.join("|")))
        .collect();
    let expected = [
        "doc.md:4 swerve-train rl|--model|preset:toy|--out|runs/toy",
        "doc.md:7 swerve-train score|--device|cuda|--input|IN|--output|OUT",
        "doc.md:8 swerve-bench plan|--gpus|8|--gpu-memory|80|--mode|serve",
        "doc.md:14 swerve-bench decode|--batch-sizes|1,8",
        "doc.md:18 swerve-train rl|--model|/models/with space|--tasks|a b.jsonl|--out|$OUT",
        "doc.md:20 swerve-serve --model|M",
        "doc.md:20 swerve-bench kernels",
        "doc.md:22 swerve-train dapo|--model|M|--data|D|--out|O|--eps-low|1.5",
        "doc.md:26 swerve-train rl|--model|/m|--tensor-parallel|8",
    ];
    assert_eq!(shown, expected);
    assert_eq!(found[7].expected_error.as_deref(), Some("eps-low"));
    assert!(found[..7].iter().all(|i| i.expected_error.is_none()));
}

/// What the extractor refuses to guess: an unclosed fence or quote, a binary after an unknown
/// command.
#[test]
fn extractor_reports_what_it_cannot_read() {
    let (_, problems) = extract("a.md", "x\n```sh\nswerve-train rl\n");
    assert_eq!(problems, ["a.md:2: a code fence that is never closed"]);
    let (_, problems) = extract("b.md", "```sh\nswerve-train rl --model 'x\n```\n");
    assert_eq!(problems.len(), 1);
    assert!(
        problems[0].starts_with("b.md:2: a single quote that is never closed"),
        "{problems:?}"
    );
    let (_, problems) = extract("c.md", "```sh\nmystery-launcher swerve-train rl\n```\n");
    assert_eq!(problems.len(), 1);
    assert!(
        problems[0].starts_with("c.md:2: `mystery-launcher` is followed by"),
        "{problems:?}"
    );
}

/// The check fails on a line with an unknown flag, naming the file and line, and on a line marked
/// `# fails:` that parses; it passes a line that fails as marked.
#[test]
fn an_unknown_flag_fails_the_check() {
    let doc = "# Page\n\n```sh\nswerve-train rl --model M --tasks T --out O\n\
               swerve-train rl --model M --tasks T --out O --no-such-flag\n\
               swerve-bench decode --batch-sizes 1,x\n\
               swerve-serve --model M --shutdown-grace-seconds=-1   # fails: non-negative\n\
               swerve-serve --model M   # fails: anything\n```\n";
    let (count, failures) = check_document("bad.md", doc);
    assert_eq!(count, 5);
    assert_eq!(failures.len(), 3, "{failures:#?}");
    assert!(
        failures[0].starts_with("bad.md:5: swerve-train rl"),
        "{failures:#?}"
    );
    assert!(failures[0].contains("--no-such-flag"), "{failures:#?}");
    assert!(
        failures[1].starts_with("bad.md:6: swerve-bench decode"),
        "{failures:#?}"
    );
    assert!(
        failures[2].starts_with("bad.md:8: swerve-serve"),
        "{failures:#?}"
    );
    assert!(
        failures[2].contains("marked `# fails: anything`"),
        "{failures:#?}"
    );
}

/// `SWERVE_PARSE_ONLY`'s values: `1` parses only, `0` runs the command (here a memory plan, which
/// needs no GPU and reads no file), anything else is an error naming the variable.
#[test]
fn parse_only_variable() {
    let plan = ["plan", "--gpus", "8", "--gpu-memory", "80"];
    let run = |value: &str| {
        Command::new(binary_path("swerve-bench"))
            .args(plan)
            .env("SWERVE_PARSE_ONLY", value)
            .output()
            .unwrap()
    };
    let parsed = run("1");
    let stdout = String::from_utf8_lossy(&parsed.stdout);
    assert_eq!(stdout.trim(), "swerve-bench plan: the arguments parse");
    assert!(parsed.status.success());
    let ran = run("0");
    let stdout = String::from_utf8_lossy(&ran.stdout);
    assert!(ran.status.success() && stdout.contains("peak:"), "{stdout}");
    let refused = run("yes");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(
        stderr.contains("SWERVE_PARSE_ONLY must be 1") && stderr.contains("\"yes\""),
        "{stderr}"
    );
}
