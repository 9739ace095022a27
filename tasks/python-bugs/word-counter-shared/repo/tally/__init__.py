"""Word statistics."""
