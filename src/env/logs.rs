//! Test-log parsers: a test runner's output to one status per test id, as the SWE-bench family's
//! harnesses read it (their `log_parsers.py`; the rules are re-derived here, not copied).
//!
//! ```text
//!   pytest -rA       PASSED tests/t.py::test_a           FAILED tests/t.py::test_b[x y] - Assert..
//!   pytest -v        tests/t.py::test_a PASSED [ 50%]    (verbose lines, older pytest, SWE-smith)
//!   Django/unittest  test_a (app.tests.T) ... ok         test_b (app.tests.T.test_b) ... FAIL
//!                    test_c (app.tests.T)                (a docstring's first line follows:)
//!                    Checks the thing. ... ERROR         both ids get the status
//!   sympy bin/test   test_a ok    test_b F    test_c E   ___ sympy/x/tests/test_y.py:test_b ___
//! ```
//!
//! Ids are kept as the runner prints them (a parametrised pytest id whole, spaces included);
//! [`lookup`] also finds an id by the shortened forms SWE-bench's lists use (a pytest id cut at
//! its first space, unittest's Python 3.11 `name (module.Class.name)` as `name (module.Class)`).

mod unittest;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// One test's outcome, ordered from best to worst (the worst of several is their `max`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub enum TestStatus {
    /// The runner's own pass status: the only one that counts as passed.
    Passed,
    /// An expected failure (pytest's XFAIL, unittest's "expected failure"). Not a pass: the code
    /// under test can declare it (`pytest.xfail()`); a listed test matches it only where the
    /// reference solution's run shows it too (grading.rs).
    XFail,
    /// A test expected to fail that passed (pytest's XPASS, unittest's "unexpected success").
    XPass,
    /// Skipped: never a pass, whoever raised the skip.
    Skipped,
    Failed,
    Error,
    /// Two different statuses for one test (after ids are made canonical): a log that says two
    /// things, or a log that disagrees with the runner's own record. Never a pass.
    Conflict,
}

impl TestStatus {
    /// The runner's own pass status, and nothing else.
    pub fn is_pass(self) -> bool {
        self == Self::Passed
    }

    /// Failed, errored or conflicting (a skip or an expected failure is neither).
    pub fn is_fail(self) -> bool {
        matches!(self, Self::Failed | Self::Error | Self::Conflict)
    }

    /// "passed", "xfail", "xpass", "skipped", "failed", "error", "conflicting".
    pub fn name(self) -> &'static str {
        match self {
            Self::Passed => "passed",
            Self::XFail => "xfail",
            Self::XPass => "xpass",
            Self::Skipped => "skipped",
            Self::Failed => "failed",
            Self::Error => "error",
            Self::Conflict => "conflicting",
        }
    }

    /// The status from its [`Self::name`] (the grader's result records use these names).
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "passed" => Self::Passed,
            "xfail" => Self::XFail,
            "xpass" => Self::XPass,
            "skipped" => Self::Skipped,
            "failed" => Self::Failed,
            "error" => Self::Error,
            "conflicting" => Self::Conflict,
            _ => return None,
        })
    }

    /// Two reports of one test: the same status, or [`Self::Conflict`].
    pub fn merge(self, other: Self) -> Self {
        if self == other {
            self
        } else {
            Self::Conflict
        }
    }
}

/// Records `status` for `id`, merging with what is there ([`TestStatus::merge`]).
pub fn record(statuses: &mut BTreeMap<String, TestStatus>, id: String, status: TestStatus) {
    statuses
        .entry(id)
        .and_modify(|s| *s = s.merge(status))
        .or_insert(status);
}

/// How a test command's output is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum LogParser {
    /// pytest's `-rA` summary lines (and verbose `id STATUS` lines).
    Pytest,
    /// [`Self::Pytest`], a bracketed option that is a path kept as its last component
    /// (`test_x[/tmp/a/b.txt]` -> `test_x[/b.txt]`), as SWE-bench reads requests, pylint, pydicom.
    PytestOptions,
    /// [`Self::Pytest`] with terminal colour codes removed (astropy, scikit-learn, sphinx).
    PytestV2,
    /// [`Self::PytestV2`], `MouseButton.LEFT`/`RIGHT` read as `1`/`3` as SWE-bench's lists have them.
    Matplotlib,
    /// seaborn's logs: read as [`Self::PytestV2`].
    Seaborn,
    /// Django's `runtests.py --verbosity 2`.
    Django,
    /// sympy's `bin/test --verbose`.
    Sympy,
    /// `python -m unittest -v` (the same shapes as Django's runner).
    Unittest,
}

impl LogParser {
    /// Every name [`FromStr`] accepts, for messages.
    pub const NAMES: &'static str = "pytest, pytest_options, pytest_v2, matplotlib, seaborn, \
        django, sympy, unittest, or SWE-bench's parse_log_<name> for these and astroid, astropy, \
        flask, marshmallow, pvlib, pydicom, pylint, pyvista, requests, scikit, sphinx, sqlfluff, \
        xarray";
}

impl LogParser {
    /// The runner is unittest's (the grader records unittest results in its processes).
    pub fn records_unittest(self) -> bool {
        matches!(self, Self::Django | Self::Unittest)
    }

    /// The grader's record of each test is expected from this runner (pytest's plugin or
    /// unittest's results); sympy's own runner keeps none, its log is all there is.
    pub fn expects_record(self) -> bool {
        self != Self::Sympy
    }
}

impl FromStr for LogParser {
    type Err = String;
    /// swerve's names and SWE-bench's / SWE-rebench's `parse_log_*` names (prefix optional).
    fn from_str(s: &str) -> Result<Self, String> {
        let name = s.trim().to_ascii_lowercase();
        let name = name.strip_prefix("parse_log_").unwrap_or(&name);
        Ok(match name {
            "pytest" | "astroid" | "flask" | "marshmallow" | "pvlib" | "pyvista" | "sqlfluff"
            | "xarray" => Self::Pytest,
            "pytest_options" | "requests" | "pylint" | "pydicom" => Self::PytestOptions,
            "pytest_v2" | "astropy" | "scikit" | "sphinx" => Self::PytestV2,
            "matplotlib" => Self::Matplotlib,
            "seaborn" => Self::Seaborn,
            "django" => Self::Django,
            "sympy" => Self::Sympy,
            "unittest" => Self::Unittest,
            _ => {
                return Err(format!(
                    "unknown log parser {s:?} (expected {})",
                    Self::NAMES
                ))
            }
        })
    }
}

impl fmt::Display for LogParser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Self::Pytest => "pytest",
            Self::PytestOptions => "pytest_options",
            Self::PytestV2 => "pytest_v2",
            Self::Matplotlib => "matplotlib",
            Self::Seaborn => "seaborn",
            Self::Django => "django",
            Self::Sympy => "sympy",
            Self::Unittest => "unittest",
        };
        f.write_str(name)
    }
}

/// Every test the log reports, with its status, ids in canonical form ([`canonical_id`]); a
/// test reported twice with different statuses is [`TestStatus::Conflict`] (not the last one
/// printed: the code under test prints into the log too).
pub fn parse_log(parser: LogParser, log: &str) -> BTreeMap<String, TestStatus> {
    let raw = match parser {
        LogParser::Django | LogParser::Unittest => unittest::parse(log),
        LogParser::Sympy => unittest::parse_sympy(log),
        _ => parse_pytest(parser, log),
    };
    canonical(raw)
}

/// `statuses` with every id in canonical form, merged where two become one.
pub fn canonical(statuses: BTreeMap<String, TestStatus>) -> BTreeMap<String, TestStatus> {
    let mut out = BTreeMap::new();
    for (id, status) in statuses {
        record(&mut out, canonical_id(&id).into_owned(), status);
    }
    out
}

/// A runner's own id for a test (pytest's node id, unittest's `str(test)`) as the parser's log
/// form would show it ([`LogParser::PytestOptions`]' shortened paths, matplotlib's buttons), in
/// canonical form.
pub fn runner_id(parser: LogParser, id: &str) -> String {
    let mut id = id.to_string();
    if parser == LogParser::Matplotlib {
        id = id
            .replace("MouseButton.LEFT", "1")
            .replace("MouseButton.RIGHT", "3");
    }
    if parser == LogParser::PytestOptions {
        id = shorten_path_option(&id);
    }
    canonical_id(&id).into_owned()
}

/// `id`'s status in `statuses` (canonical ids, as [`parse_log`] gives them): the canonical id
/// itself, else by the shortened form SWE-bench's lists use for a parametrised pytest id (its
/// first whitespace-separated word; the worst status when several share it).
pub fn lookup(statuses: &BTreeMap<String, TestStatus>, id: &str) -> Option<TestStatus> {
    let id = canonical_id(id);
    if let Some(&status) = statuses.get(id.as_ref()) {
        return Some(status);
    }
    if id.contains(char::is_whitespace) {
        return None;
    }
    statuses
        .iter()
        .filter(|(key, _)| key.contains('[') && key.split_whitespace().next() == Some(&id))
        .map(|(_, &status)| status)
        .max()
}

/// The one form every id is matched in: unittest's Python 3.11 `name (module.Class.name)` as
/// `name (module.Class)` (the form SWE-bench's lists use); other ids unchanged.
pub fn canonical_id(id: &str) -> Cow<'_, str> {
    let Some((name, rest)) = id.split_once(" (") else {
        return Cow::Borrowed(id);
    };
    match rest.strip_suffix(')').and_then(|r| r.strip_suffix(name)) {
        Some(path) if !name.is_empty() && path.len() > 1 && path.ends_with('.') => {
            Cow::Owned(format!("{name} ({})", &path[..path.len() - 1]))
        }
        _ => Cow::Borrowed(id),
    }
}

const PYTEST_WORDS: &[(&str, TestStatus)] = &[
    ("PASSED", TestStatus::Passed),
    ("FAILED", TestStatus::Failed),
    ("ERROR", TestStatus::Error),
    ("SKIPPED", TestStatus::Skipped),
    ("XFAIL", TestStatus::XFail),
    // A test expected to fail that passed (non-strict): not the runner's pass status.
    ("XPASS", TestStatus::XPass),
];

fn parse_pytest(parser: LogParser, log: &str) -> BTreeMap<String, TestStatus> {
    let mut statuses = BTreeMap::new();
    for raw in log.lines() {
        let mut line = strip_ansi(raw);
        if parser == LogParser::Matplotlib {
            line = line
                .replace("MouseButton.LEFT", "1")
                .replace("MouseButton.RIGHT", "3");
        }
        let found = pytest_summary_line(&line).or_else(|| pytest_verbose_line(&line));
        if let Some((mut id, status)) = found {
            if parser == LogParser::PytestOptions {
                id = shorten_path_option(&id);
            }
            record(&mut statuses, id, status);
        }
    }
    statuses
}

/// `STATUS id[ - message]` (`-rA`'s short summary); a skip's `SKIPPED [1] path:line: why` is
/// keyed `path:line`.
fn pytest_summary_line(line: &str) -> Option<(String, TestStatus)> {
    let (word, rest) = line.split_once(' ')?;
    let &(_, status) = PYTEST_WORDS.iter().find(|(w, _)| *w == word)?;
    let rest = rest.trim_start();
    if status == TestStatus::Skipped && rest.starts_with('[') {
        let location = rest.split_once("] ")?.1;
        let end = location.find(": ").unwrap_or(location.len());
        return Some((location[..end].to_string(), status));
    }
    let id = node_id(rest)?;
    Some((id.to_string(), status))
}

/// `id STATUS` or `id STATUS [ 50%]` (pytest's verbose progress lines); the id holds `::`.
fn pytest_verbose_line(line: &str) -> Option<(String, TestStatus)> {
    let mut text = line.trim_end();
    if text.ends_with("%]") {
        text = text[..text.rfind('[')?].trim_end();
    }
    let (id, word) = text.rsplit_once(' ')?;
    let &(_, status) = PYTEST_WORDS.iter().find(|(w, _)| *w == word)?;
    let id = id.trim();
    (id.contains("::") && !id.is_empty()).then(|| (id.to_string(), status))
}

/// The node id at the start of `rest`: up to the first space, unless a `[` parameter opens
/// before it, which runs to its matching `]` (spaces included).
fn node_id(rest: &str) -> Option<&str> {
    let space = rest.find(char::is_whitespace).unwrap_or(rest.len());
    let open = match rest.find('[') {
        Some(open) if open < space => open,
        _ => return (space > 0).then(|| &rest[..space]),
    };
    let mut depth = 0usize;
    for (i, c) in rest[open..].char_indices() {
        match c {
            '[' => depth += 1,
            ']' => {
                depth -= 1;
                if depth == 0 {
                    return Some(&rest[..open + i + 1]);
                }
            }
            _ => {}
        }
    }
    (space > 0).then(|| &rest[..space])
}

/// `main[/some/path/file]` -> `main[/file]` (a `//` or `*` option is left whole).
fn shorten_path_option(id: &str) -> String {
    let Some(open) = id.find('[') else {
        return id.to_string();
    };
    let (main, option) = (&id[..open], &id[open + 1..]);
    let Some(option) = option.strip_suffix(']') else {
        return id.to_string();
    };
    if option.starts_with('/') && !option.starts_with("//") && !option.contains('*') {
        let last = option.rsplit('/').next().unwrap_or("");
        format!("{main}[/{last}]")
    } else {
        id.to_string()
    }
}

/// `line` without terminal escape sequences (`ESC [ ... m`) and other control characters.
pub(crate) fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.peek() == Some(&'[') {
                chars.next();
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
        } else if c == '\t' || !c.is_control() {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests;
