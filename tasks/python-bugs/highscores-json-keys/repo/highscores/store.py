"""Persist per-level high scores as a JSON file."""

import json
from pathlib import Path


def save_scores(path, scores):
    """Write ``scores`` ({level number: best score}) to ``path``."""
    Path(path).write_text(json.dumps(scores, sort_keys=True), encoding="utf-8")


def load_scores(path):
    """Return the {level number: best score} mapping saved at ``path``.

    A missing file means there are no scores yet.
    """
    path = Path(path)
    if not path.exists():
        return {}
    return json.loads(path.read_text(encoding="utf-8"))


def record(path, level, score):
    """Save ``score`` for ``level`` if it beats the stored best; return the best."""
    scores = load_scores(path)
    best = max(score, scores.get(level, score))
    scores[level] = best
    save_scores(path, scores)
    return best
