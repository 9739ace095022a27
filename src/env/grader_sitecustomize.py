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
