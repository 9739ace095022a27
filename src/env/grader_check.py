# swerve's grader (src/env/grading.rs): whether a test's code, as it runs, is what its file
# compiles to. An import hook that rewrites a test module, a test method replaced at load time,
# a function whose __code__ was swapped: each runs code its file does not hold. Imported by the
# grader's unittest hook (sitecustomize.py) and pytest plugin from the grader's folder.
#
# Written for every Python SWE-bench images carry (3.5 and later).
import ast
import os

_compiled = {}


def _codes(path, rewrite):
    key = (path, rewrite is not None)
    if key in _compiled:
        return _compiled[key]
    found = None
    try:
        with open(path, "rb") as f:
            source = f.read()
        tree = ast.parse(source, filename=path)
        if rewrite is not None:
            rewrite(tree, source, path)
        stack = [compile(tree, path, "exec", dont_inherit=True)]
        found = {}
        while stack:
            code = stack.pop()
            found.setdefault((code.co_name, code.co_firstlineno), []).append(code.co_code)
            for const in code.co_consts:
                if hasattr(const, "co_code"):
                    stack.append(const)
    except Exception:
        found = None
    _compiled[key] = found
    return found


def _same_file(a, b):
    try:
        return os.path.realpath(a) == os.path.realpath(b)
    except Exception:
        return False


def code_ok(func, test_file, rewrites=(None,)):
    """True: `func` (unwrapped) is code of `test_file` as the file reads now; False: it is
    not; None: cannot tell (no code object, no file)."""
    for _ in range(20):
        inner = getattr(func, "__wrapped__", None)
        if inner is None:
            break
        func = inner
    func = getattr(func, "__func__", func)
    code = getattr(func, "__code__", None)
    if code is None or not test_file:
        return None
    if test_file.endswith((".pyc", ".pyo")):
        test_file = test_file[:-1]
    if not _same_file(code.co_filename, test_file):
        return False
    for rewrite in rewrites:
        codes = _codes(test_file, rewrite)
        if codes is None:
            return None
        if code.co_code in codes.get((code.co_name, code.co_firstlineno), ()):
            return True
    return False
