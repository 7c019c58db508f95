"""capl.api."""
