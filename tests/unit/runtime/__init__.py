"""Unit tests of the controller runtime (capl.runtime) against an in-memory API."""
