"""What a request's two flows (``down``, ``up``) are given of their node:
the same collaborators, each owning its state."""

from __future__ import annotations

from dataclasses import dataclass

from .bigdata import BigData
from .children import Children
from .context import NodeContext
from .engines import EngineTable
from .forwarding import Forwarding
from .inflight import InFlight
from .routes import Routes
from .sharing import Sharing


@dataclass(frozen=True)
class FlowParts:
    ctx: NodeContext  # what the node is
    is_leaf: bool
    inflight: InFlight  # the requests in flight (which fail engines: ``InFlight.fail``)
    engines: EngineTable  # the engine table, id -> uuid, kept in place by the node
    routes: Routes
    children: Children
    sharing: Sharing  # the host's shared memory
    big: BigData  # the data plane and the parts that use it
    forwarding: Forwarding  # calls passed host relay to host relay
