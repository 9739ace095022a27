"""Split result lists into pages."""
