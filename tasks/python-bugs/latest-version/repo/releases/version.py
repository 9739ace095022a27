"""Pick among release versions such as '1.10.2'."""


def parse_version(text):
    """Return ``'1.10.2'`` as the tuple ``(1, 10, 2)``; a leading 'v' is allowed."""
    return tuple(int(part) for part in text.strip().lstrip("v").split("."))


def latest(versions):
    """Return the newest of ``versions`` (unchanged), or None when empty."""
    if not versions:
        return None
    return max(versions)


def is_newer(candidate, current):
    """True when ``candidate`` is a newer version than ``current``."""
    return parse_version(candidate) > parse_version(current)
