"""The hub's side of registration by host (``controller.hostreg``), with a real
controller: the test speaks for a host relay on the hub's registration socket,
its batches made by the relay's own ``Registrar``."""

import glob
import os

import pytest
from cluster_util import StandInRelay, until

pytestmark = pytest.mark.cluster


def test_an_engine_whose_heart_beats_after_the_registration_timeout_is_registered_then():
    """An engine granted its id whose relay has not said it beats by the hub's
    ``registration_timeout`` is set aside; when its relay says so later (a host
    too loaded to join it and start its heart in time: 10,000 simulated engines
    on two cores left 2 or 3 of them so, unregistered for good), it is
    registered then, with the id it was granted, and a client sees it."""
    args = ["--IPController.registration_timeout=1"]
    with StandInRelay("a-late-host", controller_args=args, timeout=30) as standin:
        rc, relay = standin.rc, standin.relay
        uuid = "late-engine-0"
        eid = standin.ask(uuid)
        logs = os.path.join(standin.profile_dir, "log", "*.log")

        def set_aside():
            for path in glob.glob(logs):
                with open(path) as f:
                    if f"engine {eid}:{uuid} has not beaten" in f.read():
                        return True
            return False

        until(set_aside, timeout=60, what="the hub to set the engine aside")
        assert rc.ids == []
        standin.batch(relay.beating([uuid]))
        rc.wait_for_engines(1, timeout=30)
        assert rc.ids == [eid] and rc.queue_status()[eid]["queue"] == 0
