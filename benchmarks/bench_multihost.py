"""Across hosts, on the NetBed (network namespaces on a bridge; root only):
our BroadcastView with a relay on every engine host, the same with engines
connected to the controller-side leaves (``host_relay=never``), and
DirectView, on a fresh bed each. Bytes into the busiest host per 1 MB push are
tracked (a count, not a time); the push and a 1 kB echo are timed."""

import numpy as np

from ipyparallel_broadcast.tools.bedcluster import BedCluster
from ipyparallel_broadcast.tools.netbed import NetBed

from .profiles import current

P = current()
LAYOUTS = {"host relays": [], "controller-side tree": ["--BroadcastEngine.host_relay=never"]}


class MultiHost:
    params = (list(LAYOUTS), ["ours coalescing", "DirectView"])
    param_names = ["layout", "view"]
    timeout = P.timeout
    unit = "MB"

    def setup(self, layout, view):
        why = NetBed.available()
        if why:
            raise NotImplementedError(why)
        if view == "DirectView" and layout != "host relays":
            raise NotImplementedError("DirectView does not use the tree: measured once")
        hosts, per_host = P.multihost
        self.bed = NetBed(hosts=hosts).__enter__()
        try:
            self.cluster = BedCluster(self.bed).__enter__()
            for host in self.bed.hosts:
                self.cluster.start_engines(host, per_host, args=LAYOUTS[layout])
            rc = self.cluster.client(wait_for=hosts * per_host)
        except BaseException:
            self.teardown(layout, view)
            raise
        self.view = rc.broadcast_view() if view != "DirectView" else rc[:]
        self.data, self.echo = np.zeros(1 << 20, dtype=np.uint8), np.zeros(1024, dtype=np.uint8)
        self.view.apply_sync(lambda: 0)

    def teardown(self, layout, view):
        for part in ("cluster", "bed"):
            if hasattr(self, part):
                getattr(self, part).close()

    def track_mb_into_busiest_host_per_push(self, layout, view):
        before = [self.bed.link_bytes(h)[0] for h in self.bed.hosts]
        self.view.push(dict(data=self.data), block=True)
        return max(self.bed.link_bytes(h)[0] - b for h, b in zip(self.bed.hosts, before)) / 1e6

    def time_push_1mb(self, layout, view):
        self.view.push(dict(data=self.data), block=True)

    def time_echo(self, layout, view):
        self.view.apply_sync(lambda x: x, self.echo)
