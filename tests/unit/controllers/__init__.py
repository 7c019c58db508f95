"""Unit tests of the reconcilers and their pure parts (capl.controllers)."""
