"""The client's reply path without sockets: what it costs per call to file
every engine's reply from its hosts' tables and unpack the results, the part
of the center's CPU that grows with the engine count (``bench_farm.Center``
times all of it, on a cluster)."""

import uuid

from jupyter_client.session import Session

from ipyparallel_broadcast.client.calls import Call, Calls
from ipyparallel_broadcast.client.results import call_results
from ipyparallel_broadcast.engine.applycall import serialize_result
from ipyparallel_broadcast.wire import bundles as B
from ipyparallel_broadcast.wire import protocol as P

PER_HOST = 64  # engines behind each host relay, one table each


class ClientReplies:
    """A coalesced 1 kB echo's replies: 16 or 64 host tables, filed and unpacked."""

    params = ([1024, 4096],)
    param_names = ["engines"]

    def setup(self, n):
        # signatures repeat from sample to sample: no replay history to refuse them
        self.codec = P.Codec(Session(key=b"bench", digest_history_size=0))
        self.uuids = [str(uuid.uuid4()) for _ in range(n)]
        result = serialize_result(b"\0" * 1024, 1024, 64)
        self.msg_id = "bench-call"
        outputs = {P.OUTPUTS_KEY: dict(stdout="", stderr="", outputs=[], iopub=False)}  # ours: in the reply
        self.tables = []
        for start in range(0, n, PER_HOST):
            bodies = [
                self.codec.serialize(
                    "apply_reply", dict(status="ok"), {"msg_id": self.msg_id}, dict(engine=u, **outputs)
                )[1:]
                + list(result)
                for u in self.uuids[start : start + PER_HOST]
            ]
            self.tables.append([bytes(f) for f in B.pack_replies(self.codec, "r", self.msg_id, bodies, [])])
        self.calls = Calls()

    def time_file_and_unpack(self, n):
        call = self.calls.start(
            Call(self.msg_id, {"msg_id": self.msg_id, "msg_type": "apply_request"}, range(n), self.uuids)
        )
        for frames in self.tables:
            msg = self.codec.unpack(frames)
            self.calls.bundle(call, B.iter_bundle(self.codec, msg, tables=True), 0.0, self.codec.unpack, None)
        assert call.done
        call_results(None, call)  # (the usual ok replies need no client)
        self.calls.finish(call)
