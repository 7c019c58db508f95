"""Unit tests of the API client (capl.kube)."""
