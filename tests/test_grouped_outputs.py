"""Outputs and errors grouped by equality at scale: 64 real engines (forked)
and 512 simulated ones (``SimEngines`` run execute's code). ``%px`` of one
print shows one group; mixed prints one group per distinct text, in target
order of first appearance; an error on every engine renders one traceback
with the engine list; per-engine detail stays in ``ar.stdout[i]``."""

import glob
import os
import re
import tempfile

import pytest
from cluster_util import quiet_config, running_cluster
from ipyparallel import error
from IPython.utils.io import capture_output

import ipyparallel_broadcast as ipb
from ipyparallel_broadcast.client.display.grouping import engine_ranges
from ipyparallel_broadcast.tools.sim import SimEngines

pytestmark = pytest.mark.cluster


def real_engines(n):
    with running_cluster(n, 1, 2, fork_engines=True) as rc:
        # each engine's id as a name, as the simulated engines have it
        rc.broadcast_view().execute("engine_id = get_ipython().kernel.engine_id", block=True)
        yield rc


def simulated_engines(n):
    with tempfile.TemporaryDirectory(prefix="ipb-sim-") as profile_dir:
        cluster = ipb.Cluster(n=0, depth=1, fanout=2, profile_dir=profile_dir, config=quiet_config(), log_level=40)
        cluster.start_controller_sync()
        rc = cluster.connect_client_sync()
        (engine_file,) = glob.glob(os.path.join(profile_dir, "security", "*-engine.json"))
        sim = SimEngines(engine_file, n, per_process=n // 2)
        try:
            sim.start(timeout=300)
            rc.wait_for_engines(n, timeout=300)
            yield rc
            rc.close()
        finally:
            sim.stop()
            cluster.stop_cluster_sync()


@pytest.fixture(scope="module", params=["real-64", "sim-512"])
def rc(request):
    kind, n = request.param.split("-")
    yield from (real_engines if kind == "real" else simulated_engines)(int(n))


def px(shell, rc, code, flags="--no-stream"):
    view = rc.broadcast_view(block=True)
    view.activate("_g")
    with capture_output(display=False) as io:
        shell.run_cell_magic("px_g", flags, code)
    return re.sub(r"\x1b\[[0-9;]*m", "", io.stdout)


def headers(text):
    """(kind, engines as written) of each ``[kind:engines ...]`` header."""
    return re.findall(r"\[(stdout|stderr|output):([0-9,-]+)(?: \(\d+ engines\))?\]", text)


def test_one_print_on_every_engine_shows_one_group(rc, shell):
    out = px(shell, rc, 'print("done")')
    n = len(rc.ids)
    assert headers(out) == [("stdout", engine_ranges(rc.ids))]
    assert f"({n} engines)]" in out and out.count("done") == 1


def test_mixed_prints_show_one_group_per_text_in_order_of_first_appearance(rc, shell):
    out = px(shell, rc, 'print(["zero", "one", "two"][engine_id % 3])')
    ids = rc.ids
    expected = [("stdout", engine_ranges([e for e in ids if e % 3 == k])) for k in (0, 1, 2)]
    assert headers(out) == expected
    assert [w for w in re.findall(r"^(zero|one|two)$", out, re.M)] == ["zero", "one", "two"]


def test_groupby_engine_groups_engines_whose_outputs_are_all_equal(rc, shell):
    out = px(shell, rc, 'print("same")', flags="--no-stream --group-outputs=engine")
    assert headers(out) == [("stdout", engine_ranges(rc.ids))]


def test_an_error_on_every_engine_renders_one_traceback_with_the_engine_list(rc, shell):
    with capture_output(display=False):
        with pytest.raises(error.CompositeError) as raised:
            px(shell, rc, "1/0")
    e = raised.value
    assert len(e.elist) == len(rc.ids)  # every engine's error is still there
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in e.render_traceback()]  # IPython's colours
    head = f"[{engine_ranges(rc.ids)}:execute] ({len(rc.ids)} engines):"
    assert lines.count(head) == 1
    assert sum(line.strip() == "ZeroDivisionError: division by zero" for line in lines) == 1
    assert str(e).splitlines()[1:] == [f"{head[:-1]} ZeroDivisionError: division by zero"]


def test_stdout_reads_per_engine_and_shows_grouped(rc):
    ar = rc.broadcast_view().execute('print("x" if engine_id == 5 else "y")', block=False)
    ar.get(timeout=120)
    ar.wait_for_output(timeout=120)
    stdout = ar.stdout
    assert stdout[rc.ids.index(5)] == "x\n" and stdout.count("y\n") == len(rc.ids) - 1
    assert repr(stdout).splitlines()[1:] == [
        f" [stdout:{engine_ranges([e for e in rc.ids if e != 5])} ({len(rc.ids) - 1} engines)]: 'y\\n'",
        " [stdout:5]: 'x\\n'>",
    ]


def test_displays_and_results_group_and_expand_shows_every_engine(shell, monkeypatch):
    """On 3 engines with the threshold at 1: displays and results group as text does."""
    from ipyparallel_broadcast.client.display import grouping

    monkeypatch.setattr(grouping, "GROUP_ABOVE", 1)
    with running_cluster(3, 0, 2) as small:
        code = "from IPython.display import HTML, display\ndisplay(HTML('<b>x</b>'))\nprint('p')\n1 + 1"
        out = px(shell, small, code)
        assert headers(out) == [("stdout", "0-2"), ("output", "0-2"), ("output", "0-2")]
        assert out.count("IPython.core.display.HTML") == 1 and len(re.findall(r"Out\[\d+:\d+\]: 2", out)) == 1

        ar = small.broadcast_view().execute("print('p')", block=False)
        ar.get(timeout=60)
        with capture_output(display=False) as io:
            ar.display_outputs(expand=True)
        assert headers(io.stdout) == [("stdout", "0"), ("stdout", "1"), ("stdout", "2")]


def test_streaming_px_shows_the_groups_once_the_call_is_done(rc, shell):
    """``%px``'s default streams output live; at this scale it comes grouped at the end."""
    out = px(shell, rc, 'print("done")', flags="--stream")
    assert headers(out) == [("stdout", engine_ranges(rc.ids))] and out.count("done") == 1
    rc.broadcast_view(block=True).activate("_g")
    # the error class of the magics' own ipyparallel.error: after IPython Parallel's own
    # magics tests, they hold another copy of that module (a random-order run found it)
    from ipyparallel.client import magics

    with capture_output(display=False) as io:
        with pytest.raises(magics.error.AlreadyDisplayedError):  # %px saw it shown
            shell.run_cell_magic("px_g", "--stream", "1/0")
    err = re.sub(r"\x1b\[[0-9;]*m", "", io.stderr)
    assert err.count(f"[{engine_ranges(rc.ids)}:execute] ({len(rc.ids)} engines):") == 1
    assert err.count("ZeroDivisionError: division by zero") == 1
