"""Read .env files."""
