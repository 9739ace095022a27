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


def code_ok(func, test_file, rewrites=(None,), name=None):
    """True: `func` (unwrapped) is code of `test_file` as the file reads now, under the test's
    own `name` where one is given; False: it is not (another function's code, a callable
    without code, a function from elsewhere); None: cannot tell (no file, a file that does not
    compile). A test the task's own suite defines oddly is judged against the reference run."""
    for _ in range(20):
        inner = getattr(func, "__wrapped__", None)
        if inner is None:
            break
        func = inner
    func = getattr(func, "__func__", func)
    if not test_file:
        return None
    code = getattr(func, "__code__", None)
    if code is None:
        return False
    if name is not None and code.co_name != name:
        return False
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


# The test framework itself, watched (grader_sitecustomize.py for unittest, the pytest plugin for
# pytest): every attribute of the framework's modules and of the classes they define, held at the
# start of the run and compared as tests are recorded. Code under test that patches the framework
# to forgive failures, drop tests or change what runs (TestCase._callTestMethod,
# TestLoader.getTestCaseNames, _pytest.runner.runtestprotocol, Function.runtest, ...) changes one.
UNITTEST_MODULES = ("unittest.case", "unittest.loader", "unittest.suite", "unittest.runner",
                    "unittest.main", "unittest.result", "unittest.signals", "unittest.util")
PYTEST_MODULES = ("_pytest.python", "_pytest.runner", "_pytest.main", "_pytest.reports",
                  "_pytest.unittest", "_pytest.skipping", "_pytest.outcomes", "_pytest.nodes",
                  "_pytest.fixtures", "_pytest.doctest", "pluggy._hooks", "pluggy._callers",
                  "pluggy._manager", "pluggy.hooks", "pluggy.callers", "pluggy.manager")


_MISSING = object()


def framework_snapshot(module_names):
    """(the loaded modules among `module_names`, {qualified name: object} for every attribute of
    each and of the classes each defines: the objects themselves, compared by identity)."""
    import sys

    modules = tuple(name for name in module_names if sys.modules.get(name) is not None)
    found = {}
    for name in modules:
        for attr, value in list(vars(sys.modules[name]).items()):
            found[name + "." + attr] = value
            if isinstance(value, type) and getattr(value, "__module__", None) == name:
                for inner, member in list(vars(value).items()):
                    found[name + "." + attr + "." + inner] = member
    return (modules, found)


def framework_changes(snapshot):
    """The qualified names, among the modules `snapshot` covered, whose object is not the one it
    holds (added, removed or replaced), sorted."""
    modules, baseline = snapshot
    now = framework_snapshot(modules)[1]
    keys = set(baseline) | set(now)
    return sorted(k for k in keys if baseline.get(k, _MISSING) is not now.get(k, _MISSING))
