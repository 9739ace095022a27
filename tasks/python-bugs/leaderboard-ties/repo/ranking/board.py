"""Leaderboard ordering for a game server."""

from collections import namedtuple

Entry = namedtuple("Entry", "name score")


def standings(entries):
    """Return entries best first: highest score, ties broken by name A-Z."""
    return sorted(entries, key=lambda e: (e.score, e.name), reverse=True)


def top(entries, n=3):
    """Return the names of the ``n`` best entries."""
    return [e.name for e in standings(entries)[:n]]
