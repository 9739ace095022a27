"""Turn arbitrary titles into URL-friendly slugs."""

import re
import unicodedata

_NON_WORD = re.compile(r"[^a-z0-9]+")


def ascii_fold(text):
    """Replace accented letters with their plain ASCII base letter."""
    normalized = unicodedata.normalize("NFC", text)
    return normalized.encode("ascii", "ignore").decode("ascii")


def slugify(title, max_length=50):
    """Return a lowercase, hyphen-separated slug for ``title``."""
    slug = _NON_WORD.sub("-", ascii_fold(title).lower()).strip("-")
    return slug[:max_length].rstrip("-")
