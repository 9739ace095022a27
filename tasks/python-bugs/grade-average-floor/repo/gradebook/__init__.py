"""Grade book reports."""
