"""Batch processing helpers."""
