"""capl.kube."""
