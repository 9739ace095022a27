"""Warehouse stock bookkeeping."""
