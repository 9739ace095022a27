# swerve's grader (src/env/grading.rs): imported first by every Python the tests start, from a
# folder only the grader writes, ahead of the workspace.
#
# 1. The standard library cannot be shadowed: a top-level import of a standard module name is
#    looked up in the standard library's own folders first (a `unittest/` package or an `os.py`
#    in the workspace is never what `import unittest` finds).
# 2. The workspace (the current folder) goes on sys.path after the standard library and
#    site-packages, where safe-path mode (PYTHONSAFEPATH) keeps it off the front.
#
# Written for every Python SWE-bench images carry (3.5 and later): no f-strings, no walrus.
import os
import sys


def _swerve_standard_names(roots):
    names = getattr(sys, "stdlib_module_names", None)
    if names is not None:
        return frozenset(names)
    found = set(sys.builtin_module_names)
    for root in roots:
        try:
            entries = os.listdir(root)
        except OSError:
            continue
        for entry in entries:
            full = os.path.join(root, entry)
            if entry.endswith(".py"):
                found.add(entry[:-3])
            elif entry.endswith(".so"):
                found.add(entry.split(".")[0])
            elif "." not in entry and os.path.isfile(os.path.join(full, "__init__.py")):
                found.add(entry)
    found.discard("site-packages")
    found.discard("dist-packages")
    return frozenset(found)


def _swerve_guard():
    try:
        import sysconfig
        from importlib.machinery import PathFinder
    except ImportError:
        return
    paths = sysconfig.get_paths()
    roots = []
    for key in ("stdlib", "platstdlib"):
        root = paths.get(key)
        if root and root not in roots:
            roots.append(root)
            roots.append(os.path.join(root, "lib-dynload"))
    names = _swerve_standard_names(roots)

    class StandardLibraryFirst(object):
        @classmethod
        def find_spec(cls, name, path=None, target=None):
            if path is not None or name not in names:
                return None
            return PathFinder.find_spec(name, roots)

        @classmethod
        def invalidate_caches(cls):
            pass

    position = len(sys.meta_path)
    for i, finder in enumerate(sys.meta_path):
        if finder is PathFinder:
            position = i
            break
    sys.meta_path.insert(position, StandardLibraryFirst)


_swerve_guard()
_swerve_workdir = os.getcwd()
if _swerve_workdir not in sys.path:
    sys.path.append(_swerve_workdir)


# 3. Where the grader asks for it (SWERVE_GRADER_UNITTEST), every unittest result records each
#    test's outcome as the runner decides it, one JSON line per event appended to the file
#    SWERVE_GRADER_RESULTS names (the same records as the grader's pytest plugin: run start,
#    test, run end). Subclasses (TextTestResult, Django's results) call these through super().
def _swerve_record_unittest(path, ledger):
    import itertools

    try:
        from unittest import result as _result
    except ImportError:
        return
    base = _result.TestResult
    serial = itertools.count()
    pid = os.getpid()
    runs = {}  # id(result): (result, its run id), kept here (never on the result object)

    def write(result, record, test=None):
        held = runs.get(id(result))
        if held is None or held[0] is not result:
            held = runs[id(result)] = (result, "%d-%d" % (pid, next(serial)))
        ledger(held[1], record, test)

    def describe(test):
        try:
            desc = test.shortDescription()
        except Exception:
            desc = None
        return desc if isinstance(desc, str) else None

    # unittest's internal _ShouldStop ends a test quietly as passed; only failfast raises it.
    # Raised by anything else (the code under test), the test is not passed.
    try:
        from unittest import case as _case

        class _ShouldStop(_case._ShouldStop):
            def __init__(self, *args):
                state["stop"] = True
                super(_ShouldStop, self).__init__(*args)

        _case._ShouldStop = _ShouldStop
    except (ImportError, AttributeError):
        pass
    state = {"stop": False}

    def code_flags(test):
        # The test method's code against its class's file, and the wrappers around it
        # (grader_check.py): (code_ok's answer, the wrappers).
        try:
            import swerve_grader_check as check

            name = getattr(test, "_testMethodName", None)
            if not name:
                return (None, [])
            for klass in type(test).__mro__:
                if name in vars(klass):
                    module = sys.modules.get(klass.__module__)
                    method = vars(klass)[name]
                    ok = check.code_ok(method, getattr(module, "__file__", None), (None,), name)
                    return (ok, check.wrappers(method, _swerve_workdir))
        except Exception:
            return (None, [])
        return (None, [])

    # The test method's own call, witnessed (grader_check.py): put on the instance as the run
    # starts, where unittest's run() takes it from; how it ended is written with the outcome.
    # The code check and the wrappers are taken then too, on what the witness calls (a forgiver
    # that puts the test back once it ran leaves no trace on the class by the time of the
    # record), and again at the record.
    calls = {}
    started = {}
    witnesses = {}
    swapped = set()
    # Tests started without a witness (a coroutine, a method that cannot be wrapped): recorded
    # "unwitnessed", which a pass may be only where the reference run shows the same.
    unwitnessed = set()

    def install_witness(test):
        key = id(test)
        started[key] = code_flags(test)
        try:
            import swerve_grader_check as check

            name = getattr(test, "_testMethodName", None)
            if name and name in vars(test):
                # Something put its own callable on this instance before the run.
                started[key] = (False, started[key][1])
            method = getattr(test, name, None) if name else None
            if method is None or not callable(method) or check.is_async(method):
                unwitnessed.add(key)
                return
            def verify():
                # The test's code where the witness calls it (grader_check.witness).
                try:
                    if code_flags(test)[0] is False:
                        swapped.add(key)
                except Exception:
                    swapped.add(key)

            watched = check.witness(method, key, calls, verify)
            witnesses[key] = (watched,)
            vars(test)[name] = watched
            if getattr(test, name, None) is not watched:
                calls.pop(key, None)
                unwitnessed.add(key)
        except Exception:
            calls.pop(key, None)
            unwitnessed.add(key)

    def test_flags(test):
        # (code_ok's answer, the wrappers) from the run's start and from now, combined.
        code, wrappers = code_flags(test)
        start_code, start_wrappers = started.get(id(test), (None, []))
        if start_code is False or id(test) in swapped:
            code = False
        return (code, start_wrappers or wrappers)

    def remove_witness(test):
        windows.pop(id(test), None)
        swapped.discard(id(test))
        unwitnessed.discard(id(test))
        calls.pop(id(test), None)
        started.pop(id(test), None)
        witnesses.pop(id(test), None)
        try:
            name = getattr(test, "_testMethodName", None)
            found = vars(test).get(name) if name else None
            if getattr(found, "__name__", None) == "swerve_witness" or \
                    getattr(getattr(found, "__code__", None), "co_name", None) == "swerve_witness":
                del vars(test)[name]
        except Exception:
            pass

    # The framework as this hook left it (grader_check.py): compared as each test is recorded
    # and when the run ends; each change is written once, before the test record it precedes.
    # Writes to the framework's namespaces are read at each check too (`when` says which).
    watch = {"snapshot": None, "reported": set()}
    versions = {"modules": None}

    def framework_check(result, test=None, when=None):
        try:
            import swerve_grader_check as check

            if watch["snapshot"] is None:
                watch["snapshot"] = check.framework_snapshot(check.UNITTEST_MODULES)
                versions["modules"] = check.UNITTEST_MODULES
                check.framework_writes(versions, None)
                return
            changed = check.framework_changes(watch["snapshot"]) + check.frame_requests()
            changed += __import__("swerve_grader_values").lies()
            changed += check.framework_writes(versions, when or "after the last test")
            if result is not None:
                changed += check.shadowing(result)
            if test is not None:
                changed += check.class_changes(type(test), _swerve_workdir)
                changed += check.shadowing(test, witnesses.get(id(test), ()))
                changed += check.equality_table(test, _swerve_workdir)
            if test is not None and when and when.startswith("while"):
                changed += check.writes_seen(windows.pop(id(test), None), str(test))
            changed = [c for c in changed if c not in watch["reported"]]
        except Exception as error:
            changed = ["(the framework check failed: %s)" % type(error).__name__]
        if changed:
            watch["reported"].update(changed)
            write(result, {"ev": "framework", "changed": changed})

    def outcome(status):
        def wrap(original):
            def method(self, test, *args):
                framework_check(self, test, "while %s ran" % test)
                record = {"ev": "test", "id": str(test), "desc": describe(test), "status": status}
                if status == "passed" and state["stop"] and not getattr(self, "failfast", False):
                    record["status"] = "error"
                code, wrappers = test_flags(test)
                if code is False:
                    record["code"] = False
                if wrappers:
                    record["wrappers"] = wrappers
                call = calls.get(id(test))
                if call is None and id(test) not in started:
                    # Recorded without having started: nothing ran it (a result filed for it).
                    call = "uncalled"
                elif call is None:
                    call = "unwitnessed"
                if call is not None:
                    record["call"] = call
                try:
                    import swerve_grader_check as check

                    record["bases"] = check.class_line(type(test), _swerve_workdir)
                except Exception:
                    pass
                write(self, record, test)
                return original(self, test, *args)

            return method

        return wrap

    original_start_test = base.startTest
    audit = getattr(sys, "audit", None)

    # Writes to the framework and to the test's own module and classes between the test's
    # start and its record (grader_check.py): a patch made and taken back inside the test.
    windows = {}

    def open_window(test):
        try:
            import swerve_grader_check as check

            module = sys.modules.get(type(test).__module__)
            windows[id(test)] = check.writes_start(type(test).__mro__, module, _swerve_workdir)
        except Exception:
            windows.pop(id(test), None)

    def startTest(self, test):
        state["stop"] = False
        # The framework as the test starts, too: what reaches into a test is in place by then.
        # Before the first test: the loading (which tests a run has can change with the change).
        first = not state.get("started")
        state["started"] = True
        framework_check(self, test, "before the first test" if first else "before %s" % test)
        if audit is not None:
            try:
                name = vars(test).get("_testMethodName")
            except TypeError:
                name = None
            audit("swerve-grader.start", test, name)
        install_witness(test)
        open_window(test)
        return original_start_test(self, test)

    base.startTest = startTest
    original_stop_test = base.stopTest

    def stopTest(self, test):
        remove_witness(test)
        return original_stop_test(self, test)

    base.stopTest = stopTest

    for name, status in (
        ("addSuccess", "passed"),
        ("addFailure", "failed"),
        ("addError", "error"),
        ("addSkip", "skipped"),
        ("addExpectedFailure", "xfail"),
        ("addUnexpectedSuccess", "xpass"),
    ):
        original = getattr(base, name, None)
        if original is not None:
            setattr(base, name, outcome(status)(original))

    original_subtest = getattr(base, "addSubTest", None)
    if original_subtest is not None:

        def addSubTest(self, test, subtest, err):
            if err is not None:
                failure = getattr(test, "failureException", AssertionError)
                status = "failed" if issubclass(err[0], failure) else "error"
                write(self, {"ev": "test", "id": str(test), "desc": describe(test),
                             "status": status}, test)
            return original_subtest(self, test, subtest, err)

        base.addSubTest = addSubTest

    original_start = base.startTestRun
    original_stop = base.stopTestRun

    def startTestRun(self):
        start = {"ev": "start"}
        try:
            import swerve_grader_check as check

            if check.descendant():
                start["descendant"] = True
        except Exception:
            pass
        write(self, start)
        return original_start(self)

    def stopTestRun(self):
        framework_check(self)
        write(self, {"ev": "end"})
        return original_stop(self)

    base.startTestRun = startTestRun
    base.stopTestRun = stopTestRun
    try:
        import unittest  # noqa: F401 (every watched module loaded before the snapshot)
    except ImportError:
        return
    try:  # lying values, caught where unittest compares them (grader_values.py)
        import swerve_grader_values

        _swerve_installed.extend(swerve_grader_values.install())
    except Exception:
        pass
    framework_check(None)
    # The framework's code as it loaded (7), announced once the recorders are sealed.
    framework = tuple(m for n, m in sorted(sys.modules.items())
                      if m is not None and (n == "unittest" or n.startswith("unittest.")))

    def announce():
        if audit is not None:
            audit("swerve-grader.framework", "unittest", *framework)

    _swerve_installed.extend(vars(base).values())
    _swerve_installed.append(announce)
    _swerve_announcements.append(announce)


# The ledger's book (ledger.rs), opened before any workspace code runs: the command's first
# process prints sha256(secret) to the log now; `count` keeps each run's line count and running
# SHA-256; `close` prints the secret and, per run, the count and hash, formatted by hand (no
# library code, json's encoder, sees the secret). Everything goes to the log through a descriptor
# taken now, and only while it is still that file (never to the results file).
def _swerve_ledger_book():
    import hashlib

    write, fstat, getpid, sha256 = os.write, os.fstat, os.getpid, hashlib.sha256
    pid, log, secret, runs = getpid(), os.dup(2), os.urandom(16).hex(), {}
    the_log = (fstat(log).st_dev, fstat(log).st_ino)

    def tell(line):
        try:
            same = (fstat(log).st_dev, fstat(log).st_ino) == the_log
        except OSError:
            same = False
        if getpid() == pid and same:
            write(log, line.encode("ascii", "replace"))

    if os.environ.get("SWERVE_GRADER_FIRST_PROCESS") is None:
        key = sha256(secret.encode("ascii")).hexdigest()
        tell("swerve-grader: process %d key %s\n" % (pid, key))

    def count(run, line):
        if getpid() == pid and str(run).split("-")[0] == str(pid):
            entry = runs.setdefault(run, [0, sha256()])
            entry[0] += 1
            entry[1].update(line)

    def close():
        vouched = ", ".join('"%s": [%d, "%s"]' % (run, n, h.hexdigest())
                            for run, (n, h) in sorted(runs.items()))
        tell('swerve-grader: exit {"pid": %d, "runs": {%s}, "secret": "%s"}\n'
             % (pid, vouched, secret))

    return tell, count, close


# 4b. Modules run from files written while the tests run (issue 34, thirty-second red-team pass:
#     code under test wrote a module it then imported the plain way, so the syntax-tree flags,
#     which read only the change, never saw it). A module's code run (`exec`) or a compiled
#     module opened, from a file in the workspace, a copy of its packages (installed.rs) or a
#     folder on the start-up path, whose inode changed after the command's first process
#     started (`st_ctime`, which no unprivileged process sets back), is printed by the audit
#     hook: `swerve-grader: written PID PATH`. Elsewhere (a folder made during the run, put on
#     a package's `__path__`; a zip archive) the same, unless an owned test's own frame asked
#     with no frame of the change's code nearer (pytest's `pytester`, a test's temporary
#     modules); such a path is not named (it is drawn per run). Python 3.8 and later.
def _swerve_written_sources(workdir):
    import json
    t0 = os.environ.get("SWERVE_GRADER_T0")
    try:
        t0 = float(t0)
    except (TypeError, ValueError):
        t0 = __import__("time").time()
        os.environ["SWERVE_GRADER_T0"] = repr(t0)
    try:
        copies = [c for c in json.loads(os.environ.get("SWERVE_GRADER_COPIES") or "[]")
                  if isinstance(c, str)]
    except ValueError:
        copies = []
    real, stat, sep, getframe = os.path.realpath, os.stat, os.sep, sys._getframe
    root = real(workdir)
    change = [root] + [real(c) for c in copies]  # the change's own code lives here
    watched = []
    for folder in change + [p for p in sys.path if isinstance(p, str)]:
        folder = real(folder or workdir)
        if folder != sep and folder not in watched:
            watched.append(folder)
    try:
        owned = set(real(os.path.join(root, p)) for p in
                    json.loads(os.environ.get("SWERVE_GRADER_OWNED") or "[]"))
    except (TypeError, ValueError):
        owned = set()
    seen = set()

    def under(path, folders):
        return any(path == f or path.startswith(f + sep) for f in folders)

    def changed_at(path):  # the file's, or that of the archive holding it (a zip on a path)
        while path and path != sep:
            try:
                return stat(path).st_ctime
            except OSError:
                path = os.path.dirname(path)
        return None

    def by_the_test():
        # An owned test's frame on the stack with no frame of the change's code nearer: a test
        # that writes and imports its own module (pytest's `pytester`), not the code under test.
        frame = getframe(2)
        while frame is not None:
            name = real(frame.f_code.co_filename or "")
            if name in owned:
                return True
            if under(name, change):
                return False
            frame = frame.f_back
        return False

    def written(path):
        if not isinstance(path, str) or not path or path.startswith("<") and path.endswith(">"):
            return None
        path = real(os.path.abspath(path))
        if path in seen:
            return None
        at = changed_at(path)
        if at is None or at < t0:
            return None
        kept = under(path, watched)
        if not kept and by_the_test():
            return None
        seen.add(path)
        if under(path, change):
            return path[len(root) + 1:] if path.startswith(root + sep) else path
        return path if kept else "(a folder made during the run)"

    def check(event, args):
        if event == "exec" and args:
            return written(getattr(args[0], "co_filename", None))
        if event == "open" and args and isinstance(args[0], str) and \
                args[0].endswith((".pyc", ".pyo")):
            return written(os.path.abspath(args[0]))
        return None

    return check


# 5. The ledger and the seal, kept in an audit hook (Python 3.8 and later), which nothing in the
#    process can reach, change or take away: its state lives in closures only the interpreter
#    holds (issue 34: the twenty-second pass swapped a recorder's closure cell for a relay, the
#    twenty-third edited the ledger's counters after rewriting the results file).
#    - The ledger (ledger.rs, `_swerve_ledger_book`): the grader's `record`
#      (`_swerve_open_ledger`) announces each line it writes
#      (`swerve-grader.record`), and the hook counts and hashes it per run only if the
#      announcement comes from that sealed function called by sealed grader code; at exit the
#      grader's `close` asks for the exit line (`swerve-grader.close`).
#    - The seal: what the grader installs is sealed as it loads (`swerve-grader.seal`): every
#      grader function reachable from it, through closure cells, defaults and its module's
#      namespace, with what each cell, `__code__`, default and namespace entry holds; compared at
#      every audited event, the first difference printed at once: `swerve-grader: rewired PID
#      WHAT`, as is an announcement from anything else.
def _swerve_audit_ledger():
    add = getattr(sys, "addaudithook", None)
    if add is None:
        return False
    here = os.path.dirname(os.path.realpath(__file__))
    getframe, pid = sys._getframe, os.getpid()
    tell, count, close = _swerve_ledger_book()
    written = _swerve_written_sources(_swerve_workdir)
    sealed, seen, codes, missing = [], set(), {}, object()
    state = {"told": False, "closed": False, "events": 0}
    # Threads inside the hook: an event the hook itself raises is not checked again, and one
    # thread's event never goes unchecked because another thread is in the hook.
    busy, thread, lied = set(), __import__("_thread").get_ident, set()

    def ours(func):
        code = getattr(func, "__code__", None)
        try:
            return os.path.dirname(os.path.realpath(code.co_filename)) == here
        except Exception:
            return False

    def seal_namespace(namespace, label):
        if id(namespace) in seen:
            return
        seen.add(id(namespace))
        for name, value in list(namespace.items()):
            if callable(value) or isinstance(value, (dict, list, set)):
                sealed.append(("entry", namespace, name, value, "%s.%s" % (label, name)))
                seal(value)

    def seal(obj):
        if isinstance(obj, type(sys)):
            return seal_namespace(vars(obj), obj.__name__)
        if id(obj) in seen or not ours(obj):
            return
        seen.add(id(obj))
        label = getattr(obj, "__qualname__", "?")
        stack = [obj.__code__]
        while stack:  # with the code of the functions it defines (a witness made per test)
            code = stack.pop()
            codes[id(code)] = code
            stack.extend(c for c in code.co_consts if type(c) is type(code))
        for part in ("__code__", "__defaults__", "__kwdefaults__"):
            sealed.append(("attr", obj, part, getattr(obj, part, None), label + "." + part))
        for name, cell in zip(obj.__code__.co_freevars, obj.__closure__ or ()):
            try:
                value = cell.cell_contents
            except ValueError:
                value = missing
            sealed.append(("cell", cell, None, value, "%s's cell %s" % (label, name)))
            seal(value)
        for value in tuple(obj.__defaults__ or ()) + tuple((obj.__kwdefaults__ or {}).values()):
            seal(value)
        seal_namespace(obj.__globals__, obj.__globals__.get("__name__", "?"))

    def changed():
        for kind, holder, key, value, label in sealed:
            if kind == "cell":
                try:
                    now = holder.cell_contents
                except ValueError:
                    now = missing
            elif kind == "entry":
                now = holder.get(key, missing)
            else:
                now = getattr(holder, key, missing)
            if now is not value:
                return label
        return None

    def is_sealed(frame):
        return frame is not None and codes.get(id(frame.f_code)) is frame.f_code

    from swerve_grader_provenance import provenance  # 7: where records come from
    told_provenance, filed = provenance(is_sealed)

    def announced(event, args):
        # Frames: this, the hook, the sealed `record` or `close` that raised the event, and for
        # a record its sealed caller (a recorder's `write`; atexit calls `close` from C).
        asking = getframe(2)
        above = asking.f_back
        name = event.rsplit(".", 1)[1]
        if not (is_sealed(asking) and asking.f_code.co_name == name
                and (name == "close" or is_sealed(above))):
            return "%s from %s" % (event, asking.f_code.co_filename)
        if event.endswith(".record") and len(args) == 6:
            refused = filed(asking, args[2:])
            if refused is not None:
                return refused
            count(args[0], args[1])
        elif event.endswith(".close") and not state["closed"]:
            state["closed"] = True
            close()
        return None

    def hook(event, args):
        me = thread()
        if me in busy:
            return
        busy.add(me)
        try:
            if event == "swerve-grader.seal":
                for obj in args:
                    seal(obj)
                return
            if event == "swerve-grader.lie" and is_sealed(getframe(1)) and len(args) == 1:
                if args[0] not in lied:  # a lying value (grader_values.py), printed once
                    lied.add(args[0])
                    tell("swerve-grader: lie %d %s\n" % (pid, str(args[0])[:300]))
                return
            if event in ("exec", "open"):
                path = written(event, args)
                if path is not None:
                    tell("swerve-grader: written %d %s\n" % (pid, path[:300]))
            if event in ("swerve-grader.framework", "swerve-grader.call",
                         "swerve-grader.start", "swerve-grader.report"):
                asking = getframe(1)
                what = None if is_sealed(asking) else "%s from %s" % (
                    event, asking.f_code.co_filename)
                what = what or told_provenance(event.rsplit(".", 1)[1], asking, args)
                if what is not None and not state["told"]:
                    state["told"] = True
                    tell("swerve-grader: rewired %d %s\n" % (pid, what))
                return
            # Compared at each record and at exit, and at every 16th other event (attribute
            # reads aside: `__code__` is read all the time): a comparison costs about a
            # microsecond per sealed entry, and an import alone raises several events.
            ours_now = event in ("swerve-grader.record", "swerve-grader.close")
            if not ours_now and event != "object.__getattr__":
                state["events"] += 1
            compare = ours_now or (event != "object.__getattr__" and state["events"] % 16 == 0)
            what = changed() if sealed and not state["told"] and compare else None
            if ours_now:
                refused = announced(event, args)
                what = what or refused
            if what is not None and not state["told"]:
                state["told"] = True
                tell("swerve-grader: rewired %d %s\n" % (pid, what))
        except Exception:
            pass
        finally:
            busy.discard(me)

    add(hook)
    return True


# 6. The ledger's writer (ledger.rs): every record line goes through `record`, which encodes it
#    through json's C encoder alone (no Python method of json to patch), announces it to the
#    audit hook's ledger (5), and appends it to the results file. Where Python has no audit
#    hooks (3.5 to 3.7), the ledger's book lives in these closures instead.
def _swerve_refuse(value):
    raise TypeError("not a record value: %r" % (value,))


def _swerve_open_ledger(path, hooked):
    import atexit, json, json.encoder as enc, threading  # noqa: E401
    write, open_, close_, audit, flags = (  # taken before workspace code
        os.write, os.open, os.close, getattr(sys, "audit", None),
        os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    make, esc, dumps = enc.c_make_encoder, enc.c_encode_basestring_ascii, json.dumps
    encode = (lambda v: dumps(v, sort_keys=True)) if make is None or esc is None else (
        lambda v: "".join(make(None, _swerve_refuse, esc, None, ": ", ", ", True, False,
                               True)(v, 0)))
    lock = threading.Lock()
    count, book_close = (None, None) if hooked else _swerve_ledger_book()[1:]

    def record(run, fields, test=None):  # one record (a dict) of `run`, a recorder's run id
        if type(fields) is not dict:
            raise TypeError("not a record: %r" % (type(fields),))
        fields["run"] = run
        line = (encode(fields) + "\n").encode("utf-8", "replace")
        with lock:
            if hooked:  # what the record claims, and for which test (7)
                audit("swerve-grader.record", run, line, fields.get("ev"), fields.get("status"),
                      fields.get("call"), test)
            else:
                count(run, line)
            fd = open_(path, flags, 0o600)
            try:
                write(fd, line)
            finally:
                close_(fd)

    def close():
        if hooked:
            return audit("swerve-grader.close")
        with lock:
            book_close()

    atexit.register(close)
    if hooked:
        audit("swerve-grader.seal", record, close)
    return record


_swerve_results = os.environ.get("SWERVE_GRADER_RESULTS")
_swerve_ledger = None
_swerve_installed = []
_swerve_announcements = []
_swerve_hooked = False
if _swerve_results:
    try:
        _swerve_hooked = _swerve_audit_ledger()
    except Exception:
        pass
    # 4. Frames obtained while the tests run, and by whom (grader_check.py), from the start.
    try:
        import swerve_grader_check

        _swerve_ledger = _swerve_open_ledger(_swerve_results, _swerve_hooked)
        swerve_grader_check._handoff.append(_swerve_ledger)
        swerve_grader_check.mark_process()
        swerve_grader_check.install_frame_audit(_swerve_workdir)
        swerve_grader_check.pin_sources(_swerve_workdir, os.environ.get("SWERVE_GRADER_OWNED"))
    except Exception:
        pass
if _swerve_results and os.environ.get("SWERVE_GRADER_UNITTEST") == "1" and _swerve_ledger:
    # The unittest recorder takes the ledger itself; the pytest plugin's hand-off is not left
    # lying in the module for code under test to take.
    swerve_grader_check.take_ledger()
    _swerve_record_unittest(_swerve_results, _swerve_ledger)
_swerve_installed.append(_swerve_ledger)
del _swerve_ledger
if _swerve_results and hasattr(sys, "audit"):
    # What this file installed (unittest's recorders), the ledger, the checks' module.
    sys.audit("swerve-grader.seal", sys.modules.get(__name__),
              sys.modules.get("swerve_grader_check"), sys.modules.get("swerve_grader_values"),
              *[i for i in _swerve_installed if i is not None])
del _swerve_installed[:]  # held by the seal, no longer by this module
while _swerve_announcements:
    _swerve_announcements.pop()()
