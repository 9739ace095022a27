"""Newsletter mailing."""
