"""ipyparallel's Client test module with our BroadcastView substituted for
every view: its hub queries (``db_query``, ``result_status``, ``queue_status``,
``get_result``, ``hub_history``, ``purge_*``, ``resubmit``) run on broadcasts,
which the hub records per engine. One reply mode: records do not depend on it
(``test_hub_records.py`` covers all three)."""

from ipyparallel.tests import test_client as upstream
from substitute import substituted

substituted(upstream.TestClient, globals(), modes=["Coalescing"])
