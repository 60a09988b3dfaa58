"""Teaching."""
