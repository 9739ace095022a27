# swerve's grader (src/env/grading.rs): where a record that could help a test comes from, for
# the audit hook of grader_sitecustomize.py (5), which takes the two checks below as it is
# installed (before any workspace code runs) and is the only holder of their state.
#
# Written for every Python SWE-bench images carry that has audit hooks (3.8 and later).
#
# Issue 34, twenty-sixth pass: code under test took the unittest recorders' sealed `write`
# through `inspect.getclosurevars`, filed a pass for the running test with a witness it wrote
# itself, then renamed the test so that the framework's own record of its error went elsewhere.
# So the hook checks every record that could help a test on facts it keeps itself or reads from
# the framework's own frames:
# - A run's start or end, or a test passed, skipped or expected to fail, is filed by the
#   framework: above the grader's sealed frames, past unittest's overrides of the same method
#   (TextTestResult.addSuccess; a project's result class calling super) or pluggy's dispatch,
#   the next frame runs the framework's own code (its code object and globals as the recorders
#   found them as they loaded: `swerve-grader.framework`). A failure may come from anywhere: it
#   can only cost.
# - unittest: a pass, expected failure or unexpected success is for the test whose run files it
#   (the framework frame's `self`), under the name it started with (`swerve-grader.start`), and
#   the call it records is how the grader's witness announced every call of that test ended
#   (`swerve-grader.call`: a second call does not undo a raise).
# - pytest: the status a pass records is the one the framework's reports, as pluggy handed them
#   to the plugin (`swerve-grader.report`), add up to, and its call the witness's.
def provenance(is_sealed):
    # Everything the checks use, taken now: builtins and tables that code under test could
    # replace or edit later are not looked up again.
    getattr_, vars_, type_, id_, str_, dict_, hasattr_ = getattr, vars, type, id, str, dict, hasattr
    len_, max_ = len, max
    code_type = type_(provenance.__code__)
    entries = {"start": "startTestRun", "end": "stopTestRun", "passed": "addSuccess",
               "skipped": "addSkip", "xfail": "addExpectedFailure",
               "xpass": "addUnexpectedSuccess"}
    ends = ("returned", "deferred", "raised")  # how a call ended, the worst last
    tables, calls, names, outcomes = {}, {}, {}, {}

    def take(kind, modules):  # the framework's code as it loaded, once per kind
        if kind in tables:
            return None
        table = tables[kind] = {}
        for module in modules:
            namespace = getattr_(module, "__dict__", None)
            for value in list(namespace.values()) if type_(namespace) is dict_ else ():
                members = list(vars_(value).values()) if isinstance(value, type_) else [value]
                for member in members:
                    for part in (member, getattr_(member, "__func__", None),
                                 getattr_(member, "fget", None)):
                        code = getattr_(part, "__code__", None)
                        if type_(code) is code_type and \
                                getattr_(part, "__globals__", None) is namespace:
                            stack = [code]
                            while stack:
                                code = stack.pop()
                                table[id_(code)] = (code, namespace)
                                stack.extend(c for c in code.co_consts if type_(c) is code_type)
        return None

    def framework(kind, frame):
        entry = tables.get(kind, {}).get(id_(frame.f_code)) if frame is not None else None
        return entry is not None and entry[0] is frame.f_code and frame.f_globals is entry[1]

    def named(frame):
        return "%s:%s" % (frame.f_code.co_filename, frame.f_code.co_name) if frame else "?"

    def started(asking, test, name):  # unittest's startTest, from the test's own run
        frame = asking.f_back
        while frame is not None and frame.f_code.co_name == "startTest":
            frame = frame.f_back
        if not framework("unittest", frame) or frame.f_locals.get("self") is not test:
            return "a test started by %s" % named(frame)
        calls.pop(id_(test), None)
        names[id_(test)] = (test, name)
        return None

    def called(key, now):  # the witness: every call of a test, nested or again, counted
        depth, worst = calls.get(key, (0, None))
        if now == "running":
            calls[key] = (depth + 1, worst)
        else:
            calls[key] = (max_(depth - 1, 0), [e for e in ends if e in (worst, now)][-1])

    def told(what, asking, args):
        if what == "framework" and args and type_(args[0]) is str_:
            return take(args[0], args[1:])
        if what == "start" and len_(args) == 2:  # startTest: (test, its method's name)
            return started(asking, args[0], args[1])
        if what == "report" and len_(args) == 1:  # pytest_runtest_logreport: (report,)
            return reported(asking, args[0])
        if what == "call" and len_(args) == 2 and args[1] in ("running",) + ends:
            return called(args[0], args[1])
        return "swerve-grader.%s from %s" % (what, named(asking))

    def witnessed(key, claimed):
        depth, worst = calls.pop(key, (0, None))
        now = "running" if depth else worst
        if now == claimed or (now is None and claimed not in ends):
            return None
        if claimed is None and now == "returned":  # pytest: a test its teardown never reported
            return None
        return "a call recorded %s, witnessed %s" % (claimed, now or "nowhere")

    def reported(asking, report):
        # A pytest report, as the framework handed it to the plugin through pluggy: each
        # phase's status kept per test as the plugin keeps it (an error stands; a pass gives
        # way), read from the report object itself.
        frame, handed = asking.f_back, None
        while framework("dispatch", frame):
            local = frame.f_locals
            for name in ("caller_kwargs", "kwargs"):
                if type_(local.get(name)) is dict_ and "report" in local[name]:
                    handed = local[name]["report"]
            frame = frame.f_back
        if handed is not report or not framework("pytest", frame):
            return "a report handed over by %s" % named(frame)
        nodeid, when = getattr_(report, "nodeid", None), getattr_(report, "when", None)
        xfail = hasattr_(report, "wasxfail")
        if getattr_(report, "passed", False):
            status = ("xpass" if xfail else "passed") if when == "call" else None
        elif getattr_(report, "skipped", False):
            status = "xfail" if xfail else "skipped"
        else:
            status = "failed" if when == "call" else "error"
        current = outcomes.get(nodeid)
        if status is not None and (current is None or current == "passed" or status == "error"):
            outcomes[nodeid] = status
        return None

    def unittest_pass(frame, test, call):
        local = frame.f_locals
        if not (local.get("self") is test or local.get("test_case") is test):
            return "a pass filed by the run of another test"
        held = names.pop(id_(test), None)
        try:
            name = vars_(test).get("_testMethodName")
        except TypeError:
            name = None
        if held is None or held[0] is not test or held[1] != name:
            return "a test renamed or never started (%s)" % name
        return witnessed(id_(test), call)

    def pytest_pass(test, status, call):
        if type_(test) is not str_:
            return "a pass for no test"
        # As the framework reported it (an outcome a phase's report left, else a pass).
        reported_status = outcomes.pop(test, None) or "passed"
        if reported_status != status:
            return "%s recorded %s, reported %s" % (test, status, reported_status)
        return witnessed(test, call)

    def filed(asking, claims):
        # claims: the record's ev, status and call, and the test it is for (unittest's object,
        # pytest's node id), as `record` was handed them.
        ev, status, call, test = claims
        for claim in (ev, status, call):
            if claim is not None and type_(claim) is not str_:
                return "a record whose fields are not strings"
        if ev not in ("start", "end", "test") or status in ("failed", "error"):
            if ev == "test" and type_(test) is str_:  # a failure: nothing of it kept
                calls.pop(test, None)
                outcomes.pop(test, None)
            elif ev == "test" and test is not None:
                calls.pop(id_(test), None)
                names.pop(id_(test), None)
            return None
        frame, entry = asking.f_back, None
        while is_sealed(frame):
            entry, frame = frame, frame.f_back
        unittest = entry is not None and entry.f_code.co_filename == asking.f_code.co_filename
        if unittest:  # past the overrides of the same method
            name = entries.get(status if ev == "test" else ev)
            while frame is not None and frame.f_code.co_name == name:
                frame = frame.f_back
        else:  # past pluggy's dispatch
            while framework("dispatch", frame):
                frame = frame.f_back
        if not framework("unittest" if unittest else "pytest", frame):
            return "a record (%s %s) filed by %s" % (ev, status or "", named(frame))
        if ev != "test" or status == "skipped":
            return None
        return unittest_pass(frame, test, call) if unittest else pytest_pass(test, status, call)

    return told, filed
