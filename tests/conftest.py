import os
import resource
import sys

import pytest
from hypothesis import settings

# Property tests assert what holds, not how fast: no per-example deadline (a
# first example that imports, on a loaded machine, once took 290 ms of 200).
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
# engines import the modules of functions defined in tests
_path = os.environ.get("PYTHONPATH", "")
if HERE not in _path.split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, _path) if p)

# Many clusters start and stop in this one process: use the whole open-file
# allowance the machine gives (a soft limit of 1,024 is common).
_soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
if _hard == resource.RLIM_INFINITY or _soft < _hard:
    resource.setrlimit(resource.RLIMIT_NOFILE, (_hard, _hard))


@pytest.fixture(scope="module")
def shell(tmp_path_factory):
    """An IPython shell for ``%px`` and friends, with an IPython dir of its own."""
    from cluster_util import terminal_shell

    os.environ["IPYTHONDIR"] = str(tmp_path_factory.mktemp("ipython"))
    with terminal_shell() as ipython:
        yield ipython


KINDS = ("pure", "cluster", "multihost")  # see pyproject's markers; each test is of one kind


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        kinds = [m.name for m in item.iter_markers() if m.name in KINDS]
        if len(kinds) != 1:
            raise pytest.UsageError(f"{item.nodeid} must be of one kind of {KINDS} (pytestmark), not {kinds}")


_DIAGNOSES = []


def _diagnose(nodeid):
    """What this process looks like when a client cannot reach its hub: open
    files, threads, and whether a fresh zmq context can talk over loopback."""
    import collections
    import threading

    import zmq

    kinds = collections.Counter()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        kinds[target.split(":")[0] if ":" in target else "file"] += 1
    lines = [
        f"{nodeid}: {sum(kinds.values())} fds {dict(kinds)}, limit "
        f"{resource.getrlimit(resource.RLIMIT_NOFILE)}, {threading.active_count()} threads: "
        + ", ".join(sorted(t.name for t in threading.enumerate()))
    ]
    for name, ctx in (("global", zmq.Context.instance()), ("fresh", zmq.Context())):
        try:
            a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
            port = a.bind_to_random_port("tcp://127.0.0.1")
            b.connect(f"tcp://127.0.0.1:{port}")
            b.send(b"x")
            lines.append(f"  {name} zmq context, loopback tcp: {'ok' if a.poll(5000) else 'NOTHING in 5 s'}")
            a.close(0)
            b.close(0)
        except Exception as e:
            lines.append(f"  {name} zmq context, loopback tcp: {e!r}")
        if name == "fresh":
            ctx.term()
    _DIAGNOSES.append("\n".join(lines))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and len(_DIAGNOSES) < 3 and "Hub connection request timed out" in str(report.longrepr):
        _diagnose(item.nodeid)


def pytest_terminal_summary(terminalreporter):
    from cluster_util import DIAGNOSES

    for text in DIAGNOSES[:3]:
        terminalreporter.write_line("connect timeout at a live cluster; diagnosis: " + text)
    for text in _DIAGNOSES:  # last in the output, where a CI summary shows it
        terminalreporter.write_line("client could not reach its hub; diagnosis: " + text)
