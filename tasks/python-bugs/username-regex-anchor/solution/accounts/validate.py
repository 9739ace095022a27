"""Validation of user-chosen account names."""

import re

USERNAME = re.compile(r"[a-z][a-z0-9_]{2,15}")
RESERVED = {"admin", "root", "support"}


def is_valid_username(name):
    """True when ``name`` is 3-16 lowercase letters, digits or underscores,
    starts with a letter, and is not reserved."""
    return bool(USERNAME.fullmatch(name)) and name not in RESERVED
