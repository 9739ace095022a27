"""Document permissions."""
