"""Measure how deeply lists are nested."""


def depth(value):
    """Return the nesting depth of ``value``.

    Non-list values have depth 0, a flat list has depth 1, and every extra
    level of nesting adds one. An empty list is still a list: depth 1.
    """
    if not isinstance(value, list):
        return 0
    if not value:
        return 1
    return 1 + max(depth(item) for item in value)


def is_flat(value):
    """True for a list that contains no lists."""
    return depth(value) == 1
