"""demo: `capl demo` in its default mode (real nodes), as `make demo` runs it. Its own stage
(`make demo-e2e`), outside `make test`: it boots the demo's own cluster beside the real-node
stage's and would take `make test` past its time budget. The node image fixture is the
real-node stage's (tests/nodes/conftest.py)."""

from tests.nodes.conftest import node_image

__all__ = ["node_image"]
