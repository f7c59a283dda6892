"""Starting the broadcast controller and engines: ipyparallel launchers and ``Cluster``.

``ipcluster start --controller=broadcast --engines=broadcast`` finds
``BroadcastControllerLauncher`` and ``BroadcastEngineSetLauncher`` through
ipyparallel's launcher entry points. Settings under ``BroadcastController`` and
``BroadcastEngine`` in the cluster's config (CLI flags or config files) are
passed on to the processes' command lines.
``broadcast-slurm`` runs them as Slurm jobs (``batch``). Other launchers (ssh,
mpi, ...) run the same processes when their ``controller_cmd`` is
``/path/to/python -m ipyparallel_broadcast.controller`` and their
``engine_cmd`` is ``/path/to/python -m ipyparallel_broadcast.engine``.
"""

from __future__ import annotations

import inspect
import json
import os

import ipyparallel as ipp
from ipyparallel.cluster.launcher import (
    LocalControllerLauncher,
    LocalEngineLauncher,
    LocalEngineSetLauncher,
)
from traitlets import Bool, Enum, Integer, List, Unicode, Union, default

from .commands import ENGINE_CMD, FORKED_CMD, ControllerCommand, StartFailure, section_args
from .succession import KeeperSuccession


class BroadcastControllerLauncher(ControllerCommand, StartFailure, KeeperSuccession, LocalControllerLauncher):
    """Run ``ipyparallel_broadcast.controller`` as a local process, under its
    keeper (``keeper``): restarted with ``--restore`` if it dies; a keeper that
    dies is replaced, and followed (``succession``)."""

    def find_args(self):
        return self.controller_cmd + self.cluster_args + self.merged_controller_args()


class BroadcastEngineLauncher(LocalEngineLauncher):
    """One ``ipyparallel_broadcast.engine``, told its set's size and its rank in it."""

    def get_env(self):
        env = super().get_env()
        env.setdefault("IPB_COMPOSE_ENGINES", str(self.parent.n))  # set already: forked
        env["IPB_COMPOSE_RANK"] = str(self.identifier)
        return env


class BroadcastEngineSetLauncher(LocalEngineSetLauncher):
    """Local engines with a composable runtime (``BroadcastEngine``).

    Each learns how many engines this set starts on the host and its rank, so
    the static budgets are right from the first request.
    """

    launcher_class = BroadcastEngineLauncher
    engine_cmd = List(
        list(ENGINE_CMD), config=True, help="An engine's command line: this Python, ipyparallel_broadcast.engine."
    )
    fork = Bool(
        False,
        config=True,
        help="Fork the engines from one pre-imported template process "
        "(ipyparallel_broadcast.engine.forked): faster to start, less memory per engine.",
    )

    def start(self, n):
        args = section_args(self.config, "BroadcastEngine") + self.engine_args
        mode = getattr(self.parent, "compose", None)  # Cluster(compose=...)
        self.engine_args = args + ([f"--BroadcastEngine.compose={mode}"] if mode else [])
        self.check_compose_mode()
        self._compose_key = self.compose_key()
        self.on_stop(lambda _data: self.remove_compose_dir())  # once every engine has exited
        if self.fork or getattr(self.parent, "fork_engines", False):
            return self.start_forked(n)
        return super().start(n)

    def start_forked(self, n):
        """One template process that forks the ``n`` engines; it stands for all
        of them (signals reach every engine, and it stops when they have)."""
        self.engine_cmd = list(FORKED_CMD)
        self.environment = dict(self.environment, IPB_FORK_ENGINES=str(n), IPB_COMPOSE_ENGINES=str(n))
        super().start(1)
        self.n = n

    async def stop(self):
        await super().stop()
        self.remove_compose_dir()  # if every engine was gone already (else when the last exits)

    def compose_key(self):
        """The engines' compose key, as they derive it (``compose.runtime``); None if unknown."""
        from ..host import composedir

        env = dict(os.environ, **self.environment)  # what the engines were given
        if env.get("IPB_COMPOSE_KEY"):
            return env["IPB_COMPOSE_KEY"]
        name = f"ipcontroller-{self.cluster_id}-engine.json" if self.cluster_id else "ipcontroller-engine.json"
        try:
            with open(os.path.join(self.profile_dir, "security", name)) as f:
                return composedir.cluster_key(json.load(f).get("key", "").encode())
        except (OSError, ValueError) as e:
            self.log.warning("compose directory of these engines unknown: %s", e)
            return None

    def remove_compose_dir(self):
        """Once every engine has stopped: their host directory, if killed
        engines left it (read at start: the controller's files go first)."""
        from ..host import composedir

        key = getattr(self, "_compose_key", None)
        root = dict(os.environ, **self.environment).get(composedir.ROOT_ENV)
        if key and composedir.remove_if_unused(key, root):
            self.log.info("removed the compose directory of stopped engines")

    def check_compose_mode(self):
        """Refuse a mode the engines would refuse, now and with the reasons, not after n exits."""
        from ..engine.compose import MODES, ComposeError

        mode = self.compose_mode()
        if mode is not None and mode not in MODES:
            raise ComposeError(f"compose mode must be one of {MODES}, not {mode!r}")
        if mode == "tbb":
            from ..engine.compose import tbbmode

            found = tbbmode.problems()
            if found:
                raise ComposeError("tbb mode is unavailable here:\n  - " + "\n  - ".join(found))

    def compose_mode(self):
        """The engines' compose mode as their command line sets it (the last word wins)."""
        mode = None
        for arg in self.engine_args:
            for flag in ("--BroadcastEngine.compose=", "--compose="):
                if arg.startswith(flag):
                    mode = arg[len(flag) :]
        return mode


class Cluster(ipp.Cluster):
    """``ipyparallel.Cluster`` whose controller runs the broadcast tree.

    ``Cluster(n=8, depth=2, fanout=2, compose="counting")``;
    ``start_and_connect_sync()`` returns an ``ipyparallel_broadcast.Client``.
    Engines are ``BroadcastEngine`` processes unless another
    ``engine_launcher_class`` is given.
    """

    depth = Union(
        [Integer(), Enum(["auto"])],
        default_value=None,
        allow_none=True,
        config=True,
        help="Tree depth, or 'auto' (controller default if None).",
    )
    fanout = Union(
        [Integer(), Enum(["auto"])],
        default_value=None,
        allow_none=True,
        config=True,
        help="Tree fan-out, or 'auto' (controller default if None).",
    )

    compose = Unicode(None, allow_none=True, config=True, help="Engines' compose mode (engine default if None).")
    fork_engines = Bool(False, config=True, help="Fork local engines from one template process.")

    @default("controller_launcher_class")
    def _broadcast_launcher(self):
        return BroadcastControllerLauncher

    @default("engine_launcher_class")
    def _broadcast_engines(self):
        return BroadcastEngineSetLauncher

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
        from ..client.client import Client

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
