"""The thesis's four suites: push, throughput, many messages, tree depth.

Every view reaches all engines of a pooled cluster (see ``pool``); engine
counts and sizes come from the machine profile (``profiles``).
"""

import numpy as np

from . import common
from .profiles import current

P = current()


class _AllEngines:
    """One view over all engines of a pooled cluster, warmed up, and a payload
    of ``payload_bytes(x)`` for the third parameter ``x``."""

    timeout = P.timeout

    def payload_bytes(self, x) -> int:
        return x

    def setup(self, n, view, x):
        self.view = common.view(view, n)
        self.data = np.ones(max(self.payload_bytes(x) // 8, 1))
        self.view.apply_sync(common.echo, self.data)  # warm: imports, connections


class Push(_AllEngines):
    """A large argument out to every engine, nothing back."""

    params = (list(P.engines), list(common.VIEWS), list(P.sizes))
    param_names = ["engines", "view", "bytes"]

    def time_push(self, n, view, size):
        self.view.apply_sync(common.noop, self.data)


class Throughput(_AllEngines):
    """A large argument out and back from every engine."""

    params = Push.params
    param_names = Push.param_names

    def time_echo(self, n, view, size):
        self.view.apply_sync(common.echo, self.data)


class ManyMessages(_AllEngines):
    """M asynchronous 1 kB echoes in flight at once, then all results."""

    params = (list(P.engines), list(common.VIEWS), list(P.many))
    param_names = ["engines", "view", "calls"]

    def payload_bytes(self, calls) -> int:
        return 1024

    def time_many(self, n, view, calls):
        ars = [self.view.apply_async(common.echo, self.data) for _ in range(calls)]
        for ar in ars:
            ar.get()


class TreeDepth:
    """1 kB echo latency by tree depth (ours: relay tree; ipyparallel: its
    broadcast scheduler depth; DirectView for reference), at one engine count."""

    params = (list(P.depths), list(common.VIEWS))
    param_names = ["depth", "view"]
    timeout = P.timeout

    def setup(self, depth, view):
        self.view = common.view(view, P.depth_engines, depth)
        self.data = np.ones(128)
        self.view.apply_sync(common.echo, self.data)

    def time_echo(self, depth, view):
        self.view.apply_sync(common.echo, self.data)
