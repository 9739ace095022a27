"""Networking helpers."""
