"""File backups."""
