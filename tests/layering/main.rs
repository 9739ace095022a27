//! The crate's layering, checked on the source (issue 15 item 6): a module may use only modules
//! of a lower layer, so every arrow points down and no two modules need each other.
//!
//! ```text
//!  layer 8   server  bench                  src/bin/* (separate crates) sit above everything
//!              │       │
//!  layer 7     │      rl                    the RL loop
//!              │       │
//!  layer 6     │     agent                  episodes over the engine and an environment
//!              ▼       ▼
//!  layer 5   engine  train  env             serving and training; sandboxes
//!              │   ╲   │
//!  layer 4   kvcache  model                 pure-CPU block accounting; the Qwen2 model
//!                      │
//!  layer 3            dist                  collectives between ranks (over the backend's tensors)
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

mod scanner;

use scanner::{code_only, references, tokenize, Reference};
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
        "sysmem",
        "parse_only",
    ],
    &["tokenizer", "chat", "toolcall"],
    &["backend"],
    &["dist"],
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

/// Cycles tolerated while a change that removes them is under way: reported, not failed; the test
/// fails once one is gone, so that its entry goes too (directory under `src/`, files). None today.
const KNOWN_FILE_CYCLES: &[(&str, &[&str])] = &[];

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
        "{} lines against the layering (see the table at the top of tests/layering/main.rs):\n  {}",
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

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
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
