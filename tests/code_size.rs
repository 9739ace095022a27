//! Code size, checked on the source (issue 15 item 7; DESIGN.md, Style): no Rust function over
//! [`MAX_FN_LINES`] lines in `src/` or `tests/` (split it by stage: named helpers that each do
//! one step, the top function reading as the list of stages), and no source file over
//! [`MAX_FILE_LINES`] lines in `src/`, `tests/` (fixtures aside), `kernels/`, `emu/`, `scripts/`,
//! `bench/` or `build.rs` (split it by concept, not into "utils").
//!
//! A function's length runs from the line of its `fn` keyword to the line of its closing brace,
//! both included (attributes and doc comments above it do not count). Functions are found in the
//! source with comments and string, raw-string and char literals blanked
//! ([`scanner::code_only`], the layering check's scanner), so braces and `fn` inside them are not
//! code. A function nested in another is measured on its own and also counts in its parent.

#[path = "layering/scanner.rs"]
#[allow(dead_code)] // the layering check's path resolution is not used here
mod scanner;

use std::path::{Path, PathBuf};

/// The longest a Rust function may be, in lines.
const MAX_FN_LINES: usize = 100;
/// The longest a source file may be, in lines.
const MAX_FILE_LINES: usize = 800;

/// Where the file-size rule applies (directories are walked; `build.rs` is a file).
const FILE_ROOTS: &[&str] = &[
    "src", "tests", "kernels", "emu", "scripts", "bench", "build.rs",
];
/// Where the function-size rule applies.
const FN_ROOTS: &[&str] = &["src", "tests"];
/// Not source: generated data the tests read.
const EXCLUDED: &[&str] = &["tests/fixtures"];
/// What counts as a source file.
const SOURCE_EXTENSIONS: &[&str] = &["rs", "cu", "cuh", "cpp", "cc", "c", "h", "hpp", "py", "sh"];

/// One function found in a file: its name, the line of its `fn` keyword (1-based) and its length.
#[derive(Debug, PartialEq)]
struct Function {
    name: String,
    line: usize,
    lines: usize,
}

/// Every function with a body in `src` (Rust source), in source order.
fn functions(src: &str) -> Vec<Function> {
    let code: Vec<char> = scanner::code_only(src).chars().collect();
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let line_at = |i: usize| 1 + code[..i].iter().filter(|&&c| c == '\n').count();
    let mut found = Vec::new();
    let mut i = 0;
    while i + 2 <= code.len() {
        let is_fn = code[i] == 'f'
            && code[i + 1] == 'n'
            && (i == 0 || !ident(code[i - 1]))
            && code.get(i + 2).is_some_and(|&c| c.is_whitespace());
        if !is_fn {
            i += 1;
            continue;
        }
        // The name: `fn` then whitespace then an identifier (`fn(` is a pointer type, and
        // `fn $name` a macro's template).
        let mut j = i + 2;
        while j < code.len() && code[j].is_whitespace() {
            j += 1;
        }
        let name_start = j;
        while j < code.len() && ident(code[j]) {
            j += 1;
        }
        if j == name_start || code[name_start].is_numeric() {
            i += 2;
            continue;
        }
        let name: String = code[name_start..j].iter().collect();
        if let Some(end) = body_end(&code, j) {
            found.push(Function {
                name,
                line: line_at(i),
                lines: line_at(end) - line_at(i) + 1,
            });
        }
        i = j;
    }
    found
}

/// From just after a function's name: the index of its body's closing brace, or `None` for a
/// declaration without a body (`fn f(&self);` in a trait). Parentheses and brackets in the
/// signature are skipped; the first `{` outside them opens the body.
fn body_end(code: &[char], from: usize) -> Option<usize> {
    let mut depth = 0usize; // of ( and [ in the signature
    let mut k = from;
    while k < code.len() {
        match code[k] {
            '(' | '[' => depth += 1,
            ')' | ']' => depth = depth.saturating_sub(1),
            ';' if depth == 0 => return None,
            '{' if depth == 0 => break,
            _ => {}
        }
        k += 1;
    }
    let mut braces = 0usize;
    while k < code.len() {
        match code[k] {
            '{' => braces += 1,
            '}' => {
                braces -= 1;
                if braces == 0 {
                    return Some(k);
                }
            }
            _ => {}
        }
        k += 1;
    }
    None
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Source files under `rel` (a directory, walked, or a file), sorted, as paths relative to the
/// repository root.
fn source_files(rel: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![rel.to_string()];
    while let Some(rel) = todo.pop() {
        if EXCLUDED.contains(&rel.as_str()) {
            continue;
        }
        let path = root().join(&rel);
        if path.is_dir() {
            let entries = std::fs::read_dir(&path)
                .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
            for entry in entries {
                let name = entry.unwrap().file_name().to_string_lossy().into_owned();
                todo.push(format!("{rel}/{name}"));
            }
        } else if is_source(&path) {
            out.push(rel);
        }
    }
    out.sort();
    out
}

fn is_source(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| SOURCE_EXTENSIONS.contains(&e))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("reading {rel}: {e}"))
}

#[test]
fn functions_and_files_stay_small() {
    let mut problems = Vec::new();
    let mut longest = (0, String::new());
    for rel in FN_ROOTS.iter().flat_map(|r| source_files(r)) {
        if !rel.ends_with(".rs") {
            continue;
        }
        for f in functions(&read(&rel)) {
            if f.lines > longest.0 {
                longest = (f.lines, format!("{rel}:{} `{}`", f.line, f.name));
            }
            if f.lines > MAX_FN_LINES {
                problems.push(format!(
                    "{rel}:{}: fn `{}` has {} lines (at most {MAX_FN_LINES}): split it by stage",
                    f.line, f.name, f.lines
                ));
            }
        }
    }
    let mut largest = (0, String::new());
    for rel in FILE_ROOTS.iter().flat_map(|r| source_files(r)) {
        let lines = read(&rel).lines().count();
        if lines > largest.0 {
            largest = (lines, rel.clone());
        }
        if lines > MAX_FILE_LINES {
            problems.push(format!(
                "{rel}:1: {lines} lines (at most {MAX_FILE_LINES}): split the file by concept"
            ));
        }
    }
    println!(
        "longest function: {} ({} lines); largest file: {} ({} lines)",
        longest.1, longest.0, largest.1, largest.0
    );
    assert!(
        problems.is_empty(),
        "{} over the size limits (DESIGN.md, Style):\n  {}",
        problems.len(),
        problems.join("\n  ")
    );
}

// ---- the scanner's own checks: it must count what it is meant to count -----------------------

#[test]
fn the_scanner_counts_a_small_function() {
    let src =
        "/// Doc.\n#[inline]\npub(crate) fn small(x: u32) -> u32 {\n    let y = x + 1;\n    y\n}\n";
    let want = Function {
        name: "small".into(),
        line: 3,
        lines: 4,
    };
    assert_eq!(functions(src), [want]);
}

#[test]
fn braces_and_fn_in_strings_chars_and_comments_are_not_code() {
    let src = "fn a() {\n    let s = \"{ fn fake() {\";\n    let r = r#\"}\" } {\"#;\n    \
               let c = '{';\n    // } fn commented() {\n    /* { */\n}\nfn b<'x>(s: &'x str) -> &'x str { s }\n";
    let got: Vec<(String, usize, usize)> = functions(src)
        .into_iter()
        .map(|f| (f.name, f.line, f.lines))
        .collect();
    assert_eq!(got, [("a".into(), 1, 7), ("b".into(), 8, 1)]);
}

#[test]
fn declarations_pointer_types_and_nested_functions() {
    let src = "trait T {\n    fn declared(&self) -> [u8; 2];\n    fn provided(&self) {}\n}\n\
               fn outer(f: fn(u32) -> u32, g: impl Fn() -> u32) -> u32 {\n    fn inner() -> u32 {\n        \
               1\n    }\n    f(inner()) + g()\n}\n";
    let got: Vec<(String, usize, usize)> = functions(src)
        .into_iter()
        .map(|f| (f.name, f.line, f.lines))
        .collect();
    let want = [
        ("provided".into(), 3, 1),
        ("outer".into(), 5, 6),
        ("inner".into(), 6, 3),
    ];
    assert_eq!(got, want);
}
