#!/usr/bin/env python3
"""Check the tasks of tasks.jsonl: the tests fail on the buggy repo and pass with the solution.

Usage: python3 check.py [-v] [TASK_ID ...]

For each task: the fields and folders are there, the repo holds no test files
and no module that shadows the standard library, the solution edits files of
the repo (new files are allowed and reported) with a small diff, the test
command exits non-zero on repo + tests and zero on repo + solution + tests.
Prints one line per task and a summary; exits 1 on any problem.
"""

import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
TASKS_FILE = HERE / "tasks.jsonl"
FIELDS = {
    "id": str,
    "repo": str,
    "tests": str,
    "problem_statement": str,
    "test_command": str,
    "solution": str,
    "timeout_s": int,
}
ID_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
MAX_CHANGED_LINES = 12  # lines removed + added over all solution files


def files_under(root):
    """Relative paths of the files under ``root``, caches left out."""
    return sorted(
        p.relative_to(root)
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    )


def overlay(src, dst):
    for rel in files_under(src):
        target = dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / rel, target)


def run_tests(task, layers):
    """Copy ``layers`` in order into a fresh folder and run the test command there."""
    with tempfile.TemporaryDirectory(prefix="pybug-") as tmp:
        for layer in layers:
            overlay(layer, Path(tmp))
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        try:
            proc = subprocess.run(
                task["test_command"], shell=True, cwd=tmp, env=env,
                capture_output=True, text=True, timeout=task["timeout_s"],
            )
        except subprocess.TimeoutExpired:
            return None, "timed out"
        return proc.returncode, proc.stdout + proc.stderr


def changed_lines(old_text, new_text):
    diff = difflib.unified_diff(old_text.splitlines(), new_text.splitlines(), lineterm="", n=0)
    return sum(1 for line in diff if line[:1] in "+-" and line[:3] not in ("+++", "---"))


def check_static(task, repo, tests, solution):
    """Return (problems, notes) found without running anything."""
    problems, notes = [], []
    for name, path in (("repo", repo), ("tests", tests), ("solution", solution)):
        if not path.is_dir():
            problems.append(f"{name} folder {path} is missing")
    if problems:
        return problems, notes
    repo_files = files_under(repo)
    test_files = files_under(tests)
    sol_files = files_under(solution)
    if not any(p.name.startswith("test") and p.suffix == ".py" for p in test_files):
        problems.append("tests folder has no test_*.py file")
    for rel in repo_files:
        if rel.name.startswith("test_") or rel.parts[0] == "tests" or rel in test_files:
            problems.append(f"repo contains test file {rel}")
    for rel in repo_files:
        top = rel.parts[0].removesuffix(".py")
        if rel.suffix == ".py" or len(rel.parts) > 1:
            if top in sys.stdlib_module_names:
                problems.append(f"repo module {top!r} shadows the standard library")
    if not sol_files:
        problems.append("solution folder is empty")
    total = 0
    for rel in sol_files:
        if (repo / rel).is_file():
            total += changed_lines((repo / rel).read_text(), (solution / rel).read_text())
        else:
            notes.append(f"new file {rel}")
            total += len((solution / rel).read_text().splitlines())
    if sol_files and total == 0:
        problems.append("solution is identical to repo")
    if total > MAX_CHANGED_LINES:
        problems.append(f"solution changes {total} lines (> {MAX_CHANGED_LINES})")
    notes.append(f"{total} lines changed")
    return problems, notes


def check_task(task, verbose):
    repo, tests, solution = (HERE / task[k] for k in ("repo", "tests", "solution"))
    problems, notes = check_static(task, repo, tests, solution)
    if problems:
        return problems, notes
    rc, out = run_tests(task, [repo, tests])
    if rc is None:
        problems.append("buggy run timed out")
    elif rc == 0:
        problems.append("tests pass on the buggy repo")
    elif "unittest.loader._FailedTest" in out or "ModuleNotFoundError" in out:
        problems.append("buggy run failed to import the tests")
    if verbose and problems:
        print(out)
    rc, out = run_tests(task, [repo, solution, tests])
    if rc != 0:
        problems.append("fixed run " + ("timed out" if rc is None else f"exited {rc}"))
        if verbose:
            print(out)
    return problems, notes


def load_tasks():
    tasks, problems = [], []
    for n, line in enumerate(TASKS_FILE.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            task = json.loads(line)
        except ValueError as exc:
            problems.append(f"line {n}: invalid JSON: {exc}")
            continue
        bad = [k for k, t in FIELDS.items() if not isinstance(task.get(k), t) or task.get(k) == ""]
        extra = sorted(set(task) - set(FIELDS))
        if bad or extra:
            problems.append(f"line {n}: bad fields {bad}, unknown fields {extra}")
            continue
        if not ID_RE.match(task["id"]):
            problems.append(f"line {n}: id {task['id']!r} is not kebab-case")
        tasks.append(task)
    ids = [t["id"] for t in tasks]
    for dup in sorted({i for i in ids if ids.count(i) > 1}):
        problems.append(f"duplicate id {dup}")
    return tasks, problems


def main(argv):
    verbose = "-v" in argv
    wanted = [a for a in argv if a != "-v"]
    tasks, problems = load_tasks()
    for p in problems:
        print(f"FAIL {p}")
    if wanted:
        unknown = set(wanted) - {t["id"] for t in tasks}
        if unknown:
            problems.append(f"unknown ids {sorted(unknown)}")
            print(f"FAIL unknown ids {sorted(unknown)}")
        tasks = [t for t in tasks if t["id"] in wanted]
    failed = 0
    for task in tasks:
        task_problems, notes = check_task(task, verbose)
        status = "FAIL" if task_problems else "ok  "
        failed += bool(task_problems)
        print(f"{status} {task['id']:28} " + "; ".join(task_problems + notes))
    print(f"{len(tasks) - failed}/{len(tasks)} tasks ok" + (f", {len(problems)} file problems" if problems else ""))
    return 1 if failed or problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
