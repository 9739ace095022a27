"""Load application settings from a JSON file."""

import json
from pathlib import Path

DEFAULTS = {"host": "127.0.0.1", "port": 8000, "debug": False}


class ConfigError(Exception):
    """Raised when a settings file exists but cannot be used."""


def load_config(path):
    """Return DEFAULTS overlaid with the settings stored at ``path``.

    A missing file is not an error: the defaults are returned. A file that
    is not valid JSON, or whose top level is not an object, raises
    ConfigError.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except ValueError:
        return dict(DEFAULTS)
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{path}: invalid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    return {**DEFAULTS, **data}
