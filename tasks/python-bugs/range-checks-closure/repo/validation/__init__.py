"""Record validation."""
