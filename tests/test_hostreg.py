"""The hub's side of registration by host (``controller.hostreg``), with a real
controller: the test speaks for a host relay on the hub's registration socket,
its batches made by the relay's own ``Registrar``."""

import glob
import json
import os
import tempfile

import pytest
import zmq
from cluster_util import until
from jupyter_client.session import Session

import ipyparallel_broadcast as ipb
from ipyparallel_broadcast.relay.registrar import HUB, Registrar
from ipyparallel_broadcast.wire import protocol as P
from ipyparallel_broadcast.wire.frames import send_frames

pytestmark = pytest.mark.cluster


def test_an_engine_whose_heart_beats_after_the_registration_timeout_is_registered_then():
    """An engine granted its id whose relay has not said it beats by the hub's
    ``registration_timeout`` is set aside; when its relay says so later (a host
    too loaded to join it and start its heart in time: 10,000 simulated engines
    on two cores left 2 or 3 of them so, unregistered for good), it is
    registered then, with the id it was granted, and a client sees it."""
    with tempfile.TemporaryDirectory(prefix="ipb-test-", dir=os.environ.get("IPB_TEST_DIR")) as profile_dir:
        cluster = ipb.Cluster(
            n=0, profile_dir=profile_dir, controller_args=["--IPController.registration_timeout=1"], log_level=40
        )
        cluster.start_controller_sync()
        rc = cluster.connect_client_sync()
        (engine_file,) = glob.glob(os.path.join(profile_dir, "security", "*-engine.json"))
        with open(engine_file) as f:
            info = json.load(f)
        codec = P.Codec(Session(key=info["key"].encode(), signature_scheme=info["signature_scheme"]))
        relay = Registrar(codec, "a-late-host")
        hub = zmq.Context.instance().socket(zmq.DEALER)
        hub.LINGER = 0
        hub.connect(f"{info['interface']}:{info['registration']}")

        def batch(sends):
            (ask,) = [s for s in sends if s.socket == HUB]
            send_frames(hub, ask.frames)
            assert hub.poll(30_000), "the hub did not answer the batch"
            relay.from_hub(hub.recv_multipart())

        try:
            uuid = "late-engine-0"
            batch(relay.from_engine([b"engine-0"] + codec.pack("registration_request", dict(uuid=uuid))))
            eid = relay.granted[uuid]
            logs = os.path.join(profile_dir, "log", "*.log")

            def set_aside():
                for path in glob.glob(logs):
                    with open(path) as f:
                        if f"engine {eid}:{uuid} has not beaten" in f.read():
                            return True
                return False

            until(set_aside, timeout=60, what="the hub to set the engine aside")
            assert rc.ids == []
            batch(relay.beating([uuid]))
            rc.wait_for_engines(1, timeout=30)
            assert rc.ids == [eid] and rc.queue_status()[eid]["queue"] == 0
        finally:
            hub.close()
            rc.close()
            cluster.stop_cluster_sync()
