"""Invoicing helpers."""
