"""Price calculations."""
