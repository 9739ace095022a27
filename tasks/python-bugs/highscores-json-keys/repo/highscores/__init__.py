"""Per-level high scores."""
