# swerve's grader (src/env/grading/results.rs): a pytest plugin, loaded through PYTEST_PLUGINS
# from a folder only the grader writes, that records every test's outcome as the runner itself
# decides it, one JSON line per event appended to the file SWERVE_GRADER_RESULTS names (a path
# drawn fresh per grading). The test log is only a cross-check of what this file says.
#
#   {"run": "PID-N", "ev": "start", "descendant": true (started by another graded process)}
#   {"run": "PID-N", "ev": "test", "id": NODEID, "status": passed|failed|error|skipped|xfail|xpass,
#    "code": false (not its file's code), "wrappers": [...] (around the test function),
#    "call": returned|raised|uncalled|running|deferred|unwitnessed (its own call),
#    "bases": [...] (a class test's class line)}
#   {"run": "PID-N", "ev": "collect-error", "id": NODEID}
#   {"run": "PID-N", "ev": "framework", "changed": [NAME, ...]}   the framework patched mid-run
#   {"run": "PID-N", "ev": "end", "exit": N}
#
# Written for every Python and pytest SWE-bench images carry (3.5 and later, pytest 3 and later).
import os

_swerve_path = os.environ.get("SWERVE_GRADER_RESULTS")
_swerve_run = "%d-%d" % (os.getpid(), id(object()))
_swerve_outcomes = {}


def _swerve_writer():
    # Every line through the ledger (grader_sitecustomize._swerve_open_ledger), taken once as the plugin loads
    # and kept in this closure only.
    import swerve_grader_check

    ledger = swerve_grader_check.take_ledger()

    def write(record):
        if not _swerve_path or ledger is None:
            return
        test = record.get("id") if record.get("ev") == "test" else None
        ledger(_swerve_run, record, test)

    return write


_swerve_write = _swerve_writer()


def pytest_sessionstart(session):
    start = {"ev": "start"}
    try:
        import swerve_grader_check as check

        if check.descendant():
            start["descendant"] = True
    except Exception:
        pass
    _swerve_write(start)


def _swerve_phase_status(report):
    xfail = hasattr(report, "wasxfail")
    if report.when == "call":
        if report.passed:
            return "xpass" if xfail else "passed"
        if report.skipped:
            return "xfail" if xfail else "skipped"
        return "failed"
    if report.passed:
        return None
    if report.skipped:
        return "xfail" if xfail else "skipped"
    return "error"


_swerve_code = {}
_swerve_config = []


_swerve_watch = {"snapshot": None, "plugins": None, "reported": set()}
_swerve_versions = {"modules": None}


def _swerve_plugins(config):
    # The registered plugins by name; pytest names an unnamed plugin by its id, which says
    # nothing across runs, so those go by their type. Conftest modules are the task's own files
    # (the grader puts them back before the run) and register as collection reaches them.
    names = set()
    try:
        for name, plugin in config.pluginmanager.list_name_plugin():
            if name is None or str(name).endswith("conftest.py"):
                continue
            if str(name).isdigit():
                kind = type(plugin)
                name = "%s.%s" % (getattr(kind, "__module__", "?"), getattr(kind, "__name__", "?"))
            names.add(str(name))
    except Exception:
        pass
    return names


def _swerve_framework_check(klass=None, when="after the last test"):
    # The framework as pytest configured it (grader_check.py), compared as each test starts,
    # as it is recorded and when the session ends, with the test's own class and its bases from
    # the workspace, and the writes to the framework since the last check (`when` says which);
    # each change written once.
    if _swerve_watch["snapshot"] is None or not _swerve_config:
        return
    try:
        import swerve_grader_check as check

        changed = list(check.framework_changes(_swerve_watch["snapshot"]))
        changed += check.frame_requests()
        changed += __import__("swerve_grader_values").lies()
        changed += check.framework_writes(_swerve_versions, when)
        if klass is not None:
            changed += check.class_changes(klass, _swerve_workdir, (None, _swerve_rewrite()))
        now = _swerve_plugins(_swerve_config[0])
        before = _swerve_watch["plugins"]
        changed += ["plugin " + n for n in sorted(now.symmetric_difference(before))]
    except Exception as error:
        changed = ["(the framework check failed: %s)" % type(error).__name__]
    changed = [c for c in changed if c not in _swerve_watch["reported"]]
    if changed:
        _swerve_watch["reported"].update(changed)
        _swerve_write({"ev": "framework", "changed": changed})


def pytest_configure(config):
    _swerve_config.append(config)
    try:  # lying values in unittest-style tests (grader_values.py), before the snapshot
        import swerve_grader_values as values

        if not _swerve_config[1:]:
            values.install()
            if _swerve_audit is not None:
                _swerve_audit("swerve-grader.seal", values)
    except Exception:
        pass
    try:
        import swerve_grader_check as check

        _swerve_watch["snapshot"] = check.framework_snapshot(check.PYTEST_MODULES)
        _swerve_watch["plugins"] = _swerve_plugins(config)
        _swerve_versions["modules"] = check.PYTEST_MODULES
        check.framework_writes(_swerve_versions, None)
    except Exception:
        pass


# pytest's own assertion rewriting, as it compiles test modules (grader_check.py compares with
# both the plain and the rewritten compile), taken as this plugin loads: before any conftest or
# test module runs (the module is watched as part of the framework from then on).
try:
    from _pytest.assertion.rewrite import rewrite_asserts as _swerve_rewrite_asserts
except Exception:
    _swerve_rewrite_asserts = None


def _swerve_rewrite():
    rewrite_asserts = _swerve_rewrite_asserts
    if rewrite_asserts is None:
        return None
    config = _swerve_config[0] if _swerve_config else None

    def rewrite(tree, source, path):
        try:
            rewrite_asserts(tree, source, path, config)
        except TypeError:
            rewrite_asserts(tree, path, config)

    return rewrite


_swerve_calls = {}
_swerve_wrappers = {}
_swerve_classes = {}
_swerve_windows = {}
# Tests that reached the grader's call hook without a witness (a coroutine, a doctest), and
# what pytest collected under each id (a test is the item collected under its id).
_swerve_unwitnessed = set()
_swerve_collected = {}
_swerve_bases = {}
_swerve_workdir = os.getcwd()


def _swerve_witness(item, check, verify):
    # The test function's own call, witnessed (grader_check.py): pytest calls `item.obj`
    # (pytest_pyfunc_call), and a unittest TestCase's run takes the method from the instance
    # (pytest 5.4 and later set it there from `item.obj` themselves; earlier ones do not).
    func = getattr(item, "obj", None)
    if func is None or not callable(func) or check.is_async(func):
        _swerve_unwitnessed.add(item.nodeid)
        return
    watched = check.witness(func, item.nodeid, _swerve_calls, verify)
    try:
        item.obj = watched
        testcase = getattr(item, "_testcase", None)
        if testcase is not None:
            setattr(testcase, item.name, watched)
    except Exception:
        _swerve_calls.pop(item.nodeid, None)


def pytest_runtest_call(item):
    try:
        import swerve_grader_check as check

        path = str(getattr(item, "path", None) or getattr(item, "fspath", ""))
        func = getattr(item, "obj", None)
        name = getattr(item, "originalname", None) or getattr(item, "name", None)
        nodeid = item.nodeid
        rewrites = (None, _swerve_rewrite())
        cls = getattr(item, "cls", None)
        if cls is not None:
            _swerve_bases[nodeid] = check.class_line(cls, _swerve_workdir)
        if _swerve_collected and _swerve_collected.get(nodeid) is not item:
            # Not the item pytest collected under this id (one put in its place on the
            # session's list): its outcome is not the test's.
            _swerve_write({"ev": "framework",
                           "changed": ["%s run by an item pytest did not collect under it" % nodeid]})
            return

        def verify():
            # The test's code where the witness calls it (grader_check.witness), as at the start.
            try:
                if func is not None and path and \
                        check.code_ok(func, path, rewrites, name) is False:
                    _swerve_code[nodeid] = False
            except Exception:
                _swerve_code[nodeid] = False

        if func is not None and path:
            _swerve_code[nodeid] = check.code_ok(func, path, rewrites, name)
            _swerve_wrappers[nodeid] = check.wrappers(func, _swerve_workdir)
        _swerve_classes[nodeid] = getattr(item, "cls", None)
        # The framework as the test starts, too: what reaches into a test is in place by then.
        # Before the first test: the collection (which tests a run has can change with the
        # change).
        when = "before %s" % nodeid if _swerve_versions.get("started") else "before the first test"
        _swerve_versions["started"] = True
        _swerve_framework_check(_swerve_classes[nodeid], when)
        _swerve_witness(item, check, verify)
        # Writes to the test's own module and classes from here to the end of the call
        # (grader_check.py): a patch made and taken back inside the test.
        cls = _swerve_classes[nodeid]
        _swerve_windows[nodeid] = check.writes_start(
            getattr(cls, "__mro__", ()), getattr(item, "module", None), _swerve_workdir)
    except Exception:
        pass


# Before pytest's own pytest_runtest_call runs the test (pytest.hookimpl from pytest 2.8 on;
# older ones read the attribute).
try:
    import pytest as _swerve_pytest

    pytest_runtest_call = _swerve_pytest.hookimpl(tryfirst=True)(pytest_runtest_call)
except Exception:
    pytest_runtest_call.tryfirst = True


def _swerve_window_check(nodeid):
    start = _swerve_windows.pop(nodeid, None)
    if start is None:
        return
    try:
        import swerve_grader_check as check

        changed = check.writes_seen(start, nodeid)
    except Exception as error:
        changed = ["(the write check failed: %s)" % type(error).__name__]
    changed = [c for c in changed if c not in _swerve_watch["reported"]]
    if changed:
        _swerve_watch["reported"].update(changed)
        _swerve_write({"ev": "framework", "changed": changed})


def pytest_runtest_logreport(report):
    if _swerve_audit is not None:  # the report, as pluggy handed it over (sitecustomize, 7)
        _swerve_audit("swerve-grader.report", report)
    if report.when == "call":
        _swerve_window_check(report.nodeid)
        _swerve_framework_check(None, "while %s ran" % report.nodeid)
    status = _swerve_phase_status(report)
    current = _swerve_outcomes.get(report.nodeid)
    if status is not None and (current is None or current == "passed" or status == "error"):
        _swerve_outcomes[report.nodeid] = status
    if report.when == "teardown":
        _swerve_window_check(report.nodeid)
        _swerve_framework_check(_swerve_classes.pop(report.nodeid, None),
                                "after %s ran" % report.nodeid)
        final = _swerve_outcomes.pop(report.nodeid, None) or "passed"
        record = {"ev": "test", "id": report.nodeid, "status": final}
        if _swerve_code.pop(report.nodeid, None) is False:
            record["code"] = False
        wrappers = _swerve_wrappers.pop(report.nodeid, None)
        if wrappers:
            record["wrappers"] = wrappers
        call = _swerve_calls.pop(report.nodeid, None)
        if call is None and report.nodeid not in _swerve_unwitnessed:
            # Reported without the grader's call hook having seen it: nothing ran it (a report
            # filed for it), or pytest ran an item it did not collect under this id.
            call = "uncalled"
        elif call is None:
            # Seen, not witnessed (a coroutine, a doctest): a pass only where the reference
            # run shows the same.
            call = "unwitnessed"
        _swerve_unwitnessed.discard(report.nodeid)
        if call is not None:
            record["call"] = call
        bases = _swerve_bases.pop(report.nodeid, None)
        if bases:
            record["bases"] = bases
        _swerve_write(record)


def pytest_collection_finish(session):
    for item in getattr(session, "items", ()):
        _swerve_collected[getattr(item, "nodeid", None)] = item


def pytest_collectreport(report):
    if report.failed:
        _swerve_write({"ev": "collect-error", "id": report.nodeid})


def pytest_sessionfinish(session, exitstatus):
    _swerve_framework_check()
    for nodeid, status in sorted(_swerve_outcomes.items()):
        _swerve_write({"ev": "test", "id": nodeid, "status": status})
    _swerve_outcomes.clear()
    _swerve_write({"ev": "end", "exit": int(exitstatus)})


# The plugin as it loaded, sealed (grader_sitecustomize.py, 5): its hooks, the ledger's writer
# and its state, compared at every audited event from here on.
import sys as _swerve_sys  # noqa: E402

_swerve_audit = getattr(_swerve_sys, "audit", None)


def _swerve_announce():
    # The framework this plugin's records must come from (grader_sitecustomize.py, 7), as
    # loaded before any workspace code runs (conftest files load after this plugin): pytest's
    # own modules, its plugins' from outside the workspace, and pluggy's dispatch.
    def outside(module):
        path = os.path.realpath(getattr(module, "__file__", None) or os.sep)
        return not path.startswith(os.path.realpath(_swerve_workdir) + os.sep)

    found = {"pytest": [], "dispatch": []}
    for name, module in sorted(_swerve_sys.modules.items()):
        top = name.split(".")[0]
        if module is None:
            continue
        if top == "pluggy" or ".pluggy" in name or ".vendored_packages" in name:
            found["dispatch"].append(module)
        elif top in ("pytest", "_pytest") or \
                ((top.startswith("pytest") or top == "xdist") and outside(module)):
            found["pytest"].append(module)
    for kind in ("pytest", "dispatch"):
        _swerve_audit("swerve-grader.framework", kind, *found[kind])


if _swerve_audit is not None:
    _swerve_audit("swerve-grader.seal", _swerve_sys.modules.get(__name__))
    _swerve_announce()
