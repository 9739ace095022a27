"""Nested list utilities."""
