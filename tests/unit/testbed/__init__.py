"""Unit tests of the test bed as a library (capl.testbed)."""
