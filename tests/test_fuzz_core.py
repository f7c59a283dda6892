"""Bad input at every node position, in the pure core: malformed, unsigned,
wrongly signed, replayed and signed-but-nonsense messages are dropped, never
raise, leave no state behind, and valid traffic still flows afterwards."""

import json
import random

import pytest
from jupyter_client.session import Session
from treesim import TreeSim

from ipyparallel_broadcast.wire import protocol as P
from ipyparallel_broadcast.wire.topology import node_identity

pytestmark = pytest.mark.pure

ENGINES = list(range(7))
FUZZ_MESSAGES = 10_000  # per tree shape
NONSENSE = [None, 0, -1, 2**70, 1.5, "x", "", [], {}, [1, 1], [-3], ["a"], [[0]], {"a": 1}, True]


def valid_request(sim, targets, **extra):
    """Frames (route first) of a valid client request, as the sim builds them."""
    inner = sim.session.serialize(sim.session.msg("apply_request", content={}))[1:] + [b"payload"]
    content = P.request_content(f"m-{random.random()}", targets, extra.pop("reply", P.COALESCE), **extra)
    return [b"client-1"] + sim.codec.pack(P.REQUEST, content, inner)


def signed(session, msg_type, content, metadata=None, buffers=()):
    msg = session.msg(msg_type, content=content, metadata=metadata or {})
    return session.serialize(msg) + list(buffers)


class Fuzzer:
    """Seeded generator of bad messages, derived from valid ones."""

    def __init__(self, sim, seed):
        self.sim, self.rng = sim, random.Random(seed)
        self.wrong = Session(key=b"not-the-key")
        self.unsigned = Session(key=b"")

    def blob(self, big=False):
        n = self.rng.choice([0, 1, 7, 64, 1000] + ([4_000_000] if big else []))
        return bytes(self.rng.getrandbits(8) for _ in range(min(n, 256))) * (n // 256 + 1)

    def request_content(self):
        content = dict(msg_id="m", targets=[0, 1], reply=P.COALESCE, req="r0")
        for key in self.rng.sample(
            ["msg_id", "targets", "reply", "req", "each", "batch", "reduce", "compat", "shm"], 2
        ):
            content[key] = self.rng.choice(NONSENSE + [P.STREAM, "sum", [2, None], [0, 1]])
        return content

    def message(self):
        """Frames for one bad message, without the route ident."""
        rng, sim = self.rng, self.sim
        kind = rng.randrange(9)
        if kind == 0:  # random frames, any count
            return [self.blob() for _ in range(rng.randrange(0, 9))]
        if kind == 1:  # delimiter, then too few frames
            return [P._DELIM] + [self.blob() for _ in range(rng.randrange(0, 5))]
        if kind == 2:  # well formed, wrong key
            return signed(self.wrong, P.REQUEST, self.request_content())
        if kind == 3:  # well formed, unsigned
            return signed(self.unsigned, P.REQUEST, self.request_content())
        if kind == 4:  # signed, garbage JSON in a frame (re-signed so it parses that far)
            frames = signed(sim.session, P.REQUEST, {})
            frames[1 + rng.randrange(1, 5)] = self.blob() or b"{"
            frames[1] = sim.session.sign(frames[2:6]) if rng.random() < 0.5 else frames[1]
            return frames
        if kind == 5:  # signed, nonsense request fields
            return signed(sim.session, P.REQUEST, self.request_content(), buffers=[self.blob()])
        if kind == 6:  # signed bundle with nonsense metadata/content
            md = {k: rng.choice(NONSENSE) for k in rng.sample(["req", "msg_id", "kind", "eids"], 3)}
            content = {k: rng.choice(NONSENSE) for k in rng.sample(["parts", "failed", "reduce", "replies"], 2)}
            return signed(sim.session, P.BUNDLE, content, md, [self.blob() for _ in range(rng.randrange(3))])
        if kind == 7:  # signed: a type nodes do not take, or control replies with nonsense
            msg_type = rng.choice(["apply_reply", "x", "", "shutdown_request", P.PONG, P.STATS_REPLY])
            content = {
                k: rng.choice([v for v in NONSENSE if not isinstance(v, str)])
                for k in rng.sample(["boot", "req", "nodes", "msg_id"], 2)
            }
            return signed(sim.session, msg_type, content)
        frames = signed(sim.session, P.REQUEST, {})  # huge frame in a signed message
        return frames + [self.blob(big=True)]


def deliveries(sim):
    """(path, handler, idents): every way a message reaches some node."""
    out = []
    for path, node in sim.nodes.items():
        out.append((path, node.on_up, [b"client-x"] if node.is_root else []))
        if node.is_leaf:
            out.append((path, node.on_down, [sim.engines[ENGINES[0]].encode(), b"r0"]))
            out.append((path, node.on_down, [b"stranger", b"r0"]))
        else:
            out.append((path, node.on_down, [node_identity(path + (0,))]))
            out.append((path, node.on_down, [b"not-a-child"]))
    return out


@pytest.mark.parametrize("depth,fanout", [(0, 2), (1, 3), (2, 2)])
def test_fuzzed_messages_are_dropped_and_valid_traffic_flows(depth, fanout):
    sim = TreeSim(depth, fanout, ENGINES)
    fuzzer = Fuzzer(sim, seed=depth * 10 + fanout)
    routes = deliveries(sim)
    sent = 0
    for _ in range(FUZZ_MESSAGES):
        path, handler, idents = fuzzer.rng.choice(routes)
        sim._run(sim.nodes[path], handler(idents + fuzzer.message()), path)  # must not raise
        sent += 1
    assert sent >= FUZZ_MESSAGES
    assert sum(n.dropped for n in sim.nodes.values()) == sent, "every fuzz message is refused"
    assert sim.pending_total() == 0 and not sim.client_inbox
    # a valid request afterwards is served in full, in every mode
    for stream in (False, True):
        sim.client_inbox.clear()
        sim.request(ENGINES, stream=stream)
        replies, failures, _ = sim.outcomes()
        assert sorted(replies) == ENGINES and not failures


def test_replayed_request_is_dropped():
    sim = TreeSim(1, 2, ENGINES)
    frames = valid_request(sim, ENGINES)
    root = sim.nodes[()]
    assert root.on_up(list(frames))
    assert root.on_up(list(frames)) == [] and root.dropped == 1


def test_replayed_engine_reply_is_dropped():
    sim = TreeSim(0, 2, [0, 1])
    sim.hold.add(1)
    sim.request([0, 1])
    leaf = sim.nodes[()]
    (frames,) = sim.engine_inbox[0]
    # engine 0's answer arrived; sending it again must not count twice
    sim.release(1)
    replies, _, _ = sim.outcomes()
    assert sorted(replies) == [0, 1]
    before = leaf.dropped
    header = json.loads(P.as_bytes(P.split_idents(frames[1:])[1][1]))
    reply = sim.session.msg("apply_reply", content={"status": "ok", "eid": 0}, parent=header)
    out = [sim.engines[0].encode(), frames[1], P._DELIM] + sim.session.serialize(reply)[1:]
    assert leaf.on_down(out) == [] and leaf.dropped == before + 1
    assert sim.pending_total() == 0


def test_every_request_field_is_validated():
    sim = TreeSim(1, 2, ENGINES)
    root = sim.nodes[()]
    base = dict(msg_id="m", targets=[0, 1], reply=P.COALESCE)
    bad = [
        dict(targets=[0, 0]),
        dict(targets=[-1]),
        dict(targets="all"),
        dict(targets=[True]),
        dict(reply="maybe"),
        dict(msg_id=5),
        dict(each=[1]),
        dict(each=[1, -1]),
        dict(batch=[2, None]),
        dict(reduce="mean"),
        dict(reduce="sum", reply=P.STREAM),
    ]
    for i, change in enumerate(bad):
        frames = [b"c"] + signed(sim.session, P.REQUEST, dict(base, **change))
        assert root.on_up(frames) == [], change
        assert root.dropped == i + 1 and not root.pending
    json.dumps(bad)  # the cases themselves are plain data
