"""ipyparallel's LoadBalancedView and dependency test modules, as they are,
against our controller: its task queue is ours (``controller/taskqueue.py``,
restartable, and failing queued tasks whose engines are all gone)."""

from ipyparallel.tests.test_dependency import *  # noqa: F403
from ipyparallel.tests.test_lbview import *  # noqa: F403
