# swerve's grader (src/env/grading.rs): values that lie, seen where unittest compares them.
#
# A test passes on `assertEqual(percent(3, 0), 0.0)` when the code under test returns an object
# whose equality lies (an `__eq__` answering True, a Fraction whose `from_float` answers itself,
# a comparison that reads both operands with an infinite tolerance, a library value carrying a
# liar): the assertion is the test's own and runs as written. However the lie is built, a
# truthful value cannot equal both the expected value and another one: after each equality
# assertion that passed, a value of any type but the built-in ones (whoever defines it, outside
# the owned test files: `UserString` holding a liar, `email.charset.Charset("0.0")`) is compared
# with values a truthful one equal to the expected value is not equal to (the expected number
# plus or minus one or a half, plus an offset drawn per process, and as text; the expected text
# with a NUL added; a fresh object), pairs inside lists, tuples and dicts too. One equal to any
# of them is listed ("calc.ops._Blank compared equal to 0.0 and to other values (assertEqual)"),
# and the recorders write it with the framework changes, compared with the reference run (issue
# 34, twenty-ninth and thirtieth red-team passes).
#
# Installed on unittest's TestCase by the unittest recorders (grader_sitecustomize.py) and by
# the pytest plugin (unittest-style tests under pytest) before the framework is snapshot. A
# bare `assert` in a pytest test compiles to an inline comparison: there only the flags see a
# lying value (docs/grading.md).
#
# Written for every Python SWE-bench images carry (3.5 and later).
import json
import os
import random
import sys

__unittest = True  # unittest leaves these frames out of a failure's traceback
_audit = getattr(sys, "audit", None)

_lies = []
# Where each assertion's pairs of compared values come from (first, second, ...).
_ASSERTIONS = ("_baseAssertEqual", "assertAlmostEqual", "assertIn", "assertSequenceEqual",
               "assertDictEqual")
_MAX_ITEMS = 100
_BUILT_IN = (int, float, complex, bool, str, bytes, type(None), list, tuple, dict, set, frozenset)
_offset = random.SystemRandom().uniform(2.0, 1000.0)  # drawn per process: no value to dodge


class _Unequal(object):
    """A fresh object, equal to nothing truthful but itself."""

    __slots__ = ()

    def __repr__(self):
        return "a fresh object"


def lies():
    """The lying values seen so far ("TYPE compared equal to X and to Y (ASSERTION)")."""
    return list(_lies)


def _pairs(name, first, second):
    # The values each assertion compares with `==`, at most _MAX_ITEMS of a container, and
    # the pairs inside lists, tuples and dicts compared whole (`[[x]] == [[0.0]]`).
    found, stack = [], _top_pairs(name, first, second)
    while stack and len(found) < 2 * _MAX_ITEMS:
        a, b = stack.pop()
        found.append((a, b))
        if type(a) is type(b) and type(a) in (list, tuple, dict):
            stack.extend(_top_pairs("assertDictEqual" if type(a) is dict
                                    else "assertSequenceEqual", a, b))
    return found


def _top_pairs(name, first, second):
    if name == "assertIn":
        if isinstance(second, (list, tuple, set, frozenset)):
            return [(first, item) for item in list(second)[:_MAX_ITEMS]]
        return []
    if name == "assertSequenceEqual":
        try:
            return list(zip(list(first)[:_MAX_ITEMS], list(second)[:_MAX_ITEMS]))
        except Exception:
            return []
    if name == "assertDictEqual":
        try:
            return [(first[k], second[k]) for k in list(first)[:_MAX_ITEMS] if k in second]
        except Exception:
            return []
    return [(first, second)]


def _others(truth):
    # Values a truthful object equal to `truth` is not equal to.
    found = [_Unequal()]
    kind = type(truth)
    try:
        if kind in (int, float, complex):
            for step in (1, -1, 0.5, -0.5, _offset):
                if truth + step != truth:
                    found.append(truth + step)
            if kind is not complex:
                found.append(str(truth))
        elif kind in (str, bytes):
            nul = "\0" if kind is str else b"\0"
            found.extend([truth + nul, nul + truth])
        elif kind in (list, tuple):
            found.append(truth + kind([_Unequal()]))
    except Exception:
        pass
    return found


def install(workdir, owned_json):
    """Wraps unittest's equality assertions with the probe; returns the wrappers (to seal)."""
    try:
        from unittest import case
    except ImportError:
        return []
    root = os.path.realpath(workdir)
    try:
        owned = set(os.path.realpath(os.path.join(root, p)) for p in json.loads(owned_json or "[]"))
    except (ValueError, TypeError):
        owned = set()
    verdicts = {}

    def probed(value):  # not a built-in value, nor a type the owned tests define
        kind = type(value)
        if kind not in verdicts:
            module = sys.modules.get(getattr(kind, "__module__", None) or "")
            path = os.path.realpath(getattr(module, "__file__", None) or os.sep)
            verdicts[kind] = kind not in _BUILT_IN and path not in owned
        return verdicts[kind]

    def probe(a, b, where):
        for liar, truth in ((a, b), (b, a)):
            if not probed(liar):
                continue
            for other in _others(truth):
                try:
                    equal = bool(liar == other)
                except Exception:
                    equal = False
                if equal:
                    kind = type(liar)
                    entry = "%s.%s compared equal to %.40r and to other values (%s)" % (
                        kind.__module__, getattr(kind, "__qualname__", kind.__name__), truth,
                        where.lstrip("_"))
                    if entry not in _lies:
                        _lies.append(entry)
                        if _audit is not None:  # printed by the audit hook too (sitecustomize, 5)
                            _audit("swerve-grader.lie", entry)
                    return

    def wrap(name, original):
        def checked(self, first, second, *args, **kwargs):
            result = original(self, first, second, *args, **kwargs)
            for a, b in _pairs(name, first, second):
                probe(a, b, name)
            return result

        checked.__name__ = name
        checked.__doc__ = original.__doc__
        checked.__wrapped__ = original
        return checked

    installed = []
    for name in _ASSERTIONS:
        original = vars(case.TestCase).get(name)
        if original is not None:
            installed.append(wrap(name, original))
            setattr(case.TestCase, name, installed[-1])
    return installed
