"""The hub hooked once (``controller.hubhooks``): a real ipyparallel ``Hub``
on real zmq sockets (nothing bound: no traffic), the controller's real parts,
and each hub method's hook asked the way the hub asks it."""

import logging

import pytest
import zmq
from ipyparallel.controller.hub import Hub
from jupyter_client.session import Session
from tornado.ioloop import IOLoop
from zmq.eventloop.zmqstream import ZMQStream

from ipyparallel_broadcast.controller.dropped import DroppedEngines
from ipyparallel_broadcast.controller.enginejournal import read
from ipyparallel_broadcast.controller.hostreg import HostRegistrations
from ipyparallel_broadcast.controller.hubhooks import HubHooks, HubParts
from ipyparallel_broadcast.controller.records import BroadcastDictDB, BroadcastRecords
from ipyparallel_broadcast.controller.restore import KeptEngines
from ipyparallel_broadcast.controller.roster import Roster, RosterDoor
from ipyparallel_broadcast.wire import protocol as P
from ipyparallel_broadcast.wire.topology import host_ident

pytestmark = pytest.mark.pure

HOOKED = HubHooks.METHODS


@pytest.fixture
def hooked(tmp_path):
    ctx, loop = zmq.Context(), IOLoop()
    streams = {
        name: ZMQStream(ctx.socket(kind), loop)
        for name, kind in (("query", zmq.ROUTER), ("monitor", zmq.SUB), ("notifier", zmq.PUB), ("resubmit", zmq.DEALER))
    }
    session = Session(key=b"k")
    hub = Hub(loop=loop, session=session, db=BroadcastDictDB(), registration_timeout=10, **streams)
    hub.log = logging.getLogger("test-hub")
    dropped = DroppedEngines(hub)
    kept = KeptEngines(hub, dropped, str(tmp_path / "engines.journal"))
    published = []
    door = RosterDoor(ctx.socket(zmq.XPUB), loop, Roster(session, engines=lambda: {}))
    hosts = HostRegistrations(hub, published.append, dropped, kept.ledger, door.held)
    kept.open(False, 10.0, hosts)
    placed = []
    parts = HubParts(lambda asked: placed.append(asked) or asked, dropped, hosts, kept, door, BroadcastRecords(hub))
    stock = {name: getattr(hub, name) for name in HOOKED}
    hooks = HubHooks(hub, parts)
    hooks.install()
    yield hub, hooks, stock, kept, placed
    kept.close()
    door.close(linger=0)
    for s in streams.values():
        s.close(linger=0)
    loop.close(all_fds=True)
    ctx.term()


def test_each_method_is_replaced_once_by_the_hooks_and_a_second_install_is_refused(hooked):
    hub, hooks, stock, _, _ = hooked
    for name in HOOKED:
        assert getattr(hub, name) == getattr(hooks, name) and hooks.stock[name] == stock[name]
    assert hub.query_handlers["unregistration_request"] == hooks.unregister_engine  # (files the records itself)
    assert hub.query_handlers[P.HOST_ENGINES].__wrapped__ == hooks.parts.hosts.on_batch
    assert hub.notifier is hooks.parts.door
    with pytest.raises(RuntimeError, match="once"):
        hooks.install()


def test_an_engine_granted_filed_and_unregistered_is_journaled_each_time_and_told_if_it_beats_again(hooked):
    hub, hooks, _, kept, placed = hooked
    eid = hub.register_engine([b"reg"], dict(content=dict(uuid="u0")))
    assert placed == [None] and read(kept.journal.path).granted == {eid: ("u0", None)}
    hub.handle_new_heart(b"u0")  # the hub's own: the registration finished
    assert hub.engines[eid].uuid == "u0" and read(kept.journal.path).engines == {eid: ("u0", None)}
    filed = []
    hooks.parts.records.journal.defer(lambda *_: filed.append(1), [P.OUTBUNDLE], [b"x"])
    hub.query_handlers["unregistration_request"]([b"u0"], dict(content=dict(id=eid)))
    assert filed == [1]  # the records were filed before the engine went
    state = read(kept.journal.path)
    assert state.engines == {} and state.dropped == {eid: ("u0", None)} and eid not in hub.ids
    assert hooks.parts.dropped.dropped == {b"u0": eid}
    hub.handle_new_heart(b"u0")  # it beats again: told to exit, and forgotten
    assert hooks.parts.dropped.dropped == {}


def test_a_grant_the_hub_purges_is_journaled_gone(hooked):
    hub, _, _, kept, _ = hooked
    eid = hub.register_engine([b"reg"], dict(content=dict(uuid="u1")))
    hub._purge_stalled_registration(b"u1")  # as the hub's own timeout calls it
    assert eid not in read(kept.journal.path).granted and b"u1" not in hub.incoming_registrations


def test_a_host_relays_heart_stands_for_its_engines_and_never_reaches_the_hubs_own_handlers(hooked):
    hub, hooks, _, kept, _ = hooked
    hosts = hooks.parts.hosts
    batch = dict(host="h1", engines=[dict(uuid="a"), dict(uuid="b")], gone=[], beating=[])
    hosts.on_batch([b"relay"], dict(header={}, content=batch))
    hosts.on_batch([b"relay"], dict(header={}, content=dict(batch, engines=[], beating=["a", "b"])))
    assert sorted(ec.uuid for ec in hub.engines.values()) == ["a", "b"]
    assert sorted(uuid for uuid, _ in read(kept.journal.path).engines.values()) == ["a", "b"]
    hub.handle_new_heart(host_ident("h1"))  # the relay's heart: not a registration the hub finishes
    assert len(hub.engines) == 2
    hub.handle_stopped_heart(host_ident("h1"))  # silent: its engines are lost, named
    assert hub.engines == {} and set(read(kept.journal.path).dropped.values()) == {("a", "h1"), ("b", "h1")}


def test_a_host_batch_is_on_disk_before_its_answer_leaves(hooked):
    """Group commit: a host relay's batch is journaled and synced, then answered;
    a batch that changes nothing costs no sync."""
    hub, hooks, _, kept, _ = hooked
    seen, send = [], hub.session.send

    def answering(stream, msg_type, *args, **kwargs):
        if msg_type == P.HOST_ENGINES_REPLY:
            seen.append((kept.journal.unsynced, sorted(u for u, _ in read(kept.journal.path).granted.values())))
        return send(stream, msg_type, *args, **kwargs)

    hub.session.send = answering
    hosts = hooks.parts.hosts
    batch = dict(host="h1", engines=[dict(uuid="a"), dict(uuid="b")], gone=[], beating=[])
    hosts.on_batch([b"relay"], dict(header={}, content=batch))
    hosts.on_batch([b"relay"], dict(header={}, content=dict(batch, engines=[], beating=["a", "b"])))
    hosts.on_batch([b"relay"], dict(header={}, content=dict(batch, engines=[])))
    assert seen == [(0, ["a", "b"]), (0, []), (0, [])]
    assert kept.journal.commits == 2


def test_a_silent_relay_takes_its_own_hosts_engines_and_no_other_hosts(hooked):
    """The engines of a host are found by its host (``DroppedEngines.hearts_via``),
    not by a scan of every engine, and a silent relay unregisters just those, in one notification."""
    hub, hooks, _, _, _ = hooked
    hosts, dropped = hooks.parts.hosts, hooks.parts.dropped
    for host, uuids in (("h1", ["a", "b"]), ("h2", ["c"])):
        batch = dict(host=host, engines=[dict(uuid=u) for u in uuids], gone=[], beating=[])
        hosts.on_batch([host.encode()], dict(header={}, content=batch))
        hosts.on_batch([host.encode()], dict(header={}, content=dict(batch, engines=[], beating=uuids)))
    assert sorted(dropped.hearts_via("h1")) == [b"a", b"b"] and dropped.hearts_via("h2") == [b"c"]
    seq = hooks.parts.door.roster.seq
    hub.handle_stopped_heart(host_ident("h1"))
    assert [ec.uuid for ec in hub.engines.values()] == ["c"]
    assert hooks.parts.door.roster.seq == seq + 1  # its two engines told in one notification
    assert not {b"a", b"b"} & set(hub.expect_stopped_hearts)  # no heart of their own will stop
    dropped.forget(b"c")
    assert dropped.hearts_via("h2") == [] and "h2" not in dropped.by_host
