"""Starting the broadcast controller: an ipyparallel launcher and ``Cluster``.

``ipcluster start --controller=broadcast`` finds ``BroadcastControllerLauncher``
through the ``ipyparallel.controller_launchers`` entry point. Settings under
``BroadcastController`` in the cluster's config (CLI flags or config files)
are passed on to the controller's command line.
Other launchers (ssh, slurm, mpi, ...) run the same controller when their
``controller_cmd`` is ``python -m ipyparallel_broadcast.controller``.
"""

from __future__ import annotations

import inspect
import sys

import ipyparallel as ipp
from ipyparallel.cluster.launcher import LocalControllerLauncher
from traitlets import Integer, List, default

CONTROLLER_CMD = [sys.executable, "-m", "ipyparallel_broadcast.controller"]


def tree_args(config) -> list:
    """``--BroadcastController.x=y`` for each such setting in a traitlets config."""
    if "BroadcastController" not in config:
        return []
    return [f"--BroadcastController.{k}={v}" for k, v in config.BroadcastController.items()]


class BroadcastControllerLauncher(LocalControllerLauncher):
    """Run ``ipyparallel_broadcast.controller`` as a local process."""

    controller_cmd = List(list(CONTROLLER_CMD), config=True)

    def find_args(self):
        return self.controller_cmd + self.cluster_args + tree_args(self.config) + self.controller_args


class Cluster(ipp.Cluster):
    """``ipyparallel.Cluster`` whose controller runs the broadcast tree.

    ``Cluster(n=8, depth=2, fanout=2)``; ``start_and_connect_sync()`` returns an
    ``ipyparallel_broadcast.Client``.
    """

    depth = Integer(None, allow_none=True, config=True, help="Tree depth (controller default if None).")
    fanout = Integer(None, allow_none=True, config=True, help="Tree fan-out (controller default if None).")

    @default("controller_launcher_class")
    def _broadcast_launcher(self):
        return BroadcastControllerLauncher

    async def start_controller(self, **kwargs):
        own = [f"--BroadcastController.{k}=" for k in ("depth", "fanout")]
        args = [a for a in self.controller_args if not a.startswith(tuple(own))]
        for name in ("depth", "fanout"):
            value = getattr(self, name)
            if value is not None:
                args.append(f"--BroadcastController.{name}={value}")
        self.controller_args = args
        return await super().start_controller(**kwargs)

    async def connect_client(self, **client_kwargs):
        """An ``ipyparallel_broadcast.Client`` connected to this cluster."""
        from .client import Client

        info = self.controller.get_connection_info()
        if inspect.isawaitable(info):
            info = await info
        return Client(
            info["client"],
            cluster=self,
            profile_dir=self.profile_dir,
            cluster_id=self.cluster_id,
            **client_kwargs,
        )
