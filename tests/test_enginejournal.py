"""The hub's engine journal (``controller.enginejournal``): a line per
change, read back whole by a restarted controller, rewritten when mostly
dead; and the controller's keeper's verdicts (``launch.keeper``)."""

import json
import logging

import pytest

from ipyparallel_broadcast.controller.enginejournal import EngineJournal, JournaledEngines, JournalState, read

pytestmark = pytest.mark.pure


class EC:
    def __init__(self, eid, uuid):
        self.id, self.uuid, self.ident = eid, uuid, uuid.encode()


def test_lines_make_the_table_and_a_torn_last_line_is_skipped():
    state = JournalState()
    for line in [
        JournalState.filed(0, "a", None),
        JournalState.filed(1, "b", "host1"),
        JournalState.filed(2, "c", "host1"),
        JournalState.gone(1),
        '{"e": 3, "u": "d", "h"',  # the controller killed mid-write
    ]:
        state.read(line)
    assert state.engines == {0: ("a", None), 2: ("c", "host1")}
    assert (state.top, state.bad) == (2, 1)


def test_a_restart_reads_back_what_a_killed_controller_wrote(tmp_path):
    path = str(tmp_path / "engines.journal")
    journal = EngineJournal(path)
    journal.restore(keep=False)
    hosts = {b"u1": "h1"}
    engines = JournaledEngines(journal, hosts.get, lambda: None)
    engines[0], engines[1], engines[2] = EC(0, "u0"), EC(1, "u1"), EC(2, "u2")
    engines.pop(2)
    engines.pop(7, None)  # not there: nothing written
    del engines[0]
    # no close: as after a SIGKILL, what was written is in the file
    again = EngineJournal(path).restore(keep=True)
    assert again.engines == {1: ("u1", "h1")} and again.top == 2


def test_a_fresh_start_empties_the_journal(tmp_path):
    path = str(tmp_path / "engines.journal")
    journal = EngineJournal(path)
    journal.restore(keep=False)
    journal.filed(0, "u0", None)
    journal.close()
    assert EngineJournal(path).restore(keep=False).engines == {}
    assert EngineJournal(path).restore(keep=True).engines == {}


def test_a_journal_of_mostly_departed_engines_is_rewritten_and_keeps_the_top_id(tmp_path):
    path = str(tmp_path / "engines.journal")
    journal = EngineJournal(path)
    journal.restore(keep=False)
    for eid in range(500):  # churn: each engine comes and goes
        journal.filed(eid, f"u{eid}", "h")
        journal.gone(eid)
    journal.filed(500, "last", None)
    with open(path) as f:
        lines = f.readlines()
    assert journal.rewrites > 1 and len(lines) < 100  # bounded by the live table, not by history
    state = read(path)
    assert state.engines == {500: ("last", None)} and state.top == 500
    journal.gone(500)
    journal.close()
    state = EngineJournal(path).restore(keep=True)
    assert state.engines == {} and state.top == 500  # a new engine gets no id an old one had
    assert all(json.loads(line) for line in open(path))


class Launcher:
    """The keeper's verdicts need only its settings and a log."""

    def __init__(self, restarts, window=60.0):
        from ipyparallel_broadcast.launch.keeper import ControllerKeeping

        class Keeping(ControllerKeeping):
            log = logging.getLogger("test")

            def _keep(self, process):  # no process watched here
                pass

        self.keeper = Keeping(controller_restarts=restarts, controller_restart_window=window)
        self.keeper.keep(type("P", (), {"pid": 1})())


def test_the_keeper_restarts_within_its_budget_once_per_process_and_never_after_a_stop():
    keeper = Launcher(restarts=2).keeper
    assert keeper.restarting(100, {}) and keeper.restarting(100, {})  # asked twice: one verdict
    assert keeper.restarting(101, {})
    assert not keeper.restarting(102, {}) and keeper.gave_up  # a third within the window
    stopped = Launcher(restarts=2).keeper
    stopped.asked_to_stop()
    assert not stopped.restarting(100, {}) and not stopped.gave_up
    assert not Launcher(restarts=0).keeper.restarting(100, {})
