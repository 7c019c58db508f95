"""Wiring of the capl controller manager (filled in with the controllers)."""
