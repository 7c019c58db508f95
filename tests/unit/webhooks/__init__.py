"""Unit tests of the admission webhooks (capl.webhooks)."""
