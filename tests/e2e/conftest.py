"""e2e: end to end with the real Cluster API manager and clusterctl.

Fixtures: tests/fixtures/capi.py (registered in tests/conftest.py).
"""
