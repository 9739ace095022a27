"""Build per-field validators from a table of numeric limits."""


def build_checks(limits):
    """Return {field: check} for ``limits`` = {field: (low, high)}.

    ``check(value)`` is True when ``low <= value <= high`` for that field.
    """
    checks = {}
    for field, (low, high) in limits.items():
        checks[field] = lambda value: low <= value <= high
    return checks


def validate(record, limits):
    """Return the sorted fields of ``record`` whose values violate ``limits``.

    Fields without a limit, and limits for absent fields, are ignored.
    """
    checks = build_checks(limits)
    return sorted(f for f, check in checks.items() if f in record and not check(record[f]))
