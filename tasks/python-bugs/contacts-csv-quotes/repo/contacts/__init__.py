"""Contact import."""
