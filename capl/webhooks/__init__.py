"""capl.webhooks."""
