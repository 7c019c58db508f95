"""capl.runtime."""
