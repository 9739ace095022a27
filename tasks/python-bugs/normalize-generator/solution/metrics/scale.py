"""Scale series of measurements."""


def normalize(values):
    """Return ``values`` scaled so that they sum to 1.0.

    Accepts any iterable of numbers (lists, tuples, generators). Returns an
    empty list for empty input or when the values sum to zero.
    """
    values = list(values)
    total = sum(values)
    if not total:
        return []
    return [v / total for v in values]


def min_max(values):
    """Return ``values`` (any iterable) rescaled to the 0..1 range."""
    values = list(values)
    if not values:
        return []
    lo, hi = min(values), max(values)
    span = hi - lo
    return [0.0 if span == 0 else (v - lo) / span for v in values]
