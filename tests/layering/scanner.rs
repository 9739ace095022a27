//! The layering check's scanner: Rust source with comments and literals blanked, cut into
//! tokens, and every `crate::` / `self::` / `super::` path in it resolved to absolute module
//! segments (grouped `use` forms expanded), with the inline modules open at each path.

/// A path in code, resolved to absolute module segments (`crate::` stripped).
#[derive(Clone, Debug, PartialEq)]
pub struct Reference {
    pub line: usize,
    pub target: Vec<String>,
    /// Inside a `#[cfg(test)]` inline module.
    pub in_test: bool,
}

/// The source with comments (doc comments included), string, byte-string, raw-string and char
/// literals blanked to spaces; newlines are kept, so line numbers stay. Lifetimes stay.
pub fn code_only(src: &str) -> String {
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
pub struct Token {
    pub text: String,
    pub line: usize,
}

/// Identifiers (and numbers), `::`, and single punctuation characters.
pub fn tokenize(code: &str) -> Vec<Token> {
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
pub fn references(code: &str, file_module: &[String]) -> Vec<Reference> {
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

// ---- the scanner's own checks: it must see what it is meant to see -------------------------

#[cfg(test)]
mod tests {
    use super::*;

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
}
