//! The crate's layering, checked on the source (issue 15 item 6): a module may use only modules
//! of a lower layer, so every arrow points down and no two modules need each other.
//!
//! ```text
//!  layer 7   server  bench                  src/bin/* (separate crates) sit above everything
//!              │       │
//!  layer 6     │      rl                    the RL loop
//!              │       │
//!  layer 5     │     agent                  episodes over the engine and an environment
//!              ▼       ▼
//!  layer 4   engine  train  env             serving and training; sandboxes
//!              │   ╲   │
//!  layer 3   kvcache  model                 pure-CPU block accounting; the Qwen2 model
//!                      │
//!  layer 2          backend                 the fused ops, their CPU references and CUDA
//!                      │
//!  layer 1   tokenizer ◄─ chat   toolcall   text
//!
//!  layer 0   tensor  config  jsonl  progress  http_client  rng
//! ```
//!
//! The rules, checked by [`layering_points_down`]:
//! - every module of `src/lib.rs` has a layer in [`LAYERS`] (a new module must be placed);
//! - a module may use any module of a lower layer;
//! - within one layer, a module may use another only where the pair is listed, in that
//!   direction, with its reason, in [`SIDEWAYS`] (the reverse pair is never allowed: a cycle);
//! - never a module of a higher layer.
//!
//! A use is any path that resolves to another top-level module: `use crate::a::B;`, grouped
//! `use crate::{a::B, c::{D, E}};`, inline paths in code (`crate::a::f()`), `super::` climbing out
//! of a top-level file, in unit tests too (a lower module's test that needs a higher module
//! belongs in `tests/`). Comments, doc comments and string literals are not code and are skipped.
//! Paths through re-exports count where they are written: `pub use crate::backend::loss;` in
//! `train` is an arrow from train to backend.
//!
//! Inside every directory module (`src/backend/cuda/`, `src/kvcache/`, ...), files must not form
//! import cycles either ([`no_import_cycles_between_files`]). There a file's edges are its
//! `super::x`, `self`-relative and `crate::dir::x` paths to sibling files; unit-test modules
//! (`#[cfg(test)] mod ...`) do not count, as a test may borrow a sibling's helper to build its
//! inputs. `mod.rs` is not a node (it declares every file), and paths through its re-exports are
//! not followed. Methods a file adds to a sibling's type (`impl CudaBackend { .. }` in an op
//! file) are called without a path and are not edges: the check is about imports.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every top-level module of `src/lib.rs`, by layer (index = layer, 0 at the bottom).
const LAYERS: &[&[&str]] = &[
    &[
        "tensor",
        "config",
        "jsonl",
        "progress",
        "http_client",
        "rng",
    ],
    &["tokenizer", "chat", "toolcall"],
    &["backend"],
    &["kvcache", "model"],
    &["engine", "train", "env"],
    &["agent"],
    &["rl"],
    &["server", "bench"],
];

/// Allowed uses within one layer: (from, to, why).
const SIDEWAYS: &[(&str, &str, &str)] = &[(
    "chat",
    "tokenizer",
    "the chat template renders and tokenizes with the tokenizer's special tokens",
)];

/// Cycles that exist today and are being removed on other branches: reported, not failed; the
/// test fails once one is gone, so that its entry goes too. (directory under `src/`, files).
const KNOWN_FILE_CYCLES: &[(&str, &[&str])] = &[
    // issue 15 item 6: `BlockId` moves into kvcache/mod.rs (the kvcache branch).
    ("kvcache", &["block_pool", "prefix"]),
    // `resolve_model_arg` (synthetic.rs) writes `preset:toy` through toy.rs, which writes its
    // weights through synthetic.rs. Issue 15 item 2 rewrites that function on another branch;
    // then it moves above both (e.g. model/mod.rs).
    ("model", &["synthetic", "toy"]),
];

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn layering_points_down() {
    let src = src_dir();
    let declared = lib_modules(&src);
    let mut problems = table_problems(&declared);
    let layer_of = layer_table();
    // (from, to, file, line) -> the paths written there.
    let mut uses: BTreeMap<(String, String, String, usize), Vec<String>> = BTreeMap::new();
    for file in library_files(&src) {
        let Some(from) = file.module.first() else {
            continue; // lib.rs: declares the modules, uses none
        };
        for reference in &file.references {
            match reference.target.first() {
                Some(to) if to != from => uses
                    .entry((
                        from.clone(),
                        to.clone(),
                        file.rel_path.clone(),
                        reference.line,
                    ))
                    .or_default()
                    .push(reference.target.join("::")),
                _ => {}
            }
        }
    }
    for ((from, to, file, line), paths) in uses {
        let place = format!("{file}:{line}: {}", paths.join(", "));
        match (layer_of.get(from.as_str()), layer_of.get(to.as_str())) {
            (Some(&a), Some(&b)) if a > b => {}
            (Some(&a), Some(&b)) if a == b => {
                if !SIDEWAYS.iter().any(|&(f, t, _)| f == from && t == to) {
                    problems.push(format!(
                        "{from} -> {to} within layer {a}, not listed in SIDEWAYS  ({place})"
                    ));
                }
            }
            (Some(&a), Some(&b)) => problems.push(format!(
                "{from} (layer {a}) -> {to} (layer {b}) points up  ({place})"
            )),
            (_, None) => problems.push(format!(
                "{from} -> `{to}`: not a module in the layer table  ({place})"
            )),
            (None, _) => {} // reported by table_problems
        }
    }
    assert!(
        problems.is_empty(),
        "{} lines against the layering (see the table at the top of tests/layering.rs):\n  {}",
        problems.len(),
        problems.join("\n  ")
    );
}

#[test]
fn no_import_cycles_between_files() {
    let src = src_dir();
    let files = library_files(&src);
    let mut problems = Vec::new();
    let mut known_seen = BTreeSet::new();
    for dir in directory_modules(&src) {
        let dir = dir.as_str();
        let edges = file_edges(dir, &files);
        for cycle in cycles(&edges) {
            let names: Vec<&str> = cycle.iter().map(|s| s.as_str()).collect();
            let known = KNOWN_FILE_CYCLES
                .iter()
                .find(|&&(d, f)| d == dir && sorted(f) == sorted(&names));
            let listing = describe_cycle(dir, &cycle, &edges);
            match known {
                Some(entry) => {
                    known_seen.insert(entry.0.to_string() + &entry.1.join(","));
                    eprintln!("known import cycle (KNOWN_FILE_CYCLES), to be removed:\n{listing}");
                }
                None => problems.push(listing),
            }
        }
    }
    for (dir, files) in KNOWN_FILE_CYCLES {
        if !known_seen.contains(&(dir.to_string() + &files.join(","))) {
            problems.push(format!(
                "the known cycle {dir}: {files:?} is gone: remove it from KNOWN_FILE_CYCLES"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "import cycles between files:\n{}",
        problems.join("\n")
    );
}

fn sorted<'a>(names: &[&'a str]) -> Vec<&'a str> {
    let mut names = names.to_vec();
    names.sort_unstable();
    names
}

/// Module name -> layer; panics on a name placed twice (a table error, not a code error).
fn layer_table() -> BTreeMap<&'static str, usize> {
    let mut table = BTreeMap::new();
    for (layer, names) in LAYERS.iter().enumerate() {
        for &name in *names {
            assert!(
                table.insert(name, layer).is_none(),
                "{name} has two layers in LAYERS"
            );
        }
    }
    table
}

/// Modules declared in lib.rs but missing from the table, table entries lib.rs lacks, and
/// SIDEWAYS pairs that are not within one layer or are listed both ways.
fn table_problems(declared: &BTreeSet<String>) -> Vec<String> {
    let table = layer_table();
    let mut problems = Vec::new();
    for name in declared {
        if !table.contains_key(name.as_str()) {
            problems.push(format!(
                "src/lib.rs declares `{name}`: give it a layer in LAYERS"
            ));
        }
    }
    for name in table.keys() {
        if !declared.contains(*name) {
            problems.push(format!(
                "LAYERS names `{name}`, which src/lib.rs does not declare"
            ));
        }
    }
    for &(from, to, _) in SIDEWAYS {
        if !table.contains_key(from) || table.get(from) != table.get(to) {
            problems.push(format!(
                "SIDEWAYS {from} -> {to}: not two modules of one layer"
            ));
        }
        if SIDEWAYS.iter().any(|&(f, t, _)| f == to && t == from) {
            problems.push(format!("SIDEWAYS lists {from} and {to} both ways: a cycle"));
        }
    }
    problems
}

/// One `.rs` file of the library and the module paths it references.
struct SourceFile {
    /// Relative to the repository root, e.g. `src/backend/cuda/graphs.rs`.
    rel_path: String,
    /// Its module path: `["backend", "cuda", "graphs"]` (`mod.rs`: the directory's).
    module: Vec<String>,
    references: Vec<Reference>,
}

/// A path in code, resolved to absolute module segments (`crate::` stripped).
#[derive(Clone, Debug, PartialEq)]
struct Reference {
    line: usize,
    target: Vec<String>,
    /// Inside a `#[cfg(test)]` inline module.
    in_test: bool,
}

/// The top-level modules `src/lib.rs` declares (`mod x;`, `pub mod x;`).
fn lib_modules(src: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(src.join("lib.rs")).expect("reading src/lib.rs");
    let tokens = tokenize(&code_only(&text));
    tokens
        .windows(3)
        .filter(|w| w[0].text == "mod" && w[2].text == ";")
        .map(|w| w[1].text.clone())
        .collect()
}

/// Every library source file (not `src/bin/`: the binaries are separate crates on top).
fn library_files(src: &Path) -> Vec<SourceFile> {
    let mut paths = Vec::new();
    collect_rs(src, &mut paths);
    paths.sort();
    let root = src.parent().unwrap();
    paths
        .into_iter()
        .filter(|p| !p.starts_with(src.join("bin")))
        .map(|path| {
            let rel = path.strip_prefix(src).unwrap();
            let module = module_path(rel);
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
            SourceFile {
                rel_path: path.strip_prefix(root).unwrap().display().to_string(),
                references: references(&code_only(&text), &module),
                module,
            }
        })
        .collect()
}

fn collect_rs(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect_rs(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `lib.rs` -> `[]`, `a.rs` -> `[a]`, `a/mod.rs` -> `[a]`, `a/b.rs` -> `[a, b]`.
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

/// Every directory module of the library, relative to `src/`: `backend`, `backend/cuda`, ...
fn directory_modules(src: &Path) -> Vec<String> {
    let mut paths = Vec::new();
    collect_rs(src, &mut paths);
    let mut dirs: Vec<String> = paths
        .iter()
        .filter(|p| p.file_name().is_some_and(|n| n == "mod.rs"))
        .filter(|p| !p.starts_with(src.join("bin")))
        .map(|p| {
            let dir = p.parent().unwrap().strip_prefix(src).unwrap();
            dir.to_string_lossy().replace('\\', "/")
        })
        .collect();
    dirs.sort();
    assert!(
        dirs.iter().any(|d| d == "backend/cuda") && dirs.iter().any(|d| d == "kvcache"),
        "no directory modules found under {}: {dirs:?}",
        src.display()
    );
    dirs
}

/// The edges between the files of directory module `dir` (e.g. `backend/cuda`): file -> sibling
/// file -> the lines that use it. `mod.rs` is not a node (it declares every file).
type FileEdges = BTreeMap<String, BTreeMap<String, Vec<usize>>>;

fn file_edges(dir: &str, files: &[SourceFile]) -> FileEdges {
    let prefix = module_path(Path::new(dir).join("mod.rs").as_path());
    let siblings: BTreeSet<String> = files
        .iter()
        .filter(|f| f.module.len() == prefix.len() + 1 && f.module.starts_with(&prefix))
        .map(|f| f.module[prefix.len()].clone())
        .collect();
    let mut edges = FileEdges::new();
    for file in files {
        if file.module.len() != prefix.len() + 1 || !file.module.starts_with(&prefix) {
            continue;
        }
        let from = &file.module[prefix.len()];
        let node = edges.entry(from.clone()).or_default();
        for reference in file.references.iter().filter(|r| !r.in_test) {
            let target = &reference.target;
            if target.len() > prefix.len() && target.starts_with(&prefix) {
                let to = &target[prefix.len()];
                if to != from && siblings.contains(to) {
                    let lines = node.entry(to.clone()).or_default();
                    if lines.last() != Some(&reference.line) {
                        lines.push(reference.line);
                    }
                }
            }
        }
    }
    edges
}

/// The cycles of a directed graph: its strongly connected components of more than one node (or
/// one node with an edge to itself), each sorted. Tarjan's algorithm.
fn cycles(edges: &FileEdges) -> Vec<Vec<String>> {
    struct Walk<'a> {
        edges: &'a FileEdges,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a str) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.edges.get(v).into_iter().flat_map(|e| e.keys()) {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                loop {
                    let w = self.stack.pop().unwrap();
                    self.on_stack.remove(w);
                    component.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                let self_loop = self.edges.get(v).is_some_and(|e| e.contains_key(v));
                if component.len() > 1 || self_loop {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in edges.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.found.sort();
    walk.found
}

/// The edges inside one cycle, with the lines that make them.
fn describe_cycle(dir: &str, cycle: &[String], edges: &FileEdges) -> String {
    let mut out = format!("  src/{dir}: {} form a cycle:", cycle.join(", "));
    for from in cycle {
        for (to, lines) in edges.get(from).into_iter().flatten() {
            if cycle.contains(to) {
                out += &format!("\n    {from} -> {to}  (src/{dir}/{from}.rs lines {lines:?})");
            }
        }
    }
    out
}

// ---- the scanner ---------------------------------------------------------------------------

/// The source with comments (doc comments included), string, byte-string, raw-string and char
/// literals blanked to spaces; newlines are kept, so line numbers stay. Lifetimes stay.
fn code_only(src: &str) -> String {
    let chars: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        let prev_ident = i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_');
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
        } else if !prev_ident && raw_string_start(&chars, i).is_some() {
            let (hashes, open) = raw_string_start(&chars, i).unwrap();
            let closing: Vec<char> = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            let mut j = open + 1;
            while j < chars.len() && !chars[j..].starts_with(&closing) {
                j += 1;
            }
            let end = (j + closing.len()).min(chars.len());
            out.extend(chars[i..end].iter().map(|&c| blank(c)));
            i = end;
        } else if c == '"' || (c == 'b' && next == Some('"') && !prev_ident) {
            let mut j = if c == 'b' { i + 2 } else { i + 1 };
            while j < chars.len() && chars[j] != '"' {
                j += if chars[j] == '\\' { 2 } else { 1 };
            }
            let end = (j + 1).min(chars.len());
            out.extend(chars[i..end].iter().map(|&c| blank(c)));
            i = end;
        } else if c == '\'' && (!prev_ident || byte_prefix(&chars, i)) {
            // A char literal ('x', '\n', '\'', '\u{..}') or a lifetime ('a: kept).
            let end = if next == Some('\\') {
                let mut j = i + 1;
                while j < chars.len() && chars[j] != '\'' {
                    j += if chars[j] == '\\' { 2 } else { 1 };
                }
                Some(j + 1)
            } else if chars.get(i + 2) == Some(&'\'') {
                Some(i + 3)
            } else {
                None
            };
            match end {
                Some(end) => {
                    let end = end.min(chars.len());
                    out.extend(chars[i..end].iter().map(|&c| blank(c)));
                    i = end;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// Whether the `'` at `i` follows a lone `b` (a byte literal, `b'x'`).
fn byte_prefix(chars: &[char], i: usize) -> bool {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    i >= 1 && chars[i - 1] == 'b' && (i < 2 || !ident(chars[i - 2]))
}

/// At `r"`, `r#"`, `br"`, `br#"`...: the number of `#` and the index of the opening quote.
fn raw_string_start(chars: &[char], i: usize) -> Option<(usize, usize)> {
    let mut j = i;
    if chars.get(j) == Some(&'b') {
        j += 1;
    }
    if chars.get(j) != Some(&'r') {
        return None;
    }
    j += 1;
    let hashes = chars[j..].iter().take_while(|&&c| c == '#').count();
    (chars.get(j + hashes) == Some(&'"')).then_some((hashes, j + hashes))
}

#[derive(Clone, Debug)]
struct Token {
    text: String,
    line: usize,
}

/// Identifiers (and numbers), `::`, and single punctuation characters.
fn tokenize(code: &str) -> Vec<Token> {
    let chars: Vec<char> = code.chars().collect();
    let mut tokens = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let text = chars[start..i].iter().collect();
            tokens.push(Token { text, line });
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            tokens.push(Token {
                text: "::".into(),
                line,
            });
            i += 2;
        } else {
            tokens.push(Token {
                text: c.to_string(),
                line,
            });
            i += 1;
        }
    }
    tokens
}

/// Every path starting with `crate::`, `self::` or `super::` in `code` (already
/// [`code_only`]), resolved against the file's module path and the inline modules open there.
fn references(code: &str, file_module: &[String]) -> Vec<Reference> {
    let tokens = tokenize(code);
    let text = |i: usize| tokens.get(i).map_or("", |t| t.text.as_str());
    // Inline modules open at this point: (name, brace depth inside it, is a test module).
    let mut open: Vec<(String, usize, bool)> = Vec::new();
    let (mut depth, mut cfg_test_pending) = (0usize, false);
    let mut found = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        match text(i) {
            "#" if text(i + 1) == "["
                && text(i + 2) == "cfg"
                && text(i + 3) == "("
                && text(i + 4) == "test"
                && text(i + 5) == ")" =>
            {
                cfg_test_pending = true;
            }
            "mod" if text(i + 2) == "{" => {
                let in_test = cfg_test_pending || open.last().is_some_and(|m| m.2);
                depth += 1;
                open.push((text(i + 1).to_string(), depth, in_test));
                cfg_test_pending = false;
                i += 3;
                continue;
            }
            "{" => {
                depth += 1;
                cfg_test_pending = false;
            }
            "}" => {
                if open.last().is_some_and(|m| m.1 == depth) {
                    open.pop();
                }
                depth = depth.saturating_sub(1);
                cfg_test_pending = false;
            }
            ";" => cfg_test_pending = false,
            "crate" | "self" | "super"
                if text(i + 1) == "::" && text(i.wrapping_sub(1)) != "::" =>
            {
                let mut here: Vec<String> = file_module.to_vec();
                here.extend(open.iter().map(|m| m.0.clone()));
                let in_test = open.last().is_some_and(|m| m.2);
                let line = tokens[i].line;
                let (paths, end) = parse_path(&tokens, i, here);
                found.extend(paths.into_iter().map(|target| Reference {
                    line,
                    target,
                    in_test,
                }));
                i = end;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    found
}

/// Parses the path starting at token `i` (`crate`, `self` or `super`) from module `here`, with
/// its `{..}` groups expanded. Returns the absolute paths and the index after the path.
fn parse_path(tokens: &[Token], mut i: usize, here: Vec<String>) -> (Vec<Vec<String>>, usize) {
    let text = |i: usize| tokens.get(i).map_or("", |t| t.text.as_str());
    let mut path = match text(i) {
        "crate" => Vec::new(),
        _ => here, // self; super pops below
    };
    if text(i) == "super" {
        path.pop();
    }
    i += 1;
    while text(i) == "::" {
        let segment = text(i + 1);
        match segment {
            "super" => {
                path.pop();
            }
            "self" | "*" => {}
            "{" => return parse_group(tokens, i + 2, path),
            s if s
                .chars()
                .next()
                .is_some_and(|c| c.is_alphanumeric() || c == '_') =>
            {
                path.push(s.to_string());
            }
            _ => return (vec![path], i + 1), // `::<T>` and the like: the path ends here
        }
        i += 2;
    }
    (vec![path], i)
}

/// Parses the items of a `{ a::B, c, d::{E, F}, self }` group opening before token `i`, each
/// relative to `base`. Returns every path and the index after the closing `}`.
fn parse_group(tokens: &[Token], mut i: usize, base: Vec<String>) -> (Vec<Vec<String>>, usize) {
    let text = |i: usize| tokens.get(i).map_or("", |t| t.text.as_str());
    let mut paths = Vec::new();
    // The item being read, and whether it has a segment yet (`self` counts: the base itself).
    let (mut item, mut started) = (base.clone(), false);
    while i < tokens.len() {
        match text(i) {
            "}" | "," => {
                if started {
                    paths.push(std::mem::replace(&mut item, base.clone()));
                }
                started = false;
                i += 1;
                if text(i - 1) == "}" {
                    return (paths, i);
                }
            }
            "{" => {
                let (inner, end) = parse_group(tokens, i + 1, item.clone());
                paths.extend(inner);
                (item, started) = (base.clone(), false);
                i = end;
            }
            "as" => i += 2, // `x as y`: the alias is not a path
            "::" | "*" => i += 1,
            "self" => {
                started = true;
                i += 1;
            }
            "super" => {
                item.pop();
                started = true;
                i += 1;
            }
            s => {
                item.push(s.to_string());
                started = true;
                i += 1;
            }
        }
    }
    if started {
        paths.push(item);
    }
    (paths, i)
}

// ---- the checker's own checks: it must see what it is meant to see --------------------------

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn targets(code: &str, module: &[&str]) -> Vec<(usize, String, bool)> {
    references(&code_only(code), &strings(module))
        .into_iter()
        .map(|r| (r.line, r.target.join("::"), r.in_test))
        .collect()
}

#[test]
fn scanner_blanks_comments_strings_and_chars_but_keeps_lifetimes() {
    let src = "a // crate::x\n/* crate::y /* nested */ crate::z */ b \"crate::s \\\" q\" \
               r#\"crate::r \"# '\\'' 'c' b'\"' &'a str b\"x\" br\"y\"\n//! crate::doc\nc";
    let code = code_only(src);
    assert!(!code.contains("crate"), "{code:?}");
    assert_eq!(code.lines().count(), src.lines().count());
    assert!(code.contains("&'a str"), "{code:?}");
    let words: Vec<&str> = code.split_whitespace().collect();
    assert_eq!(words, ["a", "b", "b", "&'a", "str", "c"]);
}

#[test]
fn scanner_resolves_every_path_form() {
    let code = "use crate::train::loss::{LossRows, Objective};\n\
                use crate::{engine::sampler, model::{PagedKv, Qwen2Model as M}, rng};\n\
                fn f() { crate::backend::cpu::f(); let x: Vec<crate::tensor::HostTensor<'_>>; }\n\
                pub(crate) fn g() { Self::h(); self.h(); }\n\
                use super::graphs::DecodeGraphs;\n\
                use super::{as_i32, paged_attn::{WorkPlan, DECODE_BLOCK_M}};\n\
                #[cfg(test)]\nmod tests {\n    use super::*;\n    use super::super::super::super::jsonl;\n}\n\
                mod inner { use self::deep::X; }\n\
                macro_rules! m { () => { $crate::progress::Bar } }";
    let got = targets(code, &["backend", "cuda", "backend"]);
    let want: Vec<(usize, &str, bool)> = vec![
        (1, "train::loss::LossRows", false),
        (1, "train::loss::Objective", false),
        (2, "engine::sampler", false),
        (2, "model::PagedKv", false),
        (2, "model::Qwen2Model", false),
        (2, "rng", false),
        (3, "backend::cpu::f", false),
        (3, "tensor::HostTensor", false),
        (5, "backend::cuda::graphs::DecodeGraphs", false),
        (6, "backend::cuda::as_i32", false),
        (6, "backend::cuda::paged_attn::WorkPlan", false),
        (6, "backend::cuda::paged_attn::DECODE_BLOCK_M", false),
        (9, "backend::cuda::backend", true),
        (10, "jsonl", true),
        (12, "backend::cuda::backend::inner::deep::X", false),
        (13, "progress::Bar", false),
    ];
    let want: Vec<(usize, String, bool)> = want
        .into_iter()
        .map(|(l, t, test)| (l, t.to_string(), test))
        .collect();
    assert_eq!(got, want);
}

#[test]
fn cycle_finder_finds_cycles_and_only_cycles() {
    let mut edges = FileEdges::new();
    for (from, to) in [
        ("a", "b"),
        ("b", "c"),
        ("c", "a"),
        ("c", "d"),
        ("e", "e"),
        ("f", "d"),
    ] {
        edges
            .entry(from.into())
            .or_default()
            .insert(to.into(), vec![1]);
    }
    let found = cycles(&edges);
    assert_eq!(found, vec![strings(&["a", "b", "c"]), strings(&["e"])]);
    edges.get_mut("c").unwrap().remove("a");
    assert_eq!(cycles(&edges), vec![strings(&["e"])]);
}
