"""Make backup copies of files next to the originals."""

import shutil
from pathlib import Path


def backup_path(path):
    """Return the backup location for ``path``: the same name plus ``.bak``.

    ``notes.txt`` -> ``notes.txt.bak``.
    """
    path = Path(path)
    return path.with_suffix(".bak")


def make_backup(path):
    """Copy ``path`` to its backup location and return that location."""
    target = backup_path(path)
    shutil.copy2(path, target)
    return target
