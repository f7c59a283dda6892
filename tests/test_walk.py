"""The call walk's reading of what each process noted (``tools.walk``), pure."""

import pytest

from ipyparallel_broadcast.tools.walk import back_and_forth, role, walk

pytestmark = pytest.mark.pure


def test_the_walk_keeps_the_calls_in_the_window_in_first_run_order():
    record = dict(
        pid=7,
        argv=["/x/ipyparallel_broadcast/engine/__main__.py"],
        name="MainProcess",
        moves=[
            [5, "engine/app.py", None],  # before the call: not in the walk
            [10, "engine/kernel.py", "compat/pyzmq.py"],
            [11, "wire/protocol.py", "engine/kernel.py"],
            [12, "engine/kernel.py", "wire/protocol.py"],  # protocol calls back into the kernel
            [30, "engine/app.py", None],  # after
        ],
    )
    (row,) = walk([record], 10, 20)
    assert row["role"] == "engine"
    assert row["files"] == ["compat/pyzmq.py", "engine/kernel.py", "wire/protocol.py"]
    assert back_and_forth(row["calls"]) == [("engine/kernel.py", "wire/protocol.py")]


def test_processes_are_named_by_role():
    assert role(dict(argv=["python"], name="RelayNode(0.1)")) == "relay node 0.1"
    assert role(dict(argv=["python", "-m", "ipyparallel_broadcast.controller"], name="MainProcess")) == "controller"
    assert role(dict(argv=["script.py"], name="MainProcess", client=True)) == "client"
