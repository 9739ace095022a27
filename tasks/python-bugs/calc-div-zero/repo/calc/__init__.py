"""Arithmetic helpers for reports."""
