"""capl.virt."""
