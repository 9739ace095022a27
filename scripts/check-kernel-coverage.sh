#!/usr/bin/env bash
# Every `extern "C" __global__` kernel in kernels/*.cu must be launched by some GPU test
# (tests/gpu_*.rs, which CI runs on the emulated device). Lists the kernels that are not, and
# exits 1 if there is any; with -v, prints for each kernel the chain that covers it.
#
#   scripts/check-kernel-coverage.sh [-v]
#
# The rule (static, by name; python3, no build needed):
#   1. Kernels: every `extern "C" __global__` function of kernels/*.cu, including those a macro
#      declares (`#define ENTRY(name, ...) extern "C" __global__ ... name(...)`, expanded at each
#      `ENTRY(actual_name, ...)`).
#   2. Launch site: a string literal in src/backend/cuda/*.rs that is the kernel's name, or a
#      format string that produces it (`"paged_attn_{kind}_hd{head_dim}"`), where the text each
#      `{...}` stands for must appear as a literal (a number, a string's text) in that function or
#      in one it calls in src/backend/cuda, up to three calls down (`attention_variant`'s `[16, 32, 64, 128]` and
#      `"decode"`: a `paged_attn_decode_hd256` would have no launch site). The launch function is the Rust function containing that literal if it
#      launches (`launch_builder`) or hands the name to a function that does (`rope_fwd` ->
#      `rope_launch`), else the functions of src/backend/cuda/*.rs that call it and launch (a
#      variant picker such as `attention_variant` only names the kernel: a test that calls the
#      picker alone, to load the kernel, does not count).
#   3. Reached from a test: the launch function, or any function in src/ that calls it (by name:
#      `name(`, `.name(`, `::name(`), transitively, is called by a test in tests/gpu_*.rs: a
#      `#[test]` function (not ignored outside the emulator: a bare `#[ignore]` test never runs
#      in CI) or a helper in the same file or in tests/common/ that a test calls.
# Calls are matched by name, so the analysis over-approximates (a call to another function of
# the same name counts), and among the variants one launch function picks by a run-time value
# (head dim, shared-memory limit) it cannot tell which ones the tests' shapes reach: that stays
# the tests' job (e.g. gpu_paged.rs runs every head dim and forces the small-shared-memory
# variant). The -v chains show what each kernel's coverage rests on. A kernel whose launch goes
# through no function a test reaches, or that has no launch site, is listed.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 - "$@" <<'PY'
import glob
import re
import sys

verbose = "-v" in sys.argv[1:]


def strip_c_comments(text):
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def skip_launch_bounds(text, i):
    """Index after an optional `__launch_bounds__(...)` (balanced parentheses) at text[i:]."""
    m = re.compile(r"\s*__launch_bounds__\s*\(").match(text, i)
    if not m:
        return i
    depth, j = 1, m.end()
    while depth and j < len(text):
        depth += {"(": 1, ")": -1}.get(text[j], 0)
        j += 1
    return j


def kernel_name_at(text, i):
    """The identifier naming the kernel after `extern "C" __global__ void` ending at i."""
    j = skip_launch_bounds(text, i)
    m = re.compile(r"\s*(\w+)\s*\(").match(text, j)
    return m.group(1) if m else None


HEAD = re.compile(r'extern\s+"C"\s+__global__\s+void')


def kernels_of(path):
    text = strip_c_comments(open(path).read())
    joined = text.replace("\\\n", " ")  # macro bodies on one line
    names = []
    macros = {}  # macro name -> index of the parameter that names the kernel
    for m in re.finditer(r"^[ \t]*#\s*define\s+(\w+)\(([^)]*)\)(.*)$", joined, flags=re.M):
        params = [p.strip() for p in m.group(2).split(",")]
        body = m.group(3)
        h = HEAD.search(body)
        if h:
            name = kernel_name_at(body, h.end())
            if name in params:
                macros[m.group(1)] = params.index(name)
    for line_no, line in enumerate(joined.split("\n")):
        if re.match(r"\s*#", line):
            continue
        for h in HEAD.finditer(line):
            name = kernel_name_at(line, h.end())
            if name:
                names.append(name)
    # Direct declarations may span lines: scan the whole text too.
    direct = set()
    for h in HEAD.finditer(text):
        line_start = text.rfind("\n", 0, h.start()) + 1
        if re.match(r"\s*#", text[line_start:h.start()]):
            continue
        name = kernel_name_at(text, h.end())
        if name:
            direct.add(name)
    for macro, index in macros.items():
        for m in re.finditer(r"^\s*%s\s*\(([^)]*)\)" % re.escape(macro), text, flags=re.M):
            args = [a.strip() for a in m.group(1).split(",")]
            if len(args) > index and re.fullmatch(r"\w+", args[index]):
                direct.add(args[index])
    return sorted(direct)


def strip_rust(text):
    """Rust source with comments removed; string literals kept (they name the kernels)."""
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            out.append("\n" * text.count("\n", i, n if j < 0 else j))
            i = n if j < 0 else j + 2
        elif text[i] == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i : j + 1])
            i = j + 1
        elif text[i] == "'" and re.match(r"'(\\.|[^\\'])'", text[i : i + 4]):
            m = re.match(r"'(\\.|[^\\'])'", text[i : i + 4])
            out.append(m.group(0))
            i += len(m.group(0))
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


FN = re.compile(r"\bfn\s+(\w+)")


def functions(path):
    """[(name, body, attributes)] of every fn with a body in a Rust file (nested ones too)."""
    text = strip_rust(open(path).read())
    result = []
    for m in FN.finditer(text):
        brace = text.find("{", m.end())
        semi = text.find(";", m.end())
        if brace < 0 or (0 <= semi < brace):
            continue  # a declaration without a body
        depth, j = 0, brace
        while j < len(text):
            c = text[j]
            if c == '"':
                k = j + 1
                while k < len(text) and text[k] != '"':
                    k += 2 if text[k] == "\\" else 1
                j = k
            elif c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    break
            j += 1
        start = text.rfind("\n", 0, m.start())
        attrs = text[max(0, start - 400) : m.start()]
        # Only the attributes directly above: cut at the previous item's end.
        cut = max(attrs.rfind("}"), attrs.rfind(";"))
        result.append((m.group(1), text[brace : j + 1], attrs[cut + 1 :]))
    return result


def calls(body):
    return set(re.findall(r"(?:^|[^\w])(\w+)\s*(?:::<[^>]*>)?\s*\(", body))


def literal_pattern(lit, tokens):
    """A regex for what a (format) string literal can produce, each `{...}` standing for one of
    `tokens` or nothing; None for a message."""
    if " " in lit or len(re.sub(r"\{[^}]*\}", "", lit)) < 4:
        return None
    alternatives = "(?:%s)?" % "|".join(re.escape(t) for t in sorted(tokens, key=len, reverse=True))
    parts = re.split(r"(\{[^}]*\})", lit)
    return "".join(alternatives if p.startswith("{") else re.escape(p) for p in parts)


def literal_tokens(body):
    """Numbers, identifiers and string texts (and their `_`-separated pieces) in a body."""
    tokens = set(re.findall(r"\w+", body))
    for text in re.findall(r'"((?:\\.|[^"\\])*)"', body):
        tokens.add(text)
    return tokens


# 1. kernels
kernels = {}
for path in sorted(glob.glob("kernels/*.cu")):
    for name in kernels_of(path):
        kernels[name] = path

# 2. launch sites: the fn containing a literal producing the kernel's name if it launches, else
# the launching fns of src/backend/cuda that call it (up to four levels up)
named = {k: set() for k in kernels}
launchers, cuda_callers, cuda_calls, cuda_tokens = set(), {}, {}, {}
cuda_fns = []
for path in sorted(glob.glob("src/backend/cuda/*.rs")):
    for fname, body, _ in functions(path):
        cuda_fns.append((fname, body))
        if "launch_builder" in body:
            launchers.add(fname)
        cuda_calls.setdefault(fname, set()).update(calls(body))
        cuda_tokens.setdefault(fname, set()).update(literal_tokens(body))
        for c in calls(body):
            if c != fname:
                cuda_callers.setdefault(c, set()).add(fname)
def reachable_tokens(fname, depth=3):
    """The literals of `fname` and of the src/backend/cuda functions it calls, `depth` levels
    down (a picker may hand the head dims to a helper: `attention_variant` -> `choose_variant`)."""
    tokens, level, seen = set(cuda_tokens[fname]), {fname}, {fname}
    for _ in range(depth):
        level = {c for f in level for c in cuda_calls.get(f, ()) if c in cuda_tokens} - seen
        seen |= level
        for c in level:
            tokens |= cuda_tokens[c]
    return tokens


for fname, body in cuda_fns:
    tokens = reachable_tokens(fname)
    for lit in re.findall(r'"((?:\\.|[^"\\])*)"', body):
        # Every placeholder's text (empty allowed) must be a literal the code has.
        pattern = literal_pattern(lit, tokens)
        if pattern is None:
            continue
        for k in kernels:
            if re.fullmatch(pattern, k):
                named[k].add(fname)
launch = {}
for k, fns in named.items():
    # A function that launches, or passes the name to a launching function it calls.
    found = {f for f in fns if f in launchers or cuda_calls.get(f, set()) & launchers}
    level = set(fns) - found
    for _ in range(4):
        found |= level & launchers
        level = {c for f in level - launchers for c in cuda_callers.get(f, ())}
    launch[k] = found

# 3. callers by name, over src/
callers = {}
for path in glob.glob("src/**/*.rs", recursive=True):
    for fname, body, _ in functions(path):
        for c in calls(body):
            if c != fname:
                callers.setdefault(c, set()).add(fname)

# tests: what each running #[test] of tests/gpu_*.rs calls, through same-file and common helpers
common = {}
for path in glob.glob("tests/common/*.rs"):
    for fname, body, _ in functions(path):
        common.setdefault(fname, set()).update(calls(body))
test_calls = {}  # "file::test" -> names called, transitively through helpers
for path in sorted(glob.glob("tests/gpu_*.rs")):
    fns = functions(path)
    local = {}
    for fname, body, _ in fns:
        local.setdefault(fname, set()).update(calls(body))
    helpers = {**common, **local}
    for fname, body, attrs in fns:
        if "#[test]" not in attrs:
            continue
        if re.search(r"^\s*#\[ignore\b", attrs, flags=re.M):
            continue  # never runs in CI
        seen, todo = set(), [fname]
        while todo:
            f = todo.pop()
            for c in helpers.get(f, ()):
                if c not in seen:
                    seen.add(c)
                    if c in helpers:
                        todo.append(c)
        test_calls["%s::%s" % (path, fname)] = seen


def chain_to_test(start_fns):
    """Shortest chain launch fn -> caller -> ... -> test, by breadth-first search upward."""
    frontier = [[f] for f in sorted(start_fns)]
    visited = set(start_fns)
    for _ in range(10):
        next_frontier = []
        for chain in frontier:
            f = chain[-1]
            for test, names in test_calls.items():
                if f in names:
                    return chain + [test]
            for caller in sorted(callers.get(f, ())):
                if caller not in visited:
                    visited.add(caller)
                    next_frontier.append(chain + [caller])
        frontier = next_frontier
        if not frontier:
            break
    return None


uncovered = []
for k in sorted(kernels):
    if not named[k]:
        uncovered.append("%s (%s): no launch site in src/backend/cuda/*.rs" % (k, kernels[k]))
        continue
    if not launch[k]:
        uncovered.append(
            "%s (%s): named in %s, which launches nothing and no launching function calls"
            % (k, kernels[k], ", ".join(sorted(named[k])))
        )
        continue
    chain = chain_to_test(launch[k])
    if chain is None:
        uncovered.append(
            "%s (%s): launched from %s, which no GPU test reaches"
            % (k, kernels[k], ", ".join(sorted(launch[k])))
        )
    elif verbose:
        print("%-34s %s" % (k, " <- ".join(chain)))

print("%d kernels in kernels/*.cu, %d launched by a GPU test" % (len(kernels), len(kernels) - len(uncovered)))
if uncovered:
    print("not launched by any GPU test (tests/gpu_*.rs):")
    for line in uncovered:
        print("  " + line)
    sys.exit(1)
PY
