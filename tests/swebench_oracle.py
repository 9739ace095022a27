"""SWE-bench's own harness as the oracle for swerve's table of repositories (tests/swebench_oracle.rs).

Prints one JSON line per Python repository and version in the installed harness's
specifications: the eval script the harness generates for a synthetic instance of it (the test
command with its directives, the exports before it, the install command it re-runs), read with
the harness's own functions. Imports only the harness's constants and test-spec modules: its
package `__init__` (docker, datasets, the collection scripts) and the dataset loader are not
needed to write an eval script, and stand-ins answer for them.

With `parse`, reads JSON lines {"repo": R, "log": TEXT} and prints for each the harness's own
parser's reading of the log (`MAP_REPO_TO_PARSER[R]`): {"repo": R, "statuses": {id: status}}.

With `rules`, reads JSON lines {"f2p", "p2p", "statuses"} and prints for each whether the
harness's grading functions resolve it (`get_eval_tests_report`, `get_resolution_status`).

usage: python3 swebench_oracle.py [parse|rules]
"""
import importlib
import json
import os
import sys
import types


def _unavailable(name):
    def call(*args, **kwargs):
        if name == "dotenv.load_dotenv":
            return False
        raise RuntimeError("%s is not installed: the oracle never needs it" % name)

    return call


def stub_harness():
    """The harness package without its __init__ (which imports docker, datasets and the
    collectors), and stand-ins for the dependencies that grading never calls."""
    import importlib.util

    spec = importlib.util.find_spec("swebench")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("swebench is not installed in %s" % sys.executable)
    # The package without its __init__ (which imports docker, datasets and the collectors).
    package = types.ModuleType("swebench")
    package.__path__ = list(spec.submodule_search_locations)
    sys.modules["swebench"] = package
    harness = types.ModuleType("swebench.harness")
    harness.__path__ = [os.path.join(package.__path__[0], "harness")]
    sys.modules["swebench.harness"] = harness
    # Stand-ins for what writing an eval script never calls.
    for name, attrs in (("datasets", ("Dataset", "load_dataset", "load_from_disk")),
                        ("dotenv", ("load_dotenv",)), ("requests", ("get",)),
                        ("tqdm", ("tqdm",))):
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
            continue
        except ImportError:
            pass
        stub = types.ModuleType(name)
        for attr in attrs:
            setattr(stub, attr, _unavailable(name + "." + attr))
        sys.modules[name] = stub


def load_harness():
    stub_harness()
    constants = importlib.import_module("swebench.harness.constants")
    python = importlib.import_module("swebench.harness.test_spec.python")
    return constants, python


# A test patch per repository style: a test module, a data file (never a directive) and, for
# Django, a module under tests/ (a dotted label).
TEST_PATCH = {
    "django/django": ["tests/forms_tests/tests/test_forms.py", "tests/forms_tests/data/x.json",
                      "tests/auth_tests/test_views.py"],
    "sympy/sympy": ["sympy/core/tests/test_basic.py", "sympy/core/tests/data.txt"],
}
DEFAULT_PATCH = ["tests/test_one.py", "tests/data/case.json", "pkg/tests/test_two.py"]


def patch_for(repo):
    out = []
    for path in TEST_PATCH.get(repo, DEFAULT_PATCH):
        out.append("diff --git a/%s b/%s\n--- a/%s\n+++ b/%s\n@@ -1 +1 @@\n-x\n+y\n"
                   % (path, path, path, path))
    return "".join(out)


def main():
    constants, python = load_harness()
    specs = constants.MAP_REPO_VERSION_TO_SPECS
    python_repos = getattr(constants, "MAP_REPO_VERSION_TO_SPECS_PY", specs)
    start = constants.START_TEST_OUTPUT
    end = constants.END_TEST_OUTPUT
    for repo in sorted(python_repos):
        if "/" not in repo or repo.startswith("swe-bench/"):
            continue
        for version in sorted(python_repos[repo]):
            spec = specs[repo][version]
            if "test_cmd" not in spec:
                continue
            test_patch = patch_for(repo)
            instance = {"repo": repo, "version": version, "test_patch": test_patch,
                        "instance_id": repo.replace("/", "__") + "-1", "base_commit": "0" * 40}
            script = python.make_eval_script_list_py(
                instance, spec, "testbed", "/testbed", "0" * 40, test_patch)
            marks = [i for i, line in enumerate(script) if start in line or end in line]
            command = script[marks[0] + 1] if len(marks) == 2 and marks[1] == marks[0] + 2 else None
            print(json.dumps({
                "repo": repo,
                "version": version,
                "test_cmd": spec["test_cmd"],
                "test_patch": test_patch,
                "directives": python.get_test_directives(instance),
                "command": command,
                "eval_commands": spec.get("eval_commands", []),
                "install": spec.get("install"),
                "pre_install": spec.get("pre_install", []),
                "script": script,
            }, sort_keys=True))


def parse():
    load_harness()
    parsers = importlib.import_module("swebench.harness.log_parsers").MAP_REPO_TO_PARSER
    for line in sys.stdin:
        if not line.strip():
            continue
        case = json.loads(line)
        statuses = parsers[case["repo"]](case["log"], None)
        print(json.dumps({"repo": case["repo"], "statuses": statuses}, sort_keys=True))


def rules():
    """JSON lines {"f2p": [ID], "p2p": [ID], "statuses": {ID: STATUS}} in; for each, whether the
    harness's own grading functions call it RESOLVED_FULL: {"resolved": BOOL}."""
    stub_harness()
    constants = importlib.import_module("swebench.harness.constants")
    grading = importlib.import_module("swebench.harness.grading")
    for line in sys.stdin:
        if not line.strip():
            continue
        case = json.loads(line)
        gold = {constants.FAIL_TO_PASS: case["f2p"], constants.PASS_TO_PASS: case["p2p"]}
        report = grading.get_eval_tests_report(case["statuses"], gold)
        status = grading.get_resolution_status(report)
        print(json.dumps({"resolved": status == constants.ResolvedStatus.FULL.value}))


if __name__ == "__main__":
    if sys.argv[1:] == ["parse"]:
        parse()
    elif sys.argv[1:] == ["rules"]:
        rules()
    else:
        main()
