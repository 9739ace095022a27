"""Form building."""
