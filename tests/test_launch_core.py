"""What launchers read and write, without a cluster: command lines, Slurm's
variables, the controller's location (issue 46)."""

import os
import subprocess
import sys
import textwrap

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ipyparallel_broadcast.controller.location import reachable_location, routed_address
from ipyparallel_broadcast.engine.compose.host import bound_by_scheduler, budget_cores, slurm_hint
from ipyparallel_broadcast.launch.commands import merge_settings

pytestmark = pytest.mark.pure


def test_a_setting_given_twice_is_passed_once_the_later_winning():
    """The profile's depth and Cluster(depth=...) both reached the controller:
    ``depth only accepts one value, got 2``."""
    args = merge_settings(
        ["--BroadcastController.engines=4"],
        ["--BroadcastController.depth=2", "--BroadcastController.engines=100"],
        ["--ip=*", "--BroadcastController.depth=1"],
    )
    assert args == ["--BroadcastController.engines=100", "--ip=*", "--BroadcastController.depth=1"]


@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 9)), max_size=12))
def test_merged_settings_name_each_setting_once_with_its_last_value(pairs):
    args = merge_settings([f"--S.{k}={v}" for k, v in pairs])
    names = [a.split("=")[0] for a in args]
    assert len(names) == len(set(names))
    assert dict(a[len("--S.") :].split("=") for a in args) == {k: str(v) for k, v in pairs}


@pytest.mark.parametrize(
    "env, hint",
    [
        ({"SLURM_STEP_TASKS_PER_NODE": "4(x3)", "SLURM_NODEID": "2", "SLURM_LOCALID": "3"}, (4, 3)),
        ({"SLURM_STEP_TASKS_PER_NODE": "4(x2),3", "SLURM_NODEID": "2", "SLURM_LOCALID": "0"}, (3, 0)),
        ({"SLURM_TASKS_PER_NODE": "2,5", "SLURM_NODEID": "1", "SLURM_LOCALID": "4"}, (5, 4)),
        ({"SLURM_STEP_TASKS_PER_NODE": "4(x3)", "SLURM_LOCALID": "1"}, (4, 1)),  # one node: no NODEID
        ({"SLURM_STEP_TASKS_PER_NODE": "4(x3)"}, None),  # not a task of a step
        ({"SLURM_STEP_TASKS_PER_NODE": "4(x2)", "SLURM_NODEID": "5", "SLURM_LOCALID": "0"}, None),
        ({"SLURM_STEP_TASKS_PER_NODE": "four", "SLURM_LOCALID": "0"}, None),
        ({}, None),
    ],
)
def test_srun_tells_each_engine_its_nodes_task_count_and_local_rank(env, hint):
    assert slurm_hint(env) == hint


def test_the_budget_is_what_slurm_gave_the_node_but_never_more_than_it_has():
    assert budget_cores({"SLURM_CPUS_ON_NODE": "8"}, usable=16) == 8  # 4 tasks x --cpus-per-task=2
    assert budget_cores({"SLURM_CPUS_ON_NODE": "5"}, usable=2) == 2  # a node configured past its cores
    assert budget_cores({}, usable=6) == 6
    assert budget_cores({"SLURM_CPUS_ON_NODE": "x"}, usable=6) == 6


def test_a_task_bound_to_its_own_cores_budgets_its_mask():
    bound = {"SLURM_CPU_BIND_TYPE": "mask_cpu:"}
    assert bound_by_scheduler(bound, mask={0, 1}, total=8)
    assert not bound_by_scheduler(bound, mask=set(range(8)), total=8)  # the whole machine: shared
    assert not bound_by_scheduler({"SLURM_CPU_BIND_TYPE": "none"}, mask={0}, total=8)
    assert not bound_by_scheduler({}, mask={0}, total=8)  # narrowed by someone else: still shared


def test_a_controller_on_all_interfaces_names_an_address_others_reach():
    """A name that resolves to loopback only (``/etc/hosts`` on many nodes) is
    no location: the routed address is (if there is a route)."""
    assert reachable_location("localhost") == (routed_address() or "localhost")
    routed = routed_address()
    if routed is not None:
        assert reachable_location(routed) == routed


def test_importing_the_compose_directory_module_at_exit_registers_nothing():
    """A launcher's stop at interpreter exit (a cluster whose controller failed)
    imports ``host.composedir`` (once ``compose.host``, which imported loky, which registers an atexit
    handler: ``RuntimeError: can't register atexit after shutdown``)."""
    code = textwrap.dedent(
        """
        import atexit
        import threading

        def at_exit():
            from ipyparallel_broadcast.host import composedir
            composedir.remove_if_unused("no-such-cluster")

        atexit.register(at_exit)
        threading.Thread(target=print).start()  # ipcluster's process has threads: their shutdown comes first
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=os.environ)
    assert done.returncode == 0 and done.stderr == "", done.stderr


def test_an_auto_tree_without_an_engine_count_says_so(caplog):
    """ipyparallel's launchers (ssh, mpi, ...) do not pass the count ours pass."""
    from traitlets.config import LoggingConfigurable

    from ipyparallel_broadcast.controller.settings import ASSUMED_ENGINES, TreeSettings

    class Settings(TreeSettings, LoggingConfigurable):
        pass

    told = Settings(depth="auto", engines=5)
    assert told.shape.depth >= 0  # decided here
    assert told.auto_inputs["engines"] == 5 and "without an engine count" not in caplog.text
    guessed = Settings(depth="auto")
    assert guessed.shape.depth >= 0
    assert guessed.auto_inputs["engines"] == ASSUMED_ENGINES and "without an engine count" in caplog.text


def test_only_a_controller_on_every_interface_moves_its_location():
    """On one address (127.0.0.1 by default) the location stays the hostname,
    which IPython Parallel's clients compare with their own (its
    ``test_warning_on_hostname_match``)."""
    from traitlets import Unicode
    from traitlets.config import Config, Configurable

    from ipyparallel_broadcast.controller import location

    class Controller(Configurable):  # IPController's traits that say where it listens
        location = Unicode("upstream's hostname", config=True)
        engine_ip = Unicode("127.0.0.1")
        client_ip = Unicode("127.0.0.1")

        def located(self):
            return location.located(self) or self.location

    assert Controller().located() == "upstream's hostname"
    assert Controller(engine_ip="*").located() == reachable_location()
    assert Controller(client_ip="0.0.0.0").located() == reachable_location()
    config = Config()
    config.Controller.location = "given.example"
    assert Controller(engine_ip="*", config=config).located() == "given.example"


def test_a_job_is_taken_for_ended_only_when_slurm_says_so(tmp_path):
    """A squeue that cannot reach slurmctld, or hangs, must not end the cluster."""
    from ipyparallel_broadcast.launch import batch

    def squeue(body):
        path = tmp_path / "squeue"
        path.write_text("#!/bin/sh\n" + body + "\n")
        path.chmod(0o755)
        return str(path)

    assert batch.job_state("7", squeue("echo RUNNING")) == "RUNNING"
    assert batch.job_state("7", squeue("true")) == "GONE"  # no longer listed
    assert batch.job_state("7", squeue("echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1")) == "GONE"
    down = squeue("echo 'slurm_load_jobs error: Unable to contact slurm controller' >&2; exit 1")
    assert batch.job_state("7", down) == "UNKNOWN" and "UNKNOWN" in batch.LIVE_STATES
    old, batch.SQUEUE_TIMEOUT = batch.SQUEUE_TIMEOUT, 0.2
    try:
        assert batch.job_state("7", squeue("exec sleep 5")) == "UNKNOWN"
    finally:
        batch.SQUEUE_TIMEOUT = old


def test_the_default_tree_is_auto_sized_for_the_engine_count_and_cores():
    """No depth or fan-out given: the shape 'auto' picks (results/default-tree.md)."""
    from traitlets.config import LoggingConfigurable

    from ipyparallel_broadcast.controller.settings import TreeSettings
    from ipyparallel_broadcast.engine.compose.host import cpu_count
    from ipyparallel_broadcast.wire.topology import auto_shape

    class Settings(TreeSettings, LoggingConfigurable):
        pass

    settings = Settings(engines=8)
    assert settings.shape == auto_shape(8, cpu_count())
    assert settings.auto_inputs == dict(engines=8, cores=cpu_count())
    fixed = Settings(depth=2, fanout=3, engines=8)
    assert fixed.shape.depth == 2 and fixed.shape.fanout == 3 and fixed.auto_inputs is None
