"""Parse ``.env`` style files made of KEY=VALUE lines."""


def parse_line(line):
    """Return (key, value) for one line, or None for blanks and comments.

    Whitespace around the key and value is ignored, and a value wrapped in
    matching single or double quotes is unquoted. A line without ``=``
    raises ValueError.
    """
    line = line.strip()
    if not line or line.startswith("#"):
        return None
    key, value = line.split("=", 1)
    key, value = key.strip(), value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        value = value[1:-1]
    return key, value


def parse_env(text):
    """Return a dict of all KEY=VALUE pairs in ``text``."""
    pairs = (parse_line(line) for line in text.splitlines())
    return dict(p for p in pairs if p is not None)
