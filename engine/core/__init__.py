"""The serving core."""
