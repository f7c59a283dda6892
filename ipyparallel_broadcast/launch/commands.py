"""What every launcher of ours shares: the processes' command lines, and what
happens when the controller does not come up.
"""

from __future__ import annotations

import sys

from traitlets import HasTraits, List, default

from .keepsettings import KeepSettings

CONTROLLER_CMD = [sys.executable, "-m", "ipyparallel_broadcast.controller"]
ENGINE_CMD = [sys.executable, "-m", "ipyparallel_broadcast.engine"]
FORKED_CMD = [sys.executable, "-m", "ipyparallel_broadcast.engine.forked"]
LOG_LINES = 20  # lines of a failed controller's log shown in the error


def section_args(config, section: str) -> list:
    """``--Section.x=y`` for each setting of ``section`` in a traitlets config."""
    if section not in config:
        return []
    return [f"--{section}.{k}={v}" for k, v in config[section].items()]


def merge_settings(*sources) -> list:
    """Command-line args of ``sources`` in order, a ``--Section.name=`` setting
    given again replacing the earlier one in place (traitlets refuses a
    setting given twice: ``depth only accepts one value, got 2``)."""
    merged: dict = {}
    for args in sources:
        for arg in args:
            name, eq, _ = arg.partition("=")
            key = name if eq and name.startswith("--") and "." in name else arg
            merged.pop(key, None)
            merged[key] = arg
    return list(merged.values())


class ControllerCommand(KeepSettings):
    """The controller's command line: our controller with this interpreter
    under its keeper (``keeper``), the cluster's engine count (for an 'auto'
    tree), the ``BroadcastController`` settings of the cluster's config, then
    ``controller_args``; a later one of the same setting wins."""

    controller_cmd = List(
        config=True,
        help="The controller's command line; by default this Python running ipyparallel_broadcast.controller "
        "under its keeper (launch.keeper: restarted with --restore if it dies), or alone when "
        "controller_restarts is 0.",
    )

    @default("controller_cmd")
    def _kept_controller(self):
        return self.kept(CONTROLLER_CMD)

    def merged_controller_args(self) -> list:
        n = getattr(self.parent, "n", None)
        sized = [f"--BroadcastController.engines={n}"] if n else []
        return merge_settings(sized, section_args(self.config, "BroadcastController"), self.controller_args)


class StartFailure(HasTraits):
    """A controller that ends before it writes its connection files: the error
    names it and shows the last lines of its log, and the cluster is let go.

    Under ``ipcluster start`` ipyparallel would log the error and wait forever
    (it starts the cluster in a callback of its loop), and its cluster file,
    which names the never-started engine set, would block the next start.
    So the engine sets that never started are dropped, the file is updated
    (removed), and ipcluster is stopped with exit status 1.
    """

    async def get_connection_info(self, timeout=None):
        try:
            return await super().get_connection_info(timeout)
        except (RuntimeError, TimeoutError) as e:
            self.let_cluster_go()
            raise RuntimeError(f"{e}\n{self.log_tail()}") from None

    def log_tail(self) -> str:
        """The last lines of the controller's output (ipyparallel reads it once, when it stops)."""
        where = getattr(self, "output_file", "") or "its log"
        try:
            text = self.get_output(remove=False)
        except OSError as e:
            return f"(no controller output: {e})"
        lines = text.splitlines(True)[-LOG_LINES:]
        body = "".join("    " + line for line in lines) or "    (empty)\n"
        return f"The last lines of the controller's output ({where}):\n{body}"

    def let_cluster_go(self):
        cluster = self.parent
        engines = getattr(cluster, "engines", {})
        for key in [k for k, es in engines.items() if es.state == "before"]:
            del engines[key]
        if hasattr(cluster, "update_cluster_file"):
            cluster.update_cluster_file()
        app = getattr(cluster, "parent", None)
        if app is not None and hasattr(app, "stop_cluster") and hasattr(app, "loop"):  # ipcluster start
            app.loop.add_callback(self._end_app, app)

    @staticmethod
    async def _end_app(app):
        app.log.critical("The controller did not start; stopping.")
        await app.stop_cluster()
        app.exit(1)
