"""``python -m ipyparallel_broadcast.engine``: an ipyparallel engine whose
native thread pools are composed with those of its host's other engines.

It is ipyparallel's ``IPEngine`` plus a compose mode, set before anything
loads NumPy: ``--BroadcastEngine.compose=static|counting|default|tbb``
(``--compose=...`` for short). ``ipcluster``/``Cluster`` start it through
``BroadcastEngineSetLauncher``; ssh, MPI or batch launchers start it when
their ``engine_cmd`` is this module.
"""

from __future__ import annotations

from ipyparallel.engine import app as ipp_engine_app
from ipyparallel.engine.app import IPEngine
from ipyparallel.engine.app import aliases as engine_aliases
from traitlets import Bool, Dict, Enum, Float

from . import compose
from .compose.host import cluster_key
from .kernel import BroadcastKernel
from .logs import drop_unwritten_levels

ENGINE_CMD = ["-m", "ipyparallel_broadcast.engine"]

aliases = dict(engine_aliases, compose="BroadcastEngine.compose")


class BroadcastEngine(IPEngine):
    compose = Enum(
        compose.MODES,
        "static",
        config=True,
        help="""How this engine's BLAS/OpenMP threads share the host with other engines:
        'static' (a fixed budget of cores*factor/engines-on-host threads),
        'counting' (the budget at rest; threads() regions take free cores from a
        host-wide token pool), 'default' (no limits) or 'tbb' (one IPC TBB pool).""",
    )
    compose_factor = Float(1.0, config=True, help="Oversubscription factor of the static budget.")
    compose_pin = Bool(False, config=True, help="Static mode: pin to this engine's slice of cores.")
    compose_requests = Bool(
        False, config=True, help="Counting mode: run every request in a threads() region."
    )
    compose_strict = Bool(
        False, config=True, help="Counting mode: regions wait for at least one token."
    )
    aliases = Dict(aliases)

    def init_engine(self):
        drop_unwritten_levels(self.log)
        super().init_engine()  # reads the connection file, which has the session key
        try:
            status = compose.configure(
                self.compose,
                key=cluster_key(self.session.key),
                factor=self.compose_factor,
                pin=self.compose_pin,
                requests=self.compose_requests,
                strict=self.compose_strict,
            )
        except compose.ComposeError as e:
            self.log.critical("cannot start in compose mode %r: %s", self.compose, e)
            self.exit(1)
        self.log.info(
            "compose %s: %i threads (%i cores, %i engines on %s, rank %s)",
            status["mode"], status["budget"], status["cores"], status["engines_on_host"],
            status["host"], status["rank"],
        )

    async def complete_registration(self, *args, **kwargs):
        ipp_engine_app.Kernel = BroadcastKernel  # the kernel class ipyparallel instantiates
        await super().complete_registration(*args, **kwargs)
        if self.kernel is not None:
            compose.runtime().attach(self.kernel)


main = launch_new_instance = BroadcastEngine.launch_instance

if __name__ == "__main__":
    main()
