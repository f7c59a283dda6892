"""The engine roster without sockets (``controller.roster``, ``client.roster``):
a client that connects at any moment of any history of registrations and
unregistrations ends with the hub's table, whatever its subscription missed
before it was live, and whatever notification is lost after; a stock client
is sent every registration it may have missed."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jupyter_client.session import Session

from ipyparallel_broadcast.client.roster import REGISTERED, UNREGISTERED, RosterSync
from ipyparallel_broadcast.controller.roster import DELIM, Roster, UnmatchedReplies
from ipyparallel_broadcast.wire import protocol as P
from ipyparallel_broadcast.wire.naming import ROSTER_HELLO_PREFIX

pytestmark = pytest.mark.pure


class Pipe:
    """One subscriber of the XPUB: its applied topics, and what reached it."""

    def __init__(self):
        self.topics: set[bytes] = set()
        self.inbox: list[list[bytes]] = []

    def offer(self, frames):
        if any(frames[0].startswith(t) for t in self.topics):
            self.inbox.append(frames)


class Hub:
    """The hub's table and its roster; pipes as the XPUB has them."""

    def __init__(self):
        self.session = Session(key=b"secret")
        self.engines: dict[int, str] = {}
        self.roster = Roster(self.session, engines=lambda: dict(self.engines))
        self.pipes: list[Pipe] = []
        self.ids = itertools.count()

    def publish(self, kind, eid, uuid):
        msg = self.session.msg(kind, content=dict(id=eid, uuid=uuid))
        frames = self.roster.stamp(self.session.serialize(msg))
        for pipe in self.pipes if frames is not None else ():  # (None: held for a batch)
            pipe.offer(frames)

    def register(self):
        eid = next(self.ids)
        self.engines[eid] = f"uuid-{eid}"
        self.publish(REGISTERED, eid, self.engines[eid])

    def register_host(self, k):
        """A host relay's batch of engines (``controller.hostreg``): one notification."""
        batch = {}
        for _ in range(1 + k % 5):
            eid = next(self.ids)
            batch[eid] = self.engines[eid] = f"uuid-{eid}"
        for frames in self.roster.registrations(batch):
            for pipe in self.pipes:
                pipe.offer(frames)

    def lose_host(self, k):
        """A silent host relay's engines (``hostreg.unregister``): the hub's
        unregistrations held, told in one notification."""
        self.roster.hold()
        for _ in range(1 + k % 4):
            self.unregister(k)
        for frames in self.roster.unregistrations():
            for pipe in self.pipes:
                pipe.offer(frames)

    def run(self, steps):
        for op, k in steps:
            {"r": lambda k: self.register(), "u": self.unregister, "h": self.register_host, "l": self.lose_host}[op](k)

    def unregister(self, k):
        if self.engines:
            eid = sorted(self.engines)[k % len(self.engines)]
            self.publish(UNREGISTERED, eid, self.engines.pop(eid))

    def subscribe(self, pipe, topic):
        for action, arg in self.roster.subscription(b"\x01" + topic):
            if action == "send":
                pipe.offer(arg)
            elif action == "subscribe":
                pipe.topics.add(arg)
            else:
                pipe.topics.discard(arg)


class OurClient:
    def __init__(self, hub):
        self.hub, self.pipe = hub, Pipe()
        self.reader = Session(key=b"secret")  # its own: a session refuses a signature it saw
        hub.roster.replied()
        self.sync = RosterSync(dict(hub.engines))
        self.asks = 0
        hub.pipes.append(self.pipe)

    def subscribe_all(self):
        self.hub.subscribe(self.pipe, b"")
        self.hub.subscribe(self.pipe, P.OURS_TOPIC)  # as ours do: batches, not stock copies

    def hello(self):
        self.asks += 1
        self.hub.subscribe(self.pipe, ROSTER_HELLO_PREFIX + f"client:{self.asks}".encode())

    def read(self, lose=None):
        """Everything that reached it (the ``lose``-th message, if given, lost on the way)."""
        inbox, self.pipe.inbox = self.pipe.inbox, []
        for i, frames in enumerate(inbox):
            if i == lose:
                continue
            _, body = self.reader.feed_identities(frames)
            msg = self.reader.deserialize(body)
            assert frames[0] != P.STOCK_TOPIC  # ours read batches, never the stock copies
            changes = self.sync.read(msg)
            if ("ask",) in changes:
                self.hello()


class StockClient(OurClient):
    """Files notifications as ipyparallel's client does: no numbers, no roster."""

    def read(self, lose=None):
        for frames in self.pipe.inbox:
            _, body = self.reader.feed_identities(frames)
            msg = self.reader.deserialize(body)
            assert msg["header"]["msg_type"] in (REGISTERED, UNREGISTERED)  # a hello never reaches it
            eid, uuid = msg["content"]["id"], msg["content"]["uuid"]
            if msg["header"]["msg_type"] == REGISTERED:
                self.sync.engines[eid] = uuid
            else:
                self.sync.engines.pop(eid, None)
        self.pipe.inbox = []


ops = st.lists(st.tuples(st.sampled_from("ruhl"), st.integers(0, 50)), max_size=40)


@settings(max_examples=300, deadline=None)
@given(before=ops, missed=ops, between=ops, after=ops, lose=st.one_of(st.none(), st.integers(0, 40)))
def test_a_client_that_connects_at_any_moment_ends_whole(before, missed, between, after, lose):
    """Registrations before it connects, while its subscription is not live
    (all missed), between its subscription and its hello, and after it (one
    lost on the way: the gap is seen and a new roster asked for)."""
    hub = Hub()
    run = hub.run
    run(before)
    client = OurClient(hub)
    run(missed)  # nothing reaches it: no subscription is applied yet
    client.subscribe_all()
    run(between)
    client.hello()
    client.read()
    run(after)
    client.read(lose=lose)
    run([("r", 0)])  # a later notification shows a gap at the end, if the lost one was last
    client.read()
    client.read()  # (the new roster, if asked)
    assert client.sync.engines == hub.engines
    assert client.sync.seq == hub.roster.seq


@settings(max_examples=300, deadline=None)
@given(
    history=ops,
    order=st.lists(st.tuples(st.integers(0, 4), st.sampled_from(("reply", "subscribe")), ops), max_size=30),
)
def test_stock_clients_are_sent_every_registration_they_missed(history, order):
    """Stock clients connect in any interleaving (each replies, then
    subscribes), engines register and unregister meanwhile: every engine
    registered at the end is in every subscribed stock client's table."""
    hub = Hub()
    hub.run(history)
    clients: dict[int, StockClient] = {}
    subscribed = set()
    for who, step, steps in order:
        if step == "reply" and who not in clients:
            clients[who] = StockClient(hub)
        elif step == "subscribe" and who in clients and who not in subscribed:
            hub.subscribe(clients[who].pipe, b"")
            subscribed.add(who)
        hub.run(steps)
    for who in subscribed:
        clients[who].read()
        table = clients[who].sync.engines
        assert {e: table.get(e) for e in hub.engines} == hub.engines


@given(st.lists(st.sampled_from(("reply", "subscribe", "notify")), max_size=60))
def test_each_subscriber_is_replayed_from_no_later_than_its_own_reply(steps):
    """Subscriptions come in any order after their replies: each takes a
    number no later than its own client's reply."""
    replies, seq, waiting = UnmatchedReplies(), 0, []
    for step in steps:
        if step == "notify":
            seq += 1
        elif step == "reply":
            replies.add(seq, now=0.0)
            waiting.append(seq)
        elif waiting:
            own = waiting.pop(len(waiting) // 2)  # any client that replied may subscribe next
            assert replies.take(now=1.0) <= own


def test_a_reply_never_matched_is_forgotten_after_its_window():
    """A reply whose client never subscribes (it died, or subscribed first)
    stayed the oldest for good: every later subscriber was replayed from it."""
    replies = UnmatchedReplies(window=60)
    replies.add(0, now=0.0)  # never matched
    replies.add(7, now=100.0)
    assert replies.take(now=100.5) == 7
    assert replies.take(now=101.0) is None


def test_a_stamp_is_signed_numbered_and_kept_by_a_stock_reader():
    hub = Hub()
    pipe = Pipe()
    hub.pipes.append(pipe)
    hub.subscribe(pipe, b"")
    assert pipe.topics == {DELIM, P.STOCK_TOPIC}
    hub.register()
    hub.register()
    metas = [hub.session.deserialize(hub.session.feed_identities(f)[1])["metadata"] for f in pipe.inbox]
    assert [m[P.SEQ_KEY] for m in metas] == [1, 2]
    assert metas[0][P.EPOCH_KEY] == hub.roster.epoch


def test_a_forged_stamp_is_refused():
    hub = Hub()
    msg = hub.session.msg(REGISTERED, content=dict(id=0, uuid="x"))
    frames = hub.roster.stamp(hub.session.serialize(msg))
    at = frames.index(DELIM)
    frames[at + 4] = frames[at + 4].replace(b"1", b"9")
    with pytest.raises(ValueError):
        Session(key=b"other").deserialize(frames[at + 1 :])
    with pytest.raises(ValueError):
        hub.session.deserialize(frames[at + 1 :])


def test_hellos_and_replays_go_to_their_subscriber_alone():
    hub = Hub()
    for _ in range(3):
        hub.register()
    early = Pipe()
    hub.pipes.append(early)
    hub.subscribe(early, b"")  # no reply outstanding: nothing replayed
    assert early.inbox == []
    late = StockClient(hub)
    hub.register()  # missed by `late`, whose subscription is not live
    hub.subscribe(late.pipe, b"")
    assert len(late.pipe.inbox) == 1 and early.inbox and len(early.inbox) == 1
    ours = OurClient(hub)
    ours.subscribe_all()
    ours.pipe.inbox.clear()
    ours.hello()
    assert len(ours.pipe.inbox) == 1 and len(early.inbox) == 1 and len(late.pipe.inbox) == 1
    ours.hello()  # a second hello: a topic of its own again
    assert len(ours.pipe.inbox) == 2 and len(early.inbox) == 1 and len(late.pipe.inbox) == 1
    shared = {DELIM, P.STOCK_TOPIC, P.BATCH_TOPIC}
    assert len({t for p in (ours.pipe, late.pipe) for t in p.topics} - shared) == 3  # no other topic shared


def test_sync_changes_are_real_ones():
    sync = RosterSync({0: "a"})
    assert sync.notification([(REGISTERED, 0, "a")]) == []
    assert sync.notification([(UNREGISTERED, 5, "z")]) == []  # never known: nothing to tell
    assert sync.roster({"0": "a", "1": "b"}, 4, "e") == [("register", 1, "b")]
    assert sync.notification([(REGISTERED, 2, "c")], 5, "e") == [("register", 2, "c")]
    assert sync.notification([(REGISTERED, 2, "c")], 5, "e") == []  # counted in already
    assert sync.notification([(UNREGISTERED, 0, "a")], 7, "e") == [("unregister", 0, "a"), ("ask",)]
    assert sync.notification([(REGISTERED, 3, "d")], 1, "other") == [("register", 3, "d")]  # asking: no second ask
    assert sync.roster({"1": "b", "2": "c", "3": "d"}, 1, "other") == []
    assert sync.notification([(REGISTERED, 4, "e")], 1, "restarted") == [("register", 4, "e"), ("ask",)]
    assert sync.gaps == 2


def test_a_host_batch_is_one_notification_and_stock_copies_only_for_stock_subscribers():
    hub = Hub()
    ours = OurClient(hub)
    ours.subscribe_all()
    ours.hello()
    ours.read()
    assert hub.roster.stock == 0
    hub.register_host(4)  # 5 engines
    assert len(ours.pipe.inbox) == 1  # one notification, no copy made for nobody
    ours.read()
    assert ours.sync.engines == hub.engines and ours.sync.seq == hub.roster.seq == 1
    stock = StockClient(hub)
    hub.subscribe(stock.pipe, b"")
    assert hub.roster.stock == 1
    hub.register_host(2)  # 3 engines
    assert [f[0] for f in stock.pipe.inbox[-3:]] == [P.STOCK_TOPIC] * 3 and len(ours.pipe.inbox) == 1
    seqs = {hub.session.deserialize(hub.session.feed_identities(f)[1])["metadata"][P.SEQ_KEY] for f in stock.pipe.inbox}
    assert seqs >= {2}  # the copies carry their batch's number
    stock.read()
    ours.read()
    assert stock.sync.engines == ours.sync.engines == hub.engines and ours.sync.gaps == 0


def test_a_lost_hosts_engines_are_one_notification_and_stock_copies_only_for_stock_subscribers():
    hub = Hub()
    hub.register_host(4)  # 5 engines
    ours, stock = OurClient(hub), StockClient(hub)
    ours.subscribe_all()
    ours.hello()
    ours.read()
    seq = hub.roster.seq
    hub.lose_host(2)  # 3 engines, no stock subscriber yet
    assert len(ours.pipe.inbox) == 1 and hub.roster.seq == seq + 1
    ours.read()
    assert ours.sync.engines == hub.engines and len(hub.engines) == 2
    hub.subscribe(stock.pipe, b"")
    stock.pipe.inbox.clear()
    stock.sync.engines = dict(hub.engines)
    hub.lose_host(1)  # 2 engines
    assert [f[0] for f in stock.pipe.inbox] == [P.STOCK_TOPIC] * 2 and len(ours.pipe.inbox) == 1
    stock.read()
    ours.read()
    assert stock.sync.engines == ours.sync.engines == hub.engines == {} and ours.sync.gaps == 0
    hub.roster.hold()
    assert hub.roster.unregistrations() == []  # nothing held: nothing told
