# swerve's grader (src/env/grading.rs): whether a test's code, as it runs, is what its file
# compiles to. An import hook that rewrites a test module, a test method replaced at load time,
# a function whose __code__ was swapped: each runs code its file does not hold. Imported by the
# grader's unittest hook (sitecustomize.py) and pytest plugin from the grader's folder.
#
# Written for every Python SWE-bench images carry (3.5 and later).
import ast
import os

_compiled = {}
# The compiler as it is when the grader loads (before any workspace code runs): the reference
# compile of a test file goes through these, never through `ast.parse` or `builtins.compile`
# as code under test may have left them.
_compile = compile
_ONLY_AST = ast.PyCF_ONLY_AST
# The same for the helpers the checks call while the tests run (a replaced `update_wrapper`
# would be handed the witness itself; a replaced `gc.get_referents` would hand the write watch
# another dict).
import functools as _functools  # noqa: E402
import gc as _gc  # noqa: E402

_update_wrapper = _functools.update_wrapper
_get_referents = _gc.get_referents
_audit = getattr(__import__("sys"), "audit", None)


def _codes(path, rewrite):
    key = (path, rewrite is not None)
    if key in _compiled:
        return _compiled[key]
    found = None
    try:
        source = _pinned.get(os.path.realpath(path))
        if source is None:
            with open(path, "rb") as f:
                source = f.read()
        tree = _compile(source, path, "exec", _ONLY_AST, dont_inherit=True)
        if rewrite is not None:
            rewrite(tree, source, path)
        stack = [_compile(tree, path, "exec", dont_inherit=True)]
        found = {}
        while stack:
            code = stack.pop()
            found.setdefault((code.co_name, code.co_firstlineno), []).append(code)
            for const in code.co_consts:
                if hasattr(const, "co_code"):
                    stack.append(const)
    except Exception:
        found = None
    _compiled[key] = found
    return found


# The task's own test files as the grader installed them, read as the test process starts
# (`pin_sources`): a test is checked against that text, so a file rewritten during the run (and
# the test recompiled from it) is not the file's code.
_pinned = {}


_process = {"descendant": False}


def mark_process():  # started by another graded process? (editable: the ledger decides too)
    first = os.environ.setdefault("SWERVE_GRADER_FIRST_PROCESS", str(os.getpid()))
    _process["descendant"] = first != str(os.getpid())


def descendant():
    return _process["descendant"]


# The ledger's `record` (grader_sitecustomize._swerve_open_ledger), handed to the pytest plugin
# once; never kept on this module.
_handoff = []


def take_ledger():  # the ledger's `record`, once
    return _handoff.pop() if _handoff else None


def pin_sources(workdir, owned_json):
    import json

    try:
        paths = json.loads(owned_json or "[]")
    except ValueError:
        return
    for rel in paths if isinstance(paths, list) else ():
        try:
            path = os.path.realpath(os.path.join(workdir, rel))
            with open(path, "rb") as f:
                _pinned[path] = f.read()
        except (OSError, TypeError):
            pass


def _same_file(a, b):
    try:
        return os.path.realpath(a) == os.path.realpath(b)
    except Exception:
        return False


def _chain(func):
    """`func` and what it wraps (`__wrapped__`), outermost first, bound methods as functions."""
    chain = []
    for _ in range(20):
        func = getattr(func, "__func__", func)
        chain.append(func)
        inner = getattr(func, "__wrapped__", None)
        if inner is None:
            break
        func = inner
    return chain


def code_ok(func, test_file, rewrites=(None,), name=None):
    """True: `func` (unwrapped) is code of `test_file` as the file reads now, under the test's
    own `name` where one is given; False: it is not (another function's code, a callable
    without code, a function from elsewhere); None: cannot tell (no file, a file that does not
    compile). A test the task's own suite defines oddly is judged against the reference run."""
    func = _chain(func)[-1]
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
        if _known(code, codes):
            return True
    return False


def _known(code, codes):
    """`code` is one of `codes`' at its name and first line, as a whole: its bytecode and its
    constants, names, flags, exception and line tables (code objects compare all of these; the
    bytecode alone would pass a test whose constants or exception table were swapped)."""
    for compiled in codes.get((code.co_name, code.co_firstlineno), ()):
        try:
            if code == compiled:
                return True
        except Exception:
            pass
    return False


# The test framework itself, watched (grader_sitecustomize.py for unittest, the pytest plugin for
# pytest): every attribute of the framework's modules and of the classes they define, held at the
# start of the run and compared as tests are recorded. Code under test that patches the framework
# to forgive failures, drop tests or change what runs (TestCase._callTestMethod,
# TestLoader.getTestCaseNames, _pytest.runner.runtestprotocol, Function.runtest, ...) changes one.
# contextlib: unittest's test parts and subtests run inside its context managers (a patched
# exit swallows a subtest's failure inside the test function, where the witnessed call below
# cannot see it).
UNITTEST_MODULES = ("unittest.case", "unittest.loader", "unittest.suite", "unittest.runner",
                    "unittest.main", "unittest.result", "unittest.signals", "unittest.util",
                    "unittest.mock", "contextlib")
PYTEST_MODULES = ("_pytest.python", "_pytest.runner", "_pytest.main", "_pytest.reports",
                  "_pytest.unittest", "_pytest.skipping", "_pytest.outcomes", "_pytest.nodes",
                  "_pytest.fixtures", "_pytest.doctest", "pluggy._hooks", "pluggy._callers",
                  "pluggy._manager", "pluggy.hooks", "pluggy.callers", "pluggy.manager",
                  "_pytest.python_api", "_pytest.raises", "_pytest.recwarn",
                  "_pytest.assertion.rewrite", "unittest.case",
                  "unittest.mock", "contextlib")


_MISSING = object()


def framework_snapshot(module_names):
    """(the loaded modules among `module_names`, {qualified name: object} for every attribute of
    each and of the classes each defines: the objects themselves, compared by identity)."""
    import sys

    modules = tuple(name for name in module_names if sys.modules.get(name) is not None)
    # The trace and profile functions: one set while the tests run can move a test's frame past
    # its failing line (a trace function may set f_lineno).
    found = {"sys.gettrace()": sys.gettrace(), "sys.getprofile()": sys.getprofile()}
    monitoring = getattr(sys, "monitoring", None)
    for tool in range(6) if monitoring is not None else ():
        try:
            found["sys.monitoring.get_tool(%d)" % tool] = monitoring.get_tool(tool)
        except Exception:
            pass
    for name in modules:
        for attr, value in list(vars(sys.modules[name]).items()):
            found[name + "." + attr] = value
            # A module-level object's class too: swapping `__class__` keeps the object; and
            # the callables on its own dict (`defaultTestLoader.suiteClass`, which builds
            # every test's suite).
            if not isinstance(value, type) and not callable(value):
                found[name + "." + attr + ".__class__"] = type(value)
                for inner, member in list(_own_dict(value).items()):
                    if callable(member):
                        found[name + "." + attr + "." + inner] = member
            _function_parts(found, name + "." + attr, value)
            if isinstance(value, type) and getattr(value, "__module__", None) == name:
                for inner, member in list(vars(value).items()):
                    found[name + "." + attr + "." + inner] = member
                    _function_parts(found, name + "." + attr + "." + inner, member)
    return (modules, found)


def _own_dict(value):
    if isinstance(value, type(os)):
        return {}
    try:
        own = vars(value)
    except TypeError:
        return {}
    return own if type(own) is dict else {}


def _function_parts(found, label, value):
    # A function's code and default arguments are its own attributes: a larger default `delta`
    # for assertAlmostEqual, or another `__code__`, keeps the function object.
    value = getattr(value, "__func__", value)
    if type(value).__name__ != "function":
        return
    for part in ("__code__", "__defaults__", "__kwdefaults__"):
        found[label + "." + part] = getattr(value, part, None)


def framework_changes(snapshot):
    """The qualified names `snapshot` covers whose object changed (added, removed, replaced)."""
    modules, baseline = snapshot
    now = framework_snapshot(modules)[1]
    keys = set(baseline) | set(now)
    return sorted(k for k in keys if not _same(baseline.get(k, _MISSING), now.get(k, _MISSING)))


def _same(a, b):
    # By identity; a monitoring tool's name is a string, compared by value.
    return a is b or (type(a) is str and type(b) is str and a == b)


# Namespaces written while a test ran. A patch made inside the test's own call and taken back
# before its record (a one-shot `_getAssertEqualityFunc` that puts the original back as it
# runs) leaves every object where it was at both checks above: the write itself is what shows.
# CPython 3.6 to 3.13 keep in every dict a version that each write moves (PEP 509), and a
# module's globals and a class's attributes live in such dicts. Watched: the framework's modules
# and their classes, at every check of the run (any write: `framework_writes`), and the test's
# module and its classes from the workspace, from the test's start to its record (a write that
# leaves them as they were: a test that sets a class attribute in setUp changes them; a patch
# put back does not). Elsewhere (another Python, a dict laid out otherwise) the reader finds no
# version and this watch is off.
_versions = {"read": None, "tried": False}
_class_dicts = {}


def _version_reader():
    if _versions["tried"]:
        return _versions["read"]
    _versions["tried"] = True
    try:
        import ctypes
        import sys

        if getattr(sys, "implementation", None) is None or sys.implementation.name != "cpython":
            return None
        # PyDictObject: the object header, ma_used, then the 64-bit ma_version_tag.
        offset = 2 * ctypes.sizeof(ctypes.c_void_p) + ctypes.sizeof(ctypes.c_ssize_t)
        from_address = ctypes.c_uint64.from_address

        def read(mapping):
            return from_address(id(mapping) + offset).value

        # Calibrated: a write of an existing key moves it, a read does not, every time.
        probe = {"a": 1}
        seen = [read(probe)]
        for value in (2, 1, 2):
            probe["a"] = value
            seen.append(read(probe))
        if len(set(seen)) != len(seen) or read(probe) != seen[-1] or probe.get("a") != 2:
            return None
        _versions["read"] = read
    except Exception:
        return None
    return _versions["read"]


def _namespace(obj):
    """The dict holding `obj`'s attributes (a module's globals, a class's own dict), or None."""
    if isinstance(obj, type):
        found = _class_dicts.get(id(obj))
        if found is None or found[0] is not obj:
            inner = [r for r in _get_referents(vars(obj)) if type(r) is dict]
            found = (obj, inner[0] if len(inner) == 1 else None)
            _class_dicts[id(obj)] = found
        return found[1]
    try:
        return vars(obj) if type(vars(obj)) is dict else None
    except TypeError:
        return None


def _framework_namespaces(module_names):
    import sys

    found = []
    for name in module_names:
        module = sys.modules.get(name)
        if module is None:
            continue
        found.append((name, module))
        for attr, value in list(vars(module).items()):
            if isinstance(value, type) and getattr(value, "__module__", None) == name:
                found.append((name + "." + attr, value))
    return found


def framework_writes(watch, when):
    """The framework's namespaces (`watch["modules"]`' modules and their classes) written since
    the last call, as "NAME written WHEN"; the first call (and a namespace first seen, a module
    loaded since) only takes their versions. Kept over the whole run, not per test: a patch
    made while the tests load and taken back before the first one starts is a write too."""
    read = _version_reader()
    if read is None:
        return []
    found = []
    seen = watch.setdefault("seen", {})
    for label, obj in _framework_namespaces(watch["modules"]):
        mapping = _namespace(obj)
        if mapping is None:
            continue
        version = read(mapping)
        before = seen.get(label)
        seen[label] = (mapping, version)
        if before is not None and (before[0] is not mapping or before[1] != version):
            found.append("%s written %s" % (label, when))
    return found


def writes_start(test_classes, test_module, workdir):
    """What `writes_seen` compares with at the test's record: the test's own module's and
    workspace classes' dicts, their versions and what they hold. None where versions cannot be
    read."""
    read = _version_reader()
    if read is None:
        return None
    watched = []
    try:
        own = [("module " + getattr(test_module, "__name__", "?"), test_module)]
        for klass in test_classes:
            module = _module_named(getattr(klass, "__module__", None))
            if _inside(getattr(module, "__file__", None) or "", workdir):
                own.append((klass.__module__ + "." + getattr(klass, "__qualname__", "?"), klass))
        for label, obj in own:
            mapping = _namespace(obj) if obj is not None else None
            if mapping is not None:
                watched.append((label, mapping, read(mapping), dict(mapping)))
    except Exception:
        return None
    return watched


def _module_named(name):
    import sys

    return sys.modules.get(name) if name else None


def writes_seen(start, test_id):
    """The test's own namespaces written since `writes_start` and left as they were, as "NAME
    patched and put back while TEST ran"."""
    read = _version_reader()
    if start is None or read is None:
        return []
    found = []
    for label, mapping, version, held in start:
        try:
            if read(mapping) == version:
                continue
            if len(held) == len(mapping) and all(
                    k in mapping and mapping[k] is v for k, v in held.items()):
                found.append("%s patched and put back while %s ran" % (label, test_id))
        except Exception:
            pass
    return found


# What stands between the framework and the test's own code: each wrapper around the test
# function (a decorator's, or one put there at run time), described by where its code comes
# from. A forgiver wrapped around a failing test (`functools.wraps` keeps `__wrapped__`, so the
# code check above still finds the test's own code inside) shows as a wrapper the reference
# run does not have.
def _describe(obj, workdir):
    code = getattr(obj, "__code__", None)
    if code is None:
        code = getattr(getattr(type(obj), "__call__", None), "__code__", None)
    if code is None:
        kind = type(obj)
        heap = getattr(kind, "__flags__", 0) & (1 << 9)  # Py_TPFLAGS_HEAPTYPE: a Python class
        return "<%s %s.%s>" % ("class" if heap else "builtin", getattr(kind, "__module__", "?"),
                               getattr(kind, "__qualname__", getattr(kind, "__name__", "?")))
    path = code.co_filename
    try:
        inside = os.path.realpath(path)
        root = os.path.realpath(workdir)
        if inside.startswith(root + os.sep):
            path = os.path.relpath(inside, root)
    except Exception:
        pass
    codes = _codes(code.co_filename, None) if os.path.isfile(code.co_filename) else None
    known = codes is not None and _known(code, codes)
    # A code object claiming a file whose compiled code it is not is marked: its name and file
    # are only strings.
    return "%s:%s%s" % (path, code.co_name, "" if known else "?")


def wrappers(func, workdir):
    """The wrappers around the test function `func` leads to, outermost first (or empty)."""
    chain = _chain(func)
    return [_describe(link, workdir) for link in chain[:-1]]


# The call of the test's own function, witnessed from the inside: the grader puts `witness` in
# the place the framework takes the test from (unittest's test method on the instance, pytest's
# `item.obj`), so anything that forgives a failure on its way out (a patched _callTestMethod,
# a hook-call monitor, a context manager's exit, ExceptionInfo) is outside it. A test recorded
# passed whose witnessed call raised, or that never called it, was forgiven.
def witness(method, key, calls, verify=None):
    """A callable calling `method` that notes in `calls[key]` how the call ended: "returned",
    "raised", "deferred" (an awaitable the framework runs later), "running" while it runs.
    `verify` (the recorder's code check) runs as the call begins and as it ends: the test's
    code is checked where it runs, not only before the framework's own steps (a `__code__`
    swapped between the check at the test's start and the call, by anything the framework
    does in between, is seen)."""

    def swerve_witness(*args, **kwargs):
        # Each state announced to the audit hook too (grader_sitecustomize.py, 7), which keeps
        # its own copy out of the process's reach.
        calls[key] = "running"
        if _audit is not None:
            _audit("swerve-grader.call", key, "running")
        if verify is not None:
            verify()
        try:
            result = method(*args, **kwargs)
        except BaseException:
            calls[key] = "raised"
            if _audit is not None:
                _audit("swerve-grader.call", key, "raised")
            raise
        finally:
            if verify is not None:
                verify()
        deferred = hasattr(result, "__await__") or hasattr(result, "__aiter__")
        calls[key] = "deferred" if deferred else "returned"
        if _audit is not None:
            _audit("swerve-grader.call", key, calls[key])
        return result

    try:
        _update_wrapper(swerve_witness, method)
    except Exception:
        pass
    calls[key] = "uncalled"
    return swerve_witness


# A code object's flags: a coroutine, an iterable coroutine, an async generator.
_ASYNC_FLAGS = 0x80 | 0x100 | 0x200


def is_async(func):
    """A coroutine or async-generator function (not witnessed: it fails where the framework
    runs it), read from the code's own flags, never through `inspect`; unreadable: witnessed."""
    try:
        for link in _chain(func):
            for _ in range(10):
                # functools.partial: what it calls.
                inner = getattr(link, "func", None) if type(link).__name__ == "partial" else None
                if inner is None:
                    break
                link = inner
            code = getattr(getattr(link, "__func__", link), "__code__", None)
            if code is not None and code.co_flags & _ASYNC_FLAGS:
                return True
        return False
    except Exception:
        return False


# The test's own classes, as the file defines them: a test class or a base the workspace
# defines (the task's test file, a repository's own test framework such as Django's) that gets
# a callable at run time which is not its file's code (a forgiving `assertEqual`, `setUp`,
# `_callTestMethod` put on the test's class) is listed like a framework change.
_class_verdicts = {}


def _read_copies():
    import json
    try:
        listed = json.loads(os.environ.get("SWERVE_GRADER_COPIES") or "[]")
        return tuple(os.path.realpath(p) for p in listed if isinstance(p, str) and p)
    except Exception:
        return ()


# The copies an install made of the work tree's packages in site-packages, which grading carried
# the change into (src/env/grading/installed.rs): code there is the change's, as in the tree,
# never library code. Read as this module loads, before any code under test runs.
_COPIES = _read_copies()


def _inside(path, workdir):
    try:
        real = os.path.realpath(path)
        if real.startswith(os.path.realpath(workdir) + os.sep):
            return True
        return any(real == c or real.startswith(c + os.sep) for c in _COPIES)
    except Exception:
        return False


def _member_functions(value):
    """The functions a class attribute runs (a property's accessors, a static or class method's
    function), or None for an attribute that is not callable code."""
    if isinstance(value, type):
        return None
    if isinstance(value, (staticmethod, classmethod)):
        return [value.__func__]
    if isinstance(value, property):
        return [f for f in (value.fget, value.fset, value.fdel) if f is not None]
    if callable(value):
        return [value]
    # Any other descriptor runs its type's __get__ / __set__ / __delete__ on every lookup (an
    # object with a lenient `__get__` put where `_getAssertEqualityFunc` was): its type's.
    kind = type(value)
    hooks = [getattr(kind, n, None) for n in ("__get__", "__set__", "__delete__")]
    hooks = [h for h in hooks if h is not None]
    if hooks:
        return [getattr(h, "__func__", h) for h in hooks]
    return None


def class_changes(klass, workdir, rewrites=(None,)):
    """The attributes of `klass` and its bases defined inside `workdir` whose callable is not
    code of the file that defines the class, or is wrapped, as "module.Class.attribute",
    sorted."""
    import sys

    changed = []
    for base in getattr(klass, "__mro__", ()):
        module = sys.modules.get(getattr(base, "__module__", None))
        path = getattr(module, "__file__", None)
        if not path or not _inside(path, workdir):
            continue
        qualified = "%s.%s" % (base.__module__, getattr(base, "__qualname__", base.__name__))
        for attr, value in list(vars(base).items()):
            key = (id(base), attr)
            known = _class_verdicts.get(key)
            if known is not None and known[0] is value:
                entry = known[1]
            else:
                entry = None
                functions = _member_functions(value) or ()
                # Wrapped code is listed too, described link by link (the wrapper could be
                # anything; a decorator the file applies shows the same in the reference run).
                for f in functions:
                    chain = _chain(f)
                    if len(chain) > 1 or code_ok(f, path, rewrites) is False:
                        links = " < ".join(_describe(link, workdir) for link in chain)
                        entry = "%s.%s = %s" % (qualified, attr, links)
                        break
                _class_verdicts[key] = (value, entry)
            if entry is not None:
                changed.append(entry)
    return sorted(changed)


def class_line(klass, workdir):
    """The test's class and what it inherits from, as run: each class in its method resolution
    order as "module.Class", with the workspace file its code comes from ("@calc/ops.py").
    Compared with the reference run: a base put in at run time (`__bases__` assigned, an import
    hook that rebuilds the class), or a class whose module name is not where its code is, shows
    as a line the reference run does not have."""
    line = []
    for base in getattr(klass, "__mro__", ()):
        name = "%s.%s" % (getattr(base, "__module__", "?"),
                          getattr(base, "__qualname__", getattr(base, "__name__", "?")))
        files = set()
        for value in list(vars(base).values()):
            for f in _member_functions(value) or ():
                code = getattr(_chain(f)[-1], "__code__", None)
                path = getattr(code, "co_filename", None)
                if path and _inside(path, workdir):
                    files.add(os.path.relpath(os.path.realpath(path), os.path.realpath(workdir)))
        line.append(name + "".join("@" + f for f in sorted(files)))
    return line


# Frames obtained while the tests run, and by whom (Python 3.8 and later: audit hooks). Code
# under test that reaches the running test (its `self`, its locals) does so through a frame:
# `sys._getframe`, a traceback's `tb_frame`, a generator's frame, `sys._current_frames`, or the
# garbage collector's object lists, each an audit event; a trace or profile function set (it is
# handed every frame) counts the same. The requester is the code asking (past `inspect`'s and
# `traceback`'s helpers, which hand frames on); a library file's own code (logging, traceback, the test framework) is
# not listed, anything else is ("calc/ops.py:_find (tb_frame)": a workspace file, or code whose
# file name is not the file it was compiled from), and compared with the reference run like a
# framework change.
_FRAME_EVENTS = ("sys._getframe", "sys._current_frames", "gc.get_referrers", "gc.get_referents",
                 "gc.get_objects", "sys.settrace", "sys.setprofile",
                 "sys.monitoring.register_callback")
_FRAME_ATTRS = ("tb_frame", "gi_frame", "cr_frame", "ag_frame")
_frame_requests = []
_library_codes = {}
# A library function's code or default arguments set while the tests run (an audit event from
# Python 3.8 on for `__code__`, 3.11 for the defaults), as for a frame: by whom.
_FUNCTION_PARTS = ("__code__", "__defaults__", "__kwdefaults__")


def _library_code(code, workdir):
    # True: code compiled from an existing file outside the workspace, as that file reads.
    known = _library_codes.get(code)
    if known is None:
        path = code.co_filename
        known = bool(path) and os.path.isabs(path) and os.path.isfile(path) and \
            not _inside(path, workdir)
        if known:
            codes = _codes(path, None)
            known = codes is not None and _known(code, codes)
        _library_codes[code] = known
    return known


def _library_function(obj):
    code = getattr(obj, "__code__", None)
    if type(obj).__name__ != "function" or code is None:
        return False
    path = code.co_filename
    return bool(path) and os.path.isabs(path) and not _inside(path, _audit_workdir[0])


_audit_workdir = [""]


def install_frame_audit(workdir):
    import sys

    add = getattr(sys, "addaudithook", None)
    if add is None:
        return
    # The standard library's modules that hand frames to their caller (inspect's stack and
    # frame helpers, traceback's walk_stack and stack summaries): the caller asked.
    handing = set()
    for name in ("inspect", "traceback"):
        try:
            handing.add(os.path.realpath(__import__(name).__file__))
        except Exception:
            pass
    getframe = sys._getframe
    busy = []
    _audit_workdir[0] = workdir
    # The process the test command started (a child it forks may exec what it likes).
    test_process = os.getpid()

    def audit(event, args):
        if event == "os.exec" and os.getpid() == test_process:
            # The test process replacing itself (a fresh run of the same command, its tests
            # rewritten or copied first): refused, and noted.
            entry = "the test process replaced by %s (os.exec)" % (args[0] if args else "?")
            if entry not in _frame_requests:
                _frame_requests.append(entry)
            raise PermissionError("swerve's grader: the test process cannot replace itself")
        if event == "object.__getattr__":
            if len(args) < 2 or args[1] not in _FRAME_ATTRS:
                return
        elif event == "object.__setattr__":
            if len(args) < 2 or args[1] not in _FUNCTION_PARTS or not _library_function(args[0]):
                return
        elif event not in _FRAME_EVENTS:
            return
        if busy:
            return
        busy.append(1)
        try:
            frame = getframe(1)
            while frame is not None and os.path.realpath(frame.f_code.co_filename) in handing:
                frame = frame.f_back
            if frame is None or _library_code(frame.f_code, workdir):
                return
            code = frame.f_code
            path = code.co_filename
            try:
                if _inside(path, workdir):
                    path = os.path.relpath(os.path.realpath(path), os.path.realpath(workdir))
            except Exception:
                pass
            if event == "object.__setattr__":
                target = args[0]
                entry = "%s.%s.%s set by %s:%s" % (
                    getattr(target, "__module__", "?"), getattr(target, "__qualname__", "?"),
                    args[1], path, code.co_name)
            else:
                what = args[1] if event == "object.__getattr__" else event
                entry = "frame obtained by %s:%s (%s)" % (path, code.co_name, what)
            if entry not in _frame_requests:
                _frame_requests.append(entry)
        except Exception:
            pass
        finally:
            busy.pop()

    add(audit)


def frame_requests():
    """What install_frame_audit's hook has seen so far, in order."""
    return list(_frame_requests)


def equality_table(test, workdir):
    """unittest's table of equality checks on the test's own instance (`_type_equality_funcs`,
    which `assertEqual` dispatches through): each entry must name a method (unittest's own
    form) or be code of the file that defines the test's class or a class it inherits from, as
    "ID: _type_equality_funcs[float] = calc/ops.py:_floats" otherwise. A lenient comparison put
    there by the code under test makes assertEqual return."""
    try:
        table = vars(test).get("_type_equality_funcs")
    except TypeError:
        return []
    if not isinstance(table, dict):
        return []
    files = set()
    for klass in type(test).__mro__:
        module = _module_named(getattr(klass, "__module__", None))
        path = getattr(module, "__file__", None)
        if path:
            files.add(os.path.realpath(path[:-1] if path.endswith((".pyc", ".pyo")) else path))
    found = []
    for kind, check in list(table.items()):
        if isinstance(check, str):
            continue
        func = _chain(check)[-1]
        code = getattr(func, "__code__", None)
        path = getattr(code, "co_filename", "")
        owned = code is not None and os.path.realpath(path) in files
        if owned and code_ok(func, path) is not False:
            continue
        found.append("%s: _type_equality_funcs[%s] = %s" % (
            test, getattr(kind, "__name__", "?"), _describe(func, workdir)))
    return sorted(found)


def shadowing(obj, allowed=(), label=None):
    """Callables on `obj`'s own `__dict__` that hide an attribute of its class (a lenient
    `assertEqual` put on the running test, a `startTest` put on the result object), as
    "label.name", `allowed` (the grader's own witness) excepted."""
    try:
        own = vars(obj)
    except TypeError:
        return []
    kind = type(obj)
    label = label or "%s.%s (instance)" % (kind.__module__, getattr(kind, "__qualname__", "?"))
    found = []
    for name, value in list(own.items()):
        if any(value is a for a in allowed) or not callable(value) or isinstance(value, type):
            continue
        if any(name in vars(base) for base in kind.__mro__):
            found.append("%s.%s" % (label, name))
    return sorted(found)
