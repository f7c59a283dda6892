"""The hub's engine-state file, written once per burst (``controller.statefile``)."""

import pytest

from ipyparallel_broadcast.controller.statefile import CoalescedWrites

pytestmark = pytest.mark.pure


def test_a_burst_of_changes_is_written_once_at_its_first_changes_deadline_and_the_next_burst_again():
    timers, written = [], []
    writes = CoalescedWrites(lambda: written.append(len(written)), lambda s, f: timers.append((s, f)), delay=1.0)
    for _ in range(1000):  # a thousand engines register
        writes.changed()
    assert written == [] and len(timers) == 1 and timers[0][0] == 1.0
    timers.pop()[1]()  # the loop runs the write
    assert written == [0] and (writes.changes, writes.writes) == (1000, 1)
    writes.changed()  # one more: a write of its own
    assert len(timers) == 1
    writes.flush()  # the controller exits first: written now, and the timer writes nothing more
    timers.pop()[1]()
    assert written == [0, 1]
    writes.flush()  # nothing due: no write
    assert written == [0, 1]


def test_a_connection_file_is_written_whole_and_private_from_its_first_byte(tmp_path):
    """``write_private_json`` replaces the file in one step (a reader sees the
    old one or the new one, never an empty one) with owner-only permissions,
    even over a temporary file a killed run left readable by all."""
    import json
    import os

    from ipyparallel_broadcast.controller.app import write_private_json

    path = tmp_path / "ipcontroller-client.json"
    path.write_text(json.dumps({"old": 1}))
    stale = tmp_path / f"ipcontroller-client.json.{os.getpid()}.tmp"
    stale.write_text("left behind")
    stale.chmod(0o644)
    write_private_json(str(path), {"key": "secret"})
    assert json.loads(path.read_text()) == {"key": "secret"}
    assert path.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ipcontroller-client.json"]
