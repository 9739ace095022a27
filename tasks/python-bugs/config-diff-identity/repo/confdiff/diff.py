"""Compare two versions of a configuration mapping."""

_MISSING = object()


def changed_keys(old, new):
    """Return the sorted keys whose value differs between ``old`` and ``new``.

    Keys present in only one mapping count as changed.
    """
    keys = set(old) | set(new)
    return sorted(
        k for k in keys
        if old.get(k, _MISSING) is not new.get(k, _MISSING)
    )


def describe(old, new):
    """Return one human-readable line per changed key."""
    lines = []
    for key in changed_keys(old, new):
        if key not in old:
            lines.append(f"+ {key} = {new[key]!r}")
        elif key not in new:
            lines.append(f"- {key}")
        else:
            lines.append(f"~ {key}: {old[key]!r} -> {new[key]!r}")
    return lines
