"""Membership database."""
