"""Release management."""
