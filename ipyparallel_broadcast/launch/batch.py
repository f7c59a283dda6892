"""Broadcast clusters through Slurm: IPython Parallel's Slurm launchers running
our controller and engines, with a controller job that is watched.

    c.Cluster.controller_launcher_class = "broadcast-slurm"   # or "broadcast": local
    c.Cluster.engine_launcher_class = "broadcast-slurm"
    c.BroadcastSlurmEngineSetLauncher.engines_per_node = 4

What these add to ipyparallel's own Slurm launchers:

- the commands are ``sys.executable -m ipyparallel_broadcast...``: the
  interpreter that has this package, not the first ``python3`` on the job's PATH;
- the controller gets the tree settings and the engine count ('auto' sizing)
  as the local launcher gives them;
- a controller job that ends before it writes its connection files is
  reported at once, with the last lines of its log, instead of a 60 s timeout;
  ``ipcluster start`` then stops and leaves no cluster file behind (see
  ``StartFailure``);
- ``engines_per_node`` puts that many engines on each node;
- the controller is kept inside its job (``keeper``): a controller process
  that dies is started again there, on the same node and ports, with
  ``--restore`` (a job that ends, a node lost, is not: that ends the cluster).
"""

from __future__ import annotations

import asyncio
import subprocess
import time

from ipyparallel.cluster.launcher import SlurmControllerLauncher, SlurmEngineSetLauncher
from traitlets import Integer, List, default

from .commands import ENGINE_CMD, ControllerCommand, StartFailure, section_args

# squeue's states of a job that may still run (anything else: it ended)
LIVE_STATES = {"PENDING", "CONFIGURING", "RUNNING", "SUSPENDED", "RESIZING", "REQUEUED", "REQUEUE_HOLD", "UNKNOWN"}
POLL_EVERY = 1.0  # seconds between squeue calls while waiting for the controller
SQUEUE_TIMEOUT = 5.0  # seconds squeue may take before its answer counts as unknown


def job_state(job_id: str, squeue: str = "squeue") -> str:
    """Slurm's state of ``job_id`` ("GONE" once squeue no longer knows it;
    "UNKNOWN", taken as alive, when squeue fails otherwise or does not answer
    in time: a busy or restarting slurmctld must neither stall ipcluster's loop
    nor end the cluster)."""
    try:
        done = subprocess.run(
            [squeue, "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, timeout=SQUEUE_TIMEOUT
        )
    except subprocess.TimeoutExpired:
        return "UNKNOWN"
    state = done.stdout.strip()
    if done.returncode == 0:
        return state or "GONE"  # purged from squeue's list: ended
    return "GONE" if "Invalid job id" in done.stderr else "UNKNOWN"


class BroadcastSlurmControllerLauncher(ControllerCommand, StartFailure, SlurmControllerLauncher):
    """Our controller as a Slurm job, watched until its connection files
    arrive, and kept inside the job by its keeper (``keeper``)."""

    entrypoint_name = "broadcast-slurm"
    _state_at = (0.0, None)  # (monotonic time, state): squeue is asked once a POLL_EVERY

    @default("program_args")
    def _default_program_args(self):
        return self.cluster_args + self.merged_controller_args()

    def start(self):
        job = super().start()
        try:
            self._watch = asyncio.get_running_loop().create_task(self.watch())
        except RuntimeError:  # no loop here: poll() is asked while waiting for the files
            pass
        return job

    async def watch(self):
        """Poll until the job ends, so that ``on_stop`` callbacks run (ipcluster
        start then stops, as it does when a local controller exits)."""
        while self.poll() is None and self.state == "running":
            await asyncio.sleep(POLL_EVERY)

    def poll(self):
        """None while the job may run, else its final state (ipyparallel's batch
        launchers never learn that a job ended)."""
        if self.state == "after":
            return self.stop_data.get("state", "its job ended")
        if self.state != "running" or not self.job_id:
            return None
        at, state = self._state_at
        if time.monotonic() - at >= POLL_EVERY:
            state = job_state(self.job_id)
            self._state_at = (time.monotonic(), state)
        if state in LIVE_STATES:
            return None
        self.notify_stop(dict(job_id=self.job_id, state=f"Slurm job {self.job_id} ended ({state})"))
        return self.stop_data["state"]


class BroadcastSlurmEngineSetLauncher(SlurmEngineSetLauncher):
    """Our engines as one Slurm job of ``n`` tasks."""

    entrypoint_name = "broadcast-slurm"
    engine_cmd = List(
        list(ENGINE_CMD), config=True, help="An engine's command line: this Python, ipyparallel_broadcast.engine."
    )
    engines_per_node = Integer(
        0,
        config=True,
        help="Engines on each node (sbatch --ntasks-per-node); 0: as Slurm places them. "
        "Added to the default batch template; a batch_template of your own carries its own.",
    )
    per_node_template = "#SBATCH --ntasks-per-node={engines_per_node}"

    @default("program_args")
    def _default_program_args(self):
        return self.cluster_args + section_args(self.config, "BroadcastEngine") + self.engine_args

    def start(self, n):
        self.context["engines_per_node"] = self.engines_per_node
        return super().start(n)

    def _insert_job_array_in_script(self):
        super()._insert_job_array_in_script()  # first: its --ntasks pattern takes --ntasks-per-node for it
        if self.engines_per_node and "--ntasks-per-node" not in self.batch_template:
            first, rest = self.batch_template.split("\n", 1)
            self.batch_template = "\n".join([first, self.per_node_template, rest])

    def stop(self):
        if not self.job_id:  # never submitted (the controller failed first): nothing to cancel
            return self.notify_stop(dict(job_id="", output="never submitted"))
        return super().stop()
