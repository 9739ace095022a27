"""Ledger reports."""
