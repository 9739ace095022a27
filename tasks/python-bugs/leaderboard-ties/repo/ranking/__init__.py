"""Game leaderboards."""
