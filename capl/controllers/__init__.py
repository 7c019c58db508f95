"""capl.controllers."""
