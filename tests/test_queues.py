"""The controller's mux and control queues survive junk (issue 32): one
message of a single frame broke ipyparallel's compiled queue for good, and
every later DirectView request through it waited forever."""

import glob
import json
import os

import pytest
import zmq
from cluster_util import running_cluster

pytestmark = pytest.mark.cluster

JUNK = [[b"x"], [b""], [b"", b""], [b"abc", b""], [b"<IDS|MSG>", b"0" * 64, b"{}", b"{}", b"{}", b"{]"]]


def test_junk_to_the_mux_and_control_queues_breaks_nothing():
    with running_cluster(2, 1, 2) as rc:
        (url_file,) = glob.glob(os.path.join(rc.test_profile_dir, "security", "*-client.json"))
        with open(url_file) as f:
            info = json.load(f)
        ctx = zmq.Context.instance()
        for channel in ("mux", "control"):
            for frames in JUNK:
                sock = ctx.socket(zmq.DEALER)
                sock.linger = 1000
                sock.connect(f"{info['interface']}:{info[channel]}")
                sock.send_multipart(frames)
                sock.close()  # (linger: it goes before the socket does)
                ar = rc[:].apply_async(os.getpid)
                assert ar.wait(30), f"the {channel} queue stopped after {frames!r}"
                rc.abort(targets=rc.ids, block=True)  # a control request and its reply
        assert len(set(rc[:].apply_sync(os.getpid))) == 2
