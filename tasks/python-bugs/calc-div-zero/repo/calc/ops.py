"""Small arithmetic helpers used by the reporting code."""


def percent(part, whole, digits=1):
    """Return ``part`` as a percentage of ``whole``, rounded to ``digits``.

    A ``whole`` of zero means there is nothing to compare against, so the
    result is 0.0 rather than an error.
    """
    if part == 0:
        return 0.0
    return round(100.0 * part / whole, digits)


def growth(old, new, digits=1):
    """Return the percentage change from ``old`` to ``new``."""
    return percent(new - old, old, digits)
