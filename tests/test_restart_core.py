"""The pure parts of a controller restart: the hub's engine journal
(``controller.enginejournal``), a line per change, read back whole by a
restarted controller and rewritten when mostly dead; the keeper's
verdicts (``launch.keepsettings``); a keeper that adopts a running
controller, and the keeper file that names it (issue 73)."""

import json
import logging
import os
import stat
import subprocess
import sys

import pytest

from ipyparallel_broadcast.controller.enginejournal import EngineJournal, EngineLedger, JournalState, read
from ipyparallel_broadcast.launch.keepsettings import RESTORE_ARGS, Verdicts

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
    hosts, changes = {b"u1": "h1"}, []
    ledger = EngineLedger(journal, hosts.get, lambda: changes.append(1))
    for eid in range(3):
        ledger.filed(EC(eid, f"u{eid}"))
    ledger.dropped(EC(2, "u2"))
    ledger.dropped(EC(0, "u0"))
    assert len(changes) == 5  # each change asks for a sync
    # no close: as after a SIGKILL, what was written is in the file
    again = EngineJournal(path).restore(keep=True)
    assert again.engines == {1: ("u1", "h1")} and again.top == 2


def test_a_grant_is_kept_until_its_engine_is_filed_or_gone(tmp_path):
    """An id granted whose engine has not beaten yet is journaled too: after a
    restart that engine is filed when it beats (``{"g": ...}`` lines)."""
    path = str(tmp_path / "engines.journal")
    journal = EngineJournal(path)
    journal.restore(keep=False)
    hosts = {b"u1": "h1"}
    ledger = EngineLedger(journal, hosts.get, lambda: None)
    for eid in range(3):
        ledger.granted(EC(eid, f"u{eid}"))
    ledger.filed(EC(0, "u0"))  # beat: filed
    ledger.withdrawn(EC(2, "u2"))  # set aside
    state = read(path)
    assert state.engines == {0: ("u0", None)} and state.granted == {1: ("u1", "h1")} and state.top == 2
    journal.close()
    assert EngineJournal(path).restore(keep=True).granted == {1: ("u1", "h1")}  # and after a rewrite
    assert read(path).granted == {1: ("u1", "h1")}


def test_an_engine_unregistered_is_remembered_as_dropped_and_the_oldest_drops_are_forgotten(tmp_path):
    """A dropped engine that lives on is told so, after a restart too: the
    journal keeps the last ``DROPS_KEPT`` drops, with their hosts."""
    from ipyparallel_broadcast.controller import enginejournal

    path = str(tmp_path / "engines.journal")
    journal = EngineJournal(path)
    journal.restore(keep=False)
    hosts = {b"u1": "h1"}
    ledger = EngineLedger(journal, hosts.get, lambda: None)
    ledger.filed(EC(0, "u0"))
    ledger.filed(EC(1, "u1"))
    ledger.dropped(EC(1, "u1"))
    state = read(path)
    assert state.engines == {0: ("u0", None)} and state.dropped == {1: ("u1", "h1")}
    assert EngineJournal(path).restore(keep=True).dropped == {1: ("u1", "h1")}  # kept by a rewrite
    many = JournalState()
    for eid in range(enginejournal.DROPS_KEPT + 10):
        many.read(JournalState.filed(eid, f"u{eid}", None, "d"))
    assert len(many.dropped) == enginejournal.DROPS_KEPT and min(many.dropped) == 10


def test_a_fresh_start_empties_the_journal(tmp_path):
    path = str(tmp_path / "engines.journal")
    journal = EngineJournal(path)
    journal.restore(keep=False)
    journal.filed(0, "u0", None)
    journal.close()
    assert EngineJournal(path).restore(keep=False).engines == {}
    assert EngineJournal(path).restore(keep=True).engines == {}


def test_a_journal_of_mostly_departed_engines_is_rewritten_and_keeps_the_top_id(tmp_path):
    from ipyparallel_broadcast.controller.enginejournal import DROPS_KEPT, SLACK

    path = str(tmp_path / "engines.journal")
    journal = EngineJournal(path)
    journal.restore(keep=False)
    for eid in range(3 * DROPS_KEPT):  # churn: each engine comes and goes (and a grant is withdrawn)
        journal.filed(eid, f"u{eid}", "h", "g")
        journal.gone(eid)
        journal.filed(eid, f"u{eid}", "h")
        journal.filed(eid, f"u{eid}", "h", "d")
    last = 3 * DROPS_KEPT
    journal.filed(last, "last", None)
    with open(path) as f:
        lines = f.readlines()
    assert journal.rewrites > 1 and len(lines) <= 2 * (DROPS_KEPT + 1) + SLACK  # bounded, not by history
    state = read(path)
    assert state.engines == {last: ("last", None)} and state.top == last and len(state.dropped) == DROPS_KEPT
    journal.filed(last, "last", None, "d")
    journal.close()
    state = EngineJournal(path).restore(keep=True)
    assert state.engines == {} and state.top == last  # a new engine gets no id an old one had
    assert all(json.loads(line) for line in open(path))


def test_the_journal_is_its_owners_alone_whatever_the_umask_and_after_a_rewrite(tmp_path):
    """It names every engine of the cluster: mode 0600, even under umask 0, over a
    file an older version left world-readable, and after each rewrite."""
    path = tmp_path / "engines.journal"
    path.write_text('{"e":0,"u":"u0","h":null}\n')
    path.chmod(0o644)
    old = os.umask(0)
    try:
        journal = EngineJournal(str(path))
        assert journal.restore(keep=True).engines == {0: ("u0", None)}
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        rewrites = journal.rewrites
        while journal.rewrites == rewrites:  # churn until it is rewritten whole
            journal.filed(1, "u1", None, "g")
            journal.gone(1)
    finally:
        os.umask(old)
    journal.close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not (tmp_path / "engines.journal.tmp").exists()


def test_a_committed_batch_is_synced_once_and_a_batch_with_nothing_new_is_not(tmp_path):
    journal = EngineJournal(str(tmp_path / "engines.journal"))
    journal.restore(keep=False)
    with journal.batch(commit=True):
        for eid in range(3):
            journal.filed(eid, f"u{eid}", "h", "g")
    assert (journal.commits, journal.unsynced) == (1, 0)
    with journal.batch(commit=True):
        pass
    with journal.batch():  # (not committed: synced later, once per burst)
        journal.filed(0, "u0", "h")
    assert (journal.commits, journal.unsynced) == (1, 1)
    journal.sync()
    assert journal.unsynced == 0
    journal.close()


def test_the_keeper_restarts_within_its_budget_and_never_after_a_stop_or_exit_0():
    log = logging.getLogger("test")
    killed = dict(exit_code=-9)
    verdicts = Verdicts(2, 60.0, log)
    assert verdicts.restarting(killed)
    assert not verdicts.restarting(dict(exit_code=0))  # shut down on purpose
    assert not verdicts.restarting(killed, came_up=False)  # never came up: a bad setting
    assert verdicts.restarting(killed)
    assert not verdicts.restarting(killed) and verdicts.gave_up  # a third within the window
    stopped = Verdicts(2, 60.0, log)
    stopped.stop_asked = True
    assert not stopped.restarting(killed) and not stopped.gave_up
    assert not Verdicts(0, 60.0, log).restarting(killed)
    now = [0.0]
    later = Verdicts(1, 60.0, log, clock=lambda: now[0])
    assert later.restarting(killed) and not later.restarting(killed)
    now[0] = 61.0  # a kill now and then over a long life: always restarted
    assert later.restarting(killed)


# a stand-in controller for the keeper: records its argv, says "up" unless told not to, then dies by SIGKILL
STAND_IN = """
import os, signal, sys
with open(sys.argv[1], "a") as f:
    f.write(" ".join(sys.argv[2:]) + "\\n")
if "--mute" not in sys.argv:
    os.write(int(os.environ["IPB_CONTROLLER_UP_FD"]), b"up")
os.kill(os.getpid(), signal.SIGKILL)
"""


def keep(tmp_path, *args):
    runs = tmp_path / "runs"
    cmd = [sys.executable, "-m", "ipyparallel_broadcast.launch.keeper", "--restarts=2", "--window=60", "--"]
    done = subprocess.run([*cmd, sys.executable, "-c", STAND_IN, str(runs), *args], capture_output=True, timeout=60)
    return done.returncode, runs.read_text().splitlines(), done.stderr.decode()


def test_the_keeper_restarts_a_killed_controller_with_restore_until_its_budget_is_spent(tmp_path):
    code, runs, err = keep(tmp_path, "--x=1")
    assert code == 128 + 9
    assert runs == ["--x=1", "--x=1 " + " ".join(RESTORE_ARGS), "--x=1 " + " ".join(RESTORE_ARGS)]
    assert "giving up" in err


def test_the_keeper_does_not_restart_a_controller_that_never_came_up(tmp_path):
    code, runs, _ = keep(tmp_path, "--mute")
    assert code == 128 + 9 and runs == ["--mute"]


def adopt(tmp_path, journal: bool):
    """A keeper adopting a running process (its keeper died): that one ends,
    killed (``journal`` left: a crash) or after an orderly stop (none)."""
    runs, path = tmp_path / "runs", tmp_path / "engines.journal"
    if journal:
        path.write_text("")
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    cmd = [sys.executable, "-m", "ipyparallel_broadcast.launch.keeper", "--restarts=1", "--window=60"]
    cmd += [f"--adopt={running.pid}", f"--journal={path}", "--", sys.executable, "-c", STAND_IN, str(runs)]
    keeper = subprocess.Popen(cmd, stderr=subprocess.PIPE)
    try:
        running.kill()
        running.wait()
        code = keeper.wait(60)
    finally:
        keeper.kill()
    return code, runs.read_text().splitlines() if runs.exists() else [], keeper.stderr.read().decode()


def test_a_keeper_that_adopted_a_controller_restarts_it_with_restore_once_it_dies(tmp_path):
    code, runs, err = adopt(tmp_path, journal=True)
    assert runs == [" ".join(RESTORE_ARGS)] and code == 128 + 9  # then the stand-in dies, past the budget
    assert "Keeping the running controller" in err and "giving up" in err


def test_a_keeper_that_adopted_a_controller_stopped_in_order_ends_with_it(tmp_path):
    code, runs, _ = adopt(tmp_path, journal=False)
    assert code == 0 and runs == []


def test_the_keeper_file_names_who_keeps_the_controller_and_a_controller_not_kept_says_none(tmp_path):
    from ipyparallel_broadcast.controller.keeperwatch import KeeperWatch
    from ipyparallel_broadcast.controller.restarts import keeper_file, read_keeper_file, write_keeper_file

    path = keeper_file(str(tmp_path), "c1")
    assert path.endswith(os.path.join("pid", "ipb-keeper-c1.json")) and read_keeper_file(path) == {}
    write_keeper_file(path, 12, 34)
    assert read_keeper_file(path) == dict(keeper=12, controller=34)
    alone = KeeperWatch(logging.getLogger("test"), None, path, str(tmp_path / "journal"))
    assert alone.facts["keeper"] is None
    alone.lost()  # not kept: nothing to start, and it says so
    assert read_keeper_file(path) == dict(keeper=None, controller=os.getpid())
    kept = KeeperWatch(logging.getLogger("test"), dict(restarts=2, window=9.0, cmd=["ctl", "--x"]), path, "j")
    argv = kept.command()
    assert argv[argv.index("--") + 1 :] == ["ctl", "--x"]
    assert f"--adopt={os.getpid()}" in argv and "--journal=j" in argv and "--restarts=2" in argv
    alone.stop()
    assert not os.path.exists(path)
