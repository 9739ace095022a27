# swerve's grader (src/env/grading.rs): values that lie, seen where unittest compares them.
#
# A test passes on `assertEqual(percent(3, 0), 0.0)` when the code under test returns an object
# whose equality lies (an `__eq__` answering True, a Fraction whose `from_float` answers itself,
# a comparison that reads both operands with a tolerance, a library value carrying a liar): the
# assertion is the test's own and runs as written. However the lie is built, a truthful value
# cannot equal both the expected value and another one. So around each equality assertion, a
# value of any type but the built-in ones (whoever defines it: a library class can carry the
# lie, `UserString` holding a liar, `email.charset.Charset("0.0")`) is compared with values a
# truthful one equal to the expected value is not equal to (the expected number plus or minus
# one, a half, an offset drawn per process and a tiny step drawn each time, and the number as
# text; the expected text with a NUL added; fresh objects), in an order and number drawn each
# time: before the assertion (a liar that settles on the first value it sees settles on a probe
# value) and after it, on the pairs that compared equal, inside lists, tuples and dicts too. One
# equal to any of them is listed ("calc.ops._Blank compared equal to a builtins.float and to
# other values (assertEqual)": types only, the same text in every run), and the recorders write
# it with the framework changes, compared with the reference run (a test's own permissive helper
# shows there too) (issue 34, passes twenty-nine to thirty-one).
#
# Installed on unittest's TestCase by the unittest recorders (grader_sitecustomize.py) and by
# the pytest plugin (unittest-style tests under pytest) before the framework is snapshot. A
# bare `assert` in a pytest test compiles to an inline comparison: there only the flags see a
# lying value (docs/grading.md).
#
# Written for every Python SWE-bench images carry (3.5 and later).
import itertools
import random
import sys

__unittest = True  # unittest leaves these frames out of a failure's traceback
_audit = getattr(sys, "audit", None)

_lies = []
# Where each assertion's pairs of compared values come from (first, second, ...).
_ASSERTIONS = ("_baseAssertEqual", "assertAlmostEqual", "assertIn", "assertSequenceEqual",
               "assertDictEqual", "assertSetEqual")
_MAX_ITEMS = 100
_BUILT_IN = (int, float, complex, bool, str, bytes, type(None), list, tuple, dict, set, frozenset)
_draw = random.SystemRandom()
_offset = _draw.uniform(2.0, 1000.0)  # drawn per process: no value to dodge


class _Unequal(object):
    """A fresh object, equal to nothing truthful but itself."""

    __slots__ = ()

    def __repr__(self):
        return "a fresh object"


def lies():
    """The lying values seen so far ("TYPE compared equal to a TYPE and to other values
    (ASSERTION)")."""
    return list(_lies)


def _pairs(name, first, second):
    # The values each assertion compares with `==`, at most _MAX_ITEMS of a container, and the
    # pairs inside containers compared whole (`[[x]] == [[0.0]]`), a subclass of one against the
    # built-in one too (the thirty-fourth pass hid liars in a `list` subclass), a dict's keys
    # with its values, the fields of two objects of one class. Each pair comes with the other
    # items of each side's container: a value equal to its own and to a sibling lies too.
    found, stack = [], _top_pairs(name, first, second)
    while stack and len(found) < 2 * _MAX_ITEMS:
        a, b, mine, theirs = stack.pop()
        found.append((a, b, mine, theirs))
        kind = _kind(a)
        if kind is not None and kind == _kind(b):
            stack.extend(_container_pairs(kind, a, b))
        elif type(a) is type(b) and not _built_in(a):
            stack.extend((x, y, (), ()) for x, y in _fields(a, b))
    return found


def _kind(value):  # the built-in container in a value's class line, by identity
    for k in type(value).__mro__:
        if k is list or k is tuple:
            return "sequence"
        if k is dict:
            return "mapping"
        if k is set or k is frozenset:
            return "set"
    return None


def _equal(a, b):
    try:
        return bool(a == b)
    except Exception:
        return False


def _container_pairs(kind, first, second):
    try:
        mine, theirs = _head(first), _head(second)
        if kind == "sequence":
            return [(x, y, mine[:i] + mine[i + 1:], theirs[:i] + theirs[i + 1:])
                    for i, (x, y) in enumerate(zip(mine, theirs))]
        out = []  # a mapping's keys, or a set's members, matched by equality; then the values
        for i, key in enumerate(mine):
            for j, other in enumerate(theirs):
                if _equal(key, other):
                    out.append((key, other, mine[:i] + mine[i + 1:], theirs[:j] + theirs[j + 1:]))
                    if kind == "mapping":
                        out.append((first[key], second[other], (), ()))
                    break
        return out
    except Exception:
        return []


def _fields(a, b):
    # Two objects of one class (a dataclass, a record) compare their fields: the fields' pairs
    # are probed too (the thirty-third pass hid liars inside a dataclass).
    try:
        mine, theirs = object.__getattribute__(a, "__dict__"), object.__getattribute__(
            b, "__dict__")
    except Exception:
        return []
    if type(mine) is not dict or type(theirs) is not dict:
        return []
    return [(mine[k], theirs[k]) for k in _head(mine) if type(k) is str and k in theirs]


def _top_pairs(name, first, second):
    if name == "assertIn":
        if _kind(second) in ("sequence", "set"):
            items = _head(second)
            return [(first, item, (), items[:i] + items[i + 1:]) for i, item in enumerate(items)]
        return []
    if name == "assertSequenceEqual":
        return _container_pairs("sequence", first, second)
    if name == "assertDictEqual":
        return _container_pairs("mapping", first, second)
    if name == "assertSetEqual":
        return _container_pairs("set", first, second)
    return [(first, second, (), ())]


def _head(items):  # the first _MAX_ITEMS, without copying the rest
    return list(itertools.islice(iter(items), _MAX_ITEMS))


def _others(truth):
    # Values a truthful object equal to `truth` is not equal to, in an order drawn each time and
    # with a drawn number of fresh objects among them (a liar that counts its comparisons, or
    # answers only the first, cannot tell which is the assertion's own).
    found = [_Unequal() for _ in range(1 + _draw.randrange(3))]
    kind = type(truth)
    try:
        if any(kind is k for k in (int, float, complex)):
            tiny = _draw.uniform(1e-9, 1e-6)  # a tolerance is a lie too
            for step in (1, -1, 0.5, -0.5, _offset, tiny, -tiny):
                if truth + step != truth:
                    found.append(truth + step)
            if kind is not complex:
                found.append(str(truth))
        elif kind is str or kind is bytes:
            nul = "\0" if kind is str else b"\0"
            found.extend([truth + nul, nul + truth])
            if truth:  # a letter more, one fewer, one changed (a tolerance is a lie too)
                at = _draw.randrange(len(truth))
                letter = "q" if kind is str else b"q"
                found.extend([truth[:at] + letter + truth[at:], truth[:at] + truth[at + 1:],
                              truth[:at] + (letter if truth[at:at + 1] != letter else nul)
                              + truth[at + 1:]])
        elif _decimal_kind(kind):
            tiny = _draw.uniform(1e-9, 1e-6)
            for step in ("1", "-1", "0.5", "-0.5", repr(_offset), repr(tiny), repr(-tiny)):
                if truth + kind(step) != truth:
                    found.append(truth + kind(step))
        elif kind is list or kind is tuple:
            found.append(truth + kind([_Unequal()]))
    except Exception:
        pass
    _draw.shuffle(found)
    return found


def _decimal_kind(kind):
    # Decimal and Fraction (exactly: a subclass's arithmetic is its own), built from text.
    for name, attr in (("decimal", "Decimal"), ("fractions", "Fraction")):
        if kind is getattr(sys.modules.get(name), attr, None):
            return True
    return False


def _built_in(value):
    # By identity: `type(x) in (...)` compares with `==`, which a metaclass answers (the
    # thirty-second red-team pass: a class claiming to be `float`).
    kind = type(value)
    return any(kind is built_in for built_in in _BUILT_IN)


def _test_double(value):
    # A mock records every comparison made with it (`call.__eq__(...)` in `mock_calls`): a
    # probe would change what the test later reads. Left alone only while its equality is a
    # mock's own (identity, an unconfigured magic method): one told to answer (`m.__eq__.
    # return_value = True`, a function put in its place) is probed like any value.
    for name in ("unittest.mock", "mock"):
        module = sys.modules.get(name)
        kind = getattr(module, "NonCallableMock", None)
        if isinstance(kind, type) and any(k is kind for k in type(value).__mro__):
            return _mock_equality(value, module, kind)
    return False


def _mock_equality(value, module, kind):
    defaults = []
    for maker in (getattr(module, "_get_eq", None), getattr(module, "_get_ne", None)):
        code = getattr(maker, "__code__", None)
        defaults.extend(c for c in getattr(code, "co_consts", ()) if type(c) is type(code))
    proxy, default = getattr(module, "MagicProxy", None), getattr(module, "DEFAULT", None)
    for name in ("__eq__", "__ne__"):
        found = next((vars(k)[name] for k in type(value).__mro__ if name in vars(k)), None)
        if found is None or found is vars(object)[name] or type(found) is proxy:
            continue
        if not any(k is kind for k in type(found).__mro__):
            return False  # a function of someone's
        effect = vars(found).get("_mock_side_effect")
        if vars(found).get("_mock_return_value", default) is not default or (
                effect is not None and not any(getattr(effect, "__code__", None) is c
                                               for c in defaults)):
            return False
    return True


def _own_number(value):
    # A built-in number's own value, read past whatever a subclass says (`__float__` answered
    # 0.0 for a float holding 300.0: the thirty-third pass).
    mro = type(value).__mro__
    if any(k is float for k in mro):
        return float.__float__(value)
    if any(k is int for k in mro):
        return float(int.__index__(value))
    return float(value)


def _numbers_disagree(liar, truth):
    # A value equal to a number whose own number is another (`float(x)` 300.0, `x == 0.0`).
    if not any(type(truth) is k for k in (int, float)):
        return False
    try:
        return _own_number(liar) != float(truth)
    except Exception:
        return False


def _equal_to_another(liar, truth, siblings=()):
    if _numbers_disagree(liar, truth) and _equal(liar, truth):
        return True
    # The truth's siblings that are not equal to it: a truthful value equal to the truth is not
    # equal to them either (a liar equal to every member of its batch).
    others = _others(truth) + [s for s in siblings if not _equal(truth, s)]
    return any(_equal(liar, other) for other in others)


def _entry(liar, truth, where):  # the same text in every run: types only, no value's repr
    def name(kind):
        return "%s.%s" % (kind.__module__, getattr(kind, "__qualname__", kind.__name__))

    return "%s compared equal to a %s and to other values (%s)" % (
        name(type(liar)), name(type(truth)), where.lstrip("_"))


def install():
    """Wraps unittest's equality assertions with the probe; returns the wrappers (to seal).
    Every value but the built-in ones is probed, a test's own helper types too (the reference
    run shows those the same)."""
    try:
        from unittest import case
    except ImportError:
        return []

    def suspects(a, b, mine, theirs, where):  # a non-built-in side equal to another value too
        found = []
        for liar, truth, siblings in ((a, b, theirs), (b, a, mine)):
            if not _built_in(liar) and not _test_double(liar) and \
                    _equal_to_another(liar, truth, siblings):
                found.append(_entry(liar, truth, where))
        return found

    def note(entries):
        for entry in entries:
            if entry not in _lies:
                _lies.append(entry)
                if _audit is not None:  # printed by the audit hook too (sitecustomize, 5)
                    _audit("swerve-grader.lie", entry)

    def wrap(name, original):
        def checked(self, first, second, *args, **kwargs):
            # Each pair probed before the assertion (a liar that settles on the first value it
            # sees settles on a probe value) and after it; kept for the pairs that compared
            # equal (`assertIn` needs one, `assertAlmostEqual` may pass on a distance).
            pairs = _pairs(name, first, second)
            before = [suspects(a, b, mine, theirs, name) for a, b, mine, theirs in pairs]
            result = original(self, first, second, *args, **kwargs)
            entries = []
            for (a, b, mine, theirs), early in zip(pairs, before):
                built_in = _built_in(a) and _built_in(b)
                if built_in or _test_double(a) or _test_double(b):
                    continue
                if _equal(a, b):
                    entries.extend(early + suspects(a, b, mine, theirs, name))
            note(entries)
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
