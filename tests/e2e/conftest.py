"""e2e: end to end with the real Cluster API manager and clusterctl (fixtures: tests/fixtures/capi.py)."""
