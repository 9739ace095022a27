"""Configuration diffs."""
