"""The task's packages as an install copied them, and the change carried into those copies
(src/env/grading/installed.rs). Standard library only; Python 3.4 or later.

python -I -c SCRIPT locate WORKDIR   (the image's interpreter, before the change is applied)
    For each top-level package of the work tree (a folder with __init__.py at the root, in src/
    or in lib/; a module at the root), where the interpreter imports it from when the work tree
    is not on its path. Prints one JSON line {"name", "tree", "location"} for each imported from
    a copy in site-packages (an install that copied: `python setup.py install`, `pip install .`)
    that has every Python file of the tree's package, of the same size; an editable install
    imports the tree itself and is left out, as is any name a test framework or the
    interpreter's start-up owns.

python -I -S -c SCRIPT carry WORKDIR   (JSON on stdin: {"copies", "changes"})
    Each changed path of the work tree (git's list after the change, what grading put back
    included) under a copied package is written into that copy as it is in the tree now: a file
    copied, a file the tree no longer has removed, compiled forms of it dropped. Deletions come
    first; nothing is written through a link, nothing outside the copy. Prints "carried N" and a
    line `skipped {"path", "why"}` for each path left as it was.
"""
import json
import os
import sys

# Names the grader's hooks, a test framework, packaging or the interpreter's start-up own: a
# copy of one of them is never written to. Besides these, every module the interpreter has
# loaded once it started and imported the test frameworks, and every pytest plugin's package
# (`framework_names`).
OWNED_NAMES = ("pytest", "_pytest", "py", "pluggy", "unittest", "xdist", "iniconfig", "nose",
               "sitecustomize", "usercustomize", "site", "hypothesis", "mock", "setuptools",
               "pkg_resources", "_distutils_hack", "distutils", "pip", "importlib_metadata",
               "zipp", "packaging", "wheel", "_virtualenv", "virtualenv")


def framework_names():
    """Top-level names the start-up or the test frameworks load by themselves: modules loaded
    once `pytest` (where installed) and `unittest` are imported, pytest plugins' packages."""
    for name in ("unittest", "pytest"):
        try:
            __import__(name)
        except Exception:
            pass
    names = set(n.split(".")[0] for n in list(sys.modules))
    try:
        try:
            from importlib import metadata
        except ImportError:
            import importlib_metadata as metadata
        for dist in metadata.distributions():
            for ep in dist.entry_points:
                if ep.group == "pytest11":
                    names.add(ep.value.split(":")[0].strip().split(".")[0])
    except Exception:
        pass
    return names


def owned_name(name, loaded):
    return (name in OWNED_NAMES or name in loaded or name.startswith("pytest")
            or name.startswith("_pytest") or name.startswith("swerve_"))


def site_dirs():
    found = []
    try:
        import site
        found.extend(site.getsitepackages())
    except Exception:
        pass
    try:
        import sysconfig
        paths = sysconfig.get_paths()
        found.extend([paths.get("purelib"), paths.get("platlib")])
    except Exception:
        pass
    return [os.path.realpath(d) for d in found if d and os.path.isdir(d)]


def inside(path, folder):
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def tree_packages(workdir):
    """(name, tree path relative to workdir) of the work tree's top-level packages and modules."""
    out = []
    for base in ("", "src", "lib"):
        folder = os.path.join(workdir, base)
        try:
            entries = sorted(os.listdir(folder))
        except OSError:
            continue
        for entry in entries:
            path = os.path.join(folder, entry)
            rel = os.path.join(base, entry) if base else entry
            if os.path.islink(path):
                continue
            if os.path.isdir(path) and entry.isidentifier():
                if os.path.isfile(os.path.join(path, "__init__.py")):
                    out.append((entry, rel))
            elif base == "" and entry.endswith(".py") and entry[:-3].isidentifier():
                if entry[:-3] not in ("setup", "conftest"):
                    out.append((entry[:-3], rel))
    return out


def python_files(root):
    """{relative path: size} of the .py files under root (root itself when it is a file)."""
    if os.path.isfile(root):
        return {"": os.path.getsize(root)}
    out = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                out[os.path.relpath(path, root)] = os.path.getsize(path)
    return out


# Written by the install itself (versioneer, setuptools_scm): may differ from the tree's.
GENERATED = ("_version.py", "version.py")


def same_files(tree, copy):
    """Whether copy is a copy of the tree's package: the same Python files, of the same sizes
    (but for a version file an install writes). A package of the same name another distribution
    installed is not, nor a folder several distributions share (a namespace)."""
    mine = python_files(tree)
    theirs = python_files(copy)
    if not mine or set(mine) != set(theirs):
        return False
    return all(theirs[p] == size or os.path.basename(p) in GENERATED for p, size in mine.items())


def locate(workdir):
    import importlib.util
    workdir = os.path.realpath(workdir)
    sites = site_dirs()
    loaded = framework_names()
    seen = set()
    for name, rel in tree_packages(workdir):
        if name in seen or owned_name(name, loaded):
            continue
        seen.add(name)
        try:
            spec = importlib.util.find_spec(name)
        except Exception:
            continue
        if spec is None:
            continue
        is_package = not rel.endswith(".py")
        if is_package:
            places = list(spec.submodule_search_locations or [])
            location = places[0] if len(places) == 1 else None
        else:
            location = spec.origin
        if not location:
            continue
        location = os.path.realpath(location)
        exists = os.path.isdir(location) if is_package else os.path.isfile(location)
        if not exists or inside(location, workdir):
            continue
        if not any(inside(location, s) and location != s for s in sites):
            continue
        if not same_files(os.path.join(workdir, rel), location):
            continue
        print(json.dumps({"name": name, "tree": rel, "location": location}, sort_keys=True))


def safe_parent(dest, root):
    """Makes dest's folders inside root (never through a link); False where it cannot."""
    parent = os.path.dirname(dest)
    rel = os.path.relpath(parent, root)
    path = root
    for part in ([] if rel == "." else rel.split(os.sep)):
        if part in ("", ".", ".."):
            return False
        path = os.path.join(path, part)
        if os.path.islink(path):
            return False
        if os.path.exists(path) and not os.path.isdir(path):
            os.unlink(path)
        if not os.path.exists(path):
            os.mkdir(path)
    return os.path.realpath(parent) == os.path.normpath(os.path.join(os.path.realpath(root), rel))


def drop_compiled(dest):
    folder, name = os.path.split(dest)
    stem = name[:-3] if name.endswith(".py") else None
    if stem is None:
        return
    cache = os.path.join(folder, "__pycache__")
    if os.path.isdir(cache) and not os.path.islink(cache):
        for entry in os.listdir(cache):
            if entry.startswith(stem + ".") and entry.endswith(".pyc"):
                os.unlink(os.path.join(cache, entry))
    for legacy in (dest + "c", dest + "o"):
        if os.path.isfile(legacy) and not os.path.islink(legacy):
            os.unlink(legacy)


def carry_one(workdir, path, copy):
    """Writes the tree's `path` into `copy`; None, or why it was left as it was."""
    tree, root = copy["tree"], copy["location"]
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return "not a plain path"
    if "__pycache__" in parts or path.endswith((".pyc", ".pyo")):
        return "compiled"
    if path == tree:
        dest, root_folder = root, os.path.dirname(root)
    else:
        dest, root_folder = os.path.join(root, *parts[len(tree.split("/")):]), root
    src = os.path.join(workdir, *parts)
    for depth in range(1, len(parts)):
        if os.path.islink(os.path.join(workdir, *parts[:depth])):
            return "under a link in the tree"
    if os.path.islink(src):
        return "a link (a copying install writes what it points to; grading does not follow it)"
    if not os.path.lexists(src):
        if os.path.islink(dest) or os.path.isfile(dest):
            if not safe_parent(dest, root_folder):
                return "its folder in the copy is not a plain folder"
            os.unlink(dest)
            drop_compiled(dest)
        return None
    if not os.path.isfile(src):
        return "not a file"
    if not safe_parent(dest, root_folder):
        return "its folder in the copy is not a plain folder"
    if os.path.islink(dest) or os.path.isdir(dest):
        return "a link or a folder in the copy"
    temporary = dest + ".swerve-carry"
    with open(src, "rb") as source, open(temporary, "wb") as target:
        while True:
            block = source.read(1 << 20)
            if not block:
                break
            target.write(block)
    os.chmod(temporary, os.stat(src).st_mode & 0o755)
    os.replace(temporary, dest)
    drop_compiled(dest)
    return None


def carry(workdir, request):
    changes = sorted(request["changes"], key=lambda c: (c[0] != "D", c[1]))
    carried = 0
    for status, path in changes:
        for copy in request["copies"]:
            tree = copy["tree"]
            if path != tree and not path.startswith(tree + "/"):
                continue
            try:
                why = carry_one(workdir, path, copy)
            except OSError as error:
                why = "%s" % error
            if why is None:
                carried += 1
            else:
                print("skipped " + json.dumps({"path": path, "why": why}, sort_keys=True))
    print("carried %d" % carried)


if __name__ == "__main__":
    if sys.argv[1:2] == ["locate"] and len(sys.argv) == 3:
        locate(sys.argv[2])
    elif sys.argv[1:2] == ["carry"] and len(sys.argv) == 3:
        carry(sys.argv[2], json.loads(sys.stdin.read()))
    else:
        sys.exit("usage: locate WORKDIR | carry WORKDIR")
