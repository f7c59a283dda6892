"""A host relay's registrar without sockets (``relay.registrar``): engines
that ask together go to the hub in few batches, one in flight; each engine
gets ipyparallel's reply from the hub's one answer; a batch not answered is
sent again; departures and drop notices pass; malformed input is refused."""

import pytest
from jupyter_client.session import Session

from ipyparallel_broadcast.host.link import JOIN_TIMEOUT
from ipyparallel_broadcast.relay.registrar import ENGINES, HUB, REPLY_TIMEOUT, Registrar
from ipyparallel_broadcast.wire import protocol as P

pytestmark = pytest.mark.pure


class Clock:
    now = 100.0

    def __call__(self):
        return self.now


@pytest.fixture
def setup():
    session = Session(key=b"k")
    clock = Clock()
    return Registrar(P.Codec(session), "host-a", clock=clock), P.Codec(Session(key=b"k")), clock


def ask(codec, uuid, eid=None):
    content = dict(uuid=uuid) if eid is None else dict(uuid=uuid, id=eid)
    return [uuid.encode(), *codec.pack("registration_request", content)]


def unpack(codec, frames):
    return codec.unpack(P.split_idents(frames)[1])


def answer(codec, batch, first_id=0, refuse=()):
    engines = []
    for i, e in enumerate(batch["engines"]):
        if e["uuid"] in refuse:
            engines.append(dict(uuid=e["uuid"], status="error", ename="KeyError", evalue="in use"))
        else:
            engines.append(dict(uuid=e["uuid"], status="ok", id=first_id + i))
    content = dict(engines=engines, hb_period=3000, connection_info=dict(mux=1))
    return codec.pack(P.HOST_ENGINES_REPLY, content)


def test_engines_that_ask_together_register_in_two_batches(setup):
    reg, codec, _ = setup
    first = reg.from_engine(ask(codec, "e0"))
    assert [s.socket for s in first] == [HUB]
    for i in range(1, 50):  # while the first batch is in flight: they wait
        assert reg.from_engine(ask(codec, f"e{i}")) == []
    batch = unpack(codec, first[0].frames)["content"]
    assert batch["host"] == "host-a" and [e["uuid"] for e in batch["engines"]] == ["e0"]
    sends = reg.from_hub(answer(codec, batch))
    replies = [s for s in sends if s.socket == ENGINES]
    assert len(replies) == 1 and replies[0].frames[0] == b"e0"
    reply = unpack(codec, replies[0].frames)
    assert reply["header"]["msg_type"] == "registration_reply"
    assert reply["content"] == dict(status="ok", id=0, hb_period=3000, connection_info=dict(mux=1))
    (second,) = [s for s in sends if s.socket == HUB]
    batch = unpack(codec, second.frames)["content"]
    assert len(batch["engines"]) == 49
    sends = reg.from_hub(answer(codec, batch, first_id=1))
    assert len(sends) == 49 and reg.batches == 2 and reg.engines_registered == 50
    assert sorted(unpack(codec, s.frames)["content"]["id"] for s in sends) == list(range(1, 50))


def test_a_refusal_reaches_its_engine_and_an_unanswered_one_waits_for_the_next_batch(setup):
    reg, codec, _ = setup
    reg.from_engine(ask(codec, "a"))
    reg.from_hub(answer(codec, dict(engines=[dict(uuid="a")])))
    (out,) = reg.from_engine(ask(codec, "b", eid=7))
    batch = unpack(codec, out.frames)["content"]
    assert batch["engines"] == [dict(uuid="b", id=7)]
    reg.from_engine(ask(codec, "c"))
    sends = reg.from_hub(answer(codec, dict(engines=[]), refuse=()))  # b not answered
    assert [s.socket for s in sends] == [HUB]
    batch = unpack(codec, sends[0].frames)["content"]
    assert {e["uuid"] for e in batch["engines"]} == {"b", "c"}
    sends = reg.from_hub(answer(codec, batch, refuse={"b"}))
    by_engine = {s.frames[0]: unpack(codec, s.frames)["content"] for s in sends}
    assert by_engine[b"b"]["status"] == "error" and by_engine[b"c"]["status"] == "ok"
    assert "hb_period" not in by_engine[b"b"]


def test_a_batch_not_answered_in_time_is_sent_again(setup):
    reg, codec, clock = setup
    (out,) = reg.from_engine(ask(codec, "a"))
    assert reg.on_tick() == [] and reg.next_deadline() == clock.now + REPLY_TIMEOUT
    clock.now += REPLY_TIMEOUT
    (again,) = reg.on_tick()
    assert unpack(codec, again.frames)["content"]["engines"] == [dict(uuid="a", id=None)]


def test_departures_go_up_and_a_drop_notice_comes_down(setup):
    reg, codec, _ = setup
    (out,) = reg.from_engine(ask(codec, "a"))
    reg.from_hub(answer(codec, unpack(codec, out.frames)["content"], first_id=5))
    (gone,) = reg.from_engine([b"nanny", *codec.pack("unregistration_request", dict(id=5))])
    assert unpack(codec, gone.frames)["content"]["gone"] == ["a"]
    reg.from_hub(answer(codec, dict(engines=[])))
    (notice,) = reg.from_hub(codec.pack(P.DROPPED, dict(uuid="x")))
    assert notice.socket == ENGINES and notice.frames[0] == b"x"
    assert unpack(codec, notice.frames)["header"]["msg_type"] == P.DROPPED


@pytest.mark.parametrize(
    "frames",
    [
        lambda c: [b"e", *c.pack("registration_request", dict(id=1))],  # no uuid
        lambda c: [b"e", *c.pack("registration_request", dict(uuid="u", id="one"))],
        lambda c: [b"e", *c.pack("execute_request", dict(code="1"))],
        lambda c: [b"e", *Session(key=b"forged").serialize(Session(key=b"forged").msg("registration_request"))],
    ],
)
def test_malformed_or_forged_requests_are_refused(setup, frames):
    reg, codec, _ = setup
    with pytest.raises(P.ProtocolError):
        reg.from_engine(frames(codec))
    assert reg.waiting == {} and reg.sent == {}


def test_hearts_that_began_to_beat_go_up_in_the_next_batch(setup):
    reg, codec, _ = setup
    (out,) = reg.from_engine(ask(codec, "a"))
    assert reg.beating(["a"]) == []  # a batch is in flight: it waits
    (nxt,) = reg.from_hub(answer(codec, unpack(codec, out.frames)["content"]))[1:]
    assert unpack(codec, nxt.frames)["content"]["beating"] == ["a"]
    reg.lost(["a"])  # gone before its beat went up: never said to beat
    reg.from_hub(answer(codec, dict(engines=[])))
    assert reg.beats == set() and reg.sent_at is not None  # (the departure went)


def test_engines_count_as_registering_until_they_join_or_could_no_longer(setup):
    """A relay with no engine but these must not exit: their registrations
    would go with it, unanswered (a farm of 64 hosts lost engines so)."""
    reg, codec, clock = setup
    assert not reg.registering()
    (first,) = reg.from_engine(ask(codec, "a"))
    assert reg.from_engine(ask(codec, "b")) == []
    assert reg.registering()  # a in flight, b waiting
    sends = reg.from_hub(answer(codec, unpack(codec, first.frames)["content"]))
    (second,) = [s for s in sends if s.socket == HUB]  # b's batch
    reg.joined(["a"])
    assert reg.registering()  # b in flight
    reg.from_hub(answer(codec, unpack(codec, second.frames)["content"], first_id=1))
    assert reg.registering()  # b granted, not joined yet
    reg.joined(["b"])
    assert not reg.registering()
    (third,) = reg.from_engine(ask(codec, "c"))
    reg.from_hub(answer(codec, unpack(codec, third.frames)["content"], first_id=2))
    (departure,) = reg.lost(["c"])  # gone before it joined
    assert not reg.registering()
    assert reg.from_engine(ask(codec, "d")) == []  # after the departure's answer
    (fourth,) = reg.from_hub(answer(codec, unpack(codec, departure.frames)["content"]))
    reg.from_hub(answer(codec, unpack(codec, fourth.frames)["content"], first_id=3))
    clock.now += JOIN_TIMEOUT
    assert reg.registering()
    clock.now += 1
    assert not reg.registering()  # d never joined: it died, or gave up
    reg.from_engine(ask(codec, "e"))  # and a hub that never answers
    clock.now += JOIN_TIMEOUT
    assert reg.registering()
    clock.now += 1
    assert not reg.registering()


def test_engines_that_join_while_others_register_go_to_the_leaf_in_one_announcement():
    """A host relay announces the engines that joined once none of its host is
    still registering, or ``window`` after the first join: one route up the
    tree and back for a batch, not one per engine (64 hosts of 64 engines: 2,535
    announcements, then 923)."""
    from ipyparallel_broadcast.relay.joinbatch import JoinBatch

    batch = JoinBatch(window=0.25)
    assert not batch and batch.take(0.0, registering=False) == []
    batch.add((0, "a", [b"a"], None), now=1.0)
    batch.add((1, "b", [b"b"], None), now=1.1)
    assert batch.due == 1.25 and batch.take(1.2, registering=True) == []  # others still registering
    assert [e[1] for e in batch.take(1.2, registering=False)] == ["a", "b"]  # none: at once
    assert not batch and batch.due is None
    batch.add((2, "c", [b"c"], None), now=2.0)
    assert batch.take(2.2, registering=True) == []
    assert [e[1] for e in batch.take(2.25, registering=True)] == ["c"]  # held no longer than the window
