"""Shopping cart."""
