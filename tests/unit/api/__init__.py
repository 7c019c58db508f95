"""Unit tests of the API models and the manifests generated from them (capl.api)."""
