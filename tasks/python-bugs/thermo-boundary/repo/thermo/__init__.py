"""Weather alerts."""
