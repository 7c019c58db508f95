"""inplace: Cluster API's in-place update extension end to end (test_inplace_update.py).

Its own stage (`make e2e-inplace`), outside `make test`: a workload cluster of TCG guests and
two MachineDeployment rollouts take minutes on the shared cores. The fixtures are the e2e
stage's (tests/e2e/conftest.py, the harness in tests/e2e/harness/).
"""

from tests.e2e.conftest import management_parts, pytest_terminal_summary, view

__all__ = ["management_parts", "pytest_terminal_summary", "view"]
