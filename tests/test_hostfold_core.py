"""Big reduce values combined where they are, pure: engines of a leaf's host
hold their values and combine them into one segment in turn (``relay.hostfold``,
``engine.holds``); holders that die, stall or fail are named and the others'
value still comes. Segments are real files in a temporary directory; engines
are in-memory."""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest
from ipyparallel.serialize import serialize_object
from jupyter_client.session import Session
from treesim import TreeSim

from ipyparallel_broadcast.engine.holds import HoldingKernel
from ipyparallel_broadcast.host import shm
from ipyparallel_broadcast.relay.hostfold import stripes
from ipyparallel_broadcast.wire import bundles as B
from ipyparallel_broadcast.wire import protocol as P
from ipyparallel_broadcast.wire.reduction import ReduceError, Reduction, engine_value, hold_values_with

pytestmark = pytest.mark.pure

N = 1 << 13  # float64 elements: 64 KiB, over the threshold below


class SimEngine(HoldingKernel):
    _context = object()  # as on the lean path: requests can be held back


class FoldSim(TreeSim):
    """A TreeSim whose leaves share memory with their engines, which hold
    their big values and answer turns as ``engine.holds`` does."""

    def __init__(self, engine_ids, values, depth=0, fanout=2, shared=True, **tree):
        """``shared``: leaves share memory with their engines (host relays always do)."""
        super().__init__(depth, fanout, engine_ids, store=lambda key: self._store(key, shared), **tree)
        self.values, self.turns, self.failing = values, [], set()
        self.slow = set()  # engines whose answers to their turns wait (``finish_turn``)
        self.unfinished = {}
        self.holders = {}
        for eid in engine_ids:
            engine = self.holders[eid] = SimEngine()
            engine.hold_for(dict(prefix=shm.relay_prefix(), threshold=1 << 12))
        hold_values_with(None)
        self.answer_with = self._value

    def _store(self, key, shared):
        host = key[0] == "h" if key else False
        return shm.ShmStore(threshold=1 << 12) if host or (shared and self.shape.is_leaf(key)) else None

    def _value(self, eid, request):
        hold_values_with(self.holders[eid].holds.hold)
        try:
            return {"status": "ok"}, serialize_object(engine_value(lambda: self.values[eid]))
        finally:
            hold_values_with(None)

    def _engine_receive(self, leaf_path, frames):
        if P.as_bytes(frames[1]) != P.FOLD_KEY:
            return super()._engine_receive(leaf_path, frames)
        uuid = P.as_bytes(frames[0]).decode()
        eid = next((e for e, u in self.engines.items() if u == uuid), None)
        if eid is None:
            node = self.nodes[leaf_path]
            self.queue.extend((leaf_path, s) for s in node.on_engine_lost(uuid, "is not connected"))
            return
        if eid in self.failing:
            self.holders[eid].holds.values.clear()  # its turn fails: it holds nothing
        answer = self.holders[eid].on_fold_message(P.Codec(self.session), frames[1:])
        if answer is None:
            return  # let go
        self.turns.append(eid)
        if eid in self.slow:
            self.unfinished[eid] = (leaf_path, answer)
            return
        self._deliver(eid, leaf_path, answer)

    def _deliver(self, eid, leaf_path, answer):
        node = self.nodes[leaf_path]
        self._run(node, node.on_down([self.engines[eid].encode()] + answer), leaf_path)

    def finish_turn(self, eid):
        self.slow.discard(eid)
        self._deliver(eid, *self.unfinished.pop(eid))

    def holding(self):
        return {e for e, h in self.holders.items() if e in self.engines and h.holding}


@pytest.fixture(autouse=True)
def shm_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("IPB_SHM_DIR", str(tmp_path))
    yield tmp_path
    hold_values_with(None)  # (an engine's, set by its greeting: none is left for other tests)
    assert os.listdir(tmp_path) == []  # every segment's name went


def outcome(sim):
    (frames,) = sim.client_inbox
    state, value, raised, failed = B.reduced_parts(sim.codec.unpack(P.split_idents(frames)[1]))
    r = Reduction(state["op"])
    r.add_partial(state, value)
    return r, raised, {f[0]: f[2] for f in failed}


def values_of(eids, seed=3):
    rng = np.random.default_rng(seed)
    return {e: rng.standard_normal(N) * 10.0 ** rng.integers(-8, 8) for e in eids}


def in_order(values, eids):
    return functools.reduce(np.add, [values[e] for e in sorted(eids)])


@pytest.mark.parametrize("order", [[0, 1, 2, 3], [3, 1, 0, 2], [2, 3, 1, 0]])
def test_a_hosts_engines_combine_their_values_in_turn_in_the_order_of_their_ids(order):
    values = values_of(range(4))
    sim = FoldSim(range(4), values)
    sim.request_answered_in(order, list(range(4)), reduce="sum")
    r, raised, failed = outcome(sim)
    assert r.result().tobytes() == in_order(values, range(4)).tobytes()  # bitwise, whatever the arrival order
    assert (raised, failed) == ([], {})
    assert sim.turns == [0, 1, 2, 3]  # one turn each, first id first
    assert sim.holding() == set() and sim.pending_total() == 0
    assert sim.nodes[()].stats()["shm_values"] == 4


def test_turns_start_only_when_every_engine_here_has_answered():
    values = values_of(range(4))
    sim = FoldSim(range(4), values)
    sim.hold.add(3)
    sim.request(list(range(4)), reduce="sum")
    assert sim.turns == [] and sim.holding() == {0, 1, 2}  # they wait, holding their values
    sim.release(3)
    assert sim.turns == [0, 1, 2, 3] and sim.holding() == set()


def test_a_holder_that_dies_before_the_turns_is_named_and_the_others_combine():
    values = values_of(range(4))
    sim = FoldSim(range(4), values)
    sim.hold.add(3)
    sim.request(list(range(4)), reduce="sum")
    sim.kill(1)
    sim.release(3)
    r, raised, failed = outcome(sim)
    assert r.result().tobytes() == in_order(values, [0, 2, 3]).tobytes()
    assert list(failed) == [1] and "before its value was combined" in failed[1]
    assert 1 not in sim.turns and sim.holding() == set()


def test_a_holder_that_dies_after_its_turn_makes_the_turns_start_again_without_it():
    values = values_of(range(4))
    sim = FoldSim(range(4), values)
    sim.slow.add(2)  # its answer to its turn waits
    sim.request(list(range(4)), reduce="sum")
    assert sim.turns == [0, 1, 2]
    sim.kill(1)  # its value is in the segment already: a new round, in a new segment
    sim.finish_turn(2)  # the old round's answer is let be
    r, _, failed = outcome(sim)
    assert r.result().tobytes() == in_order(values, [0, 2, 3]).tobytes()
    assert list(failed) == [1]
    assert sim.turns == [0, 1, 2, 0, 2, 3] and sim.holding() == set()


def test_a_turn_past_its_deadline_names_its_engine_and_the_others_go_on():
    values = values_of(range(3))
    sim = FoldSim(range(3), values)
    sim.slow.add(1)
    sim.request(list(range(3)), reduce="sum")
    assert sim.client_inbox == [] and sim.turns == [0, 1]
    sim.tick(2 * sim.nodes[()].node_timeout + 1)  # its turn never ends
    r, _, failed = outcome(sim)
    assert r.result().tobytes() == in_order(values, [0, 2]).tobytes()
    assert "did not combine its value within" in failed[1]
    assert sim.holding() == set()  # it was told to let go, too


def test_a_failed_turn_names_its_engine():
    values = values_of(range(3))
    sim = FoldSim(range(3), values)
    sim.failing.add(2)
    sim.request(list(range(3)), reduce="sum")
    r, _, failed = outcome(sim)
    assert r.result().tobytes() == in_order(values, [0, 1]).tobytes()
    assert "could not combine its value: it holds no such value" in failed[2]


def test_held_values_of_different_shapes_raise_reduce_error_and_are_let_go():
    values = values_of(range(3))
    values[1] = np.ones(2 * N)
    sim = FoldSim(range(3), values)
    sim.request(list(range(3)), reduce="sum")
    r, _, failed = outcome(sim)
    with pytest.raises(ValueError, match=r"engines \[1\] gave a float64 array of shape \(16384,\)"):
        r.result()
    assert sim.turns == [] and sim.holding() == set() and failed == {}


def test_a_held_value_at_a_relay_that_shares_no_memory_is_an_error_for_that_engine():
    values = values_of(range(2))
    sim = FoldSim(range(2), values, shared=False)
    sim.request(list(range(2)), reduce="sum")
    r, _, _ = outcome(sim)
    with pytest.raises(ValueError, match="shares no memory"):
        r.result()
    assert sim.pending_total() == 0 and sim.holding() == set()  # let go all the same


def test_small_values_and_holders_mix_in_a_tree_and_every_node_ends_clean():
    values = values_of(range(8))
    sim = FoldSim(range(8), values, depth=1, fanout=2)
    sim.request_answered_in([7, 5, 3, 1, 0, 2, 4, 6], list(range(8)), reduce="sum")
    r, _, failed = outcome(sim)
    np.testing.assert_allclose(r.result(), in_order(values, range(8)), rtol=1e-12, atol=1e-6)
    assert failed == {} and sim.holding() == set() and sim.pending_total() == 0
    assert sorted(sim.turns) == list(range(8))


NONSENSE = [None, 0, -1, 2**70, 1.5, "x", "", [], {}, [1, 1], ["a"], {"a": 1}, True, "r999"]


@pytest.mark.parametrize("seed", range(3))
def test_malformed_and_stray_turn_answers_are_let_be_and_the_turns_go_on(seed):
    import random

    rng = random.Random(seed)
    values = values_of(range(4))
    sim = FoldSim(range(4), values)
    sim.slow.add(2)
    sim.request(list(range(4)), reduce="sum")
    leaf, (key,) = sim.nodes[()], list(sim.nodes[()].big.fold.folds)
    for _ in range(300):
        fields = rng.sample(["req", "round", "token", "ok", "error"], rng.randrange(6))
        content = {k: rng.choice(NONSENSE) for k in fields}
        if rng.random() < 0.5:
            content["req"] = key
        eid = rng.randrange(5)  # 4: no such engine
        uuid = sim.engines.get(eid, "uuid-9999")
        frames = [uuid.encode(), P.FOLD_KEY] + sim.codec.pack(P.FOLD_DONE, content)
        if rng.random() < 0.2:
            frames = frames[:3] + [b"junk"] + frames[4:]  # a broken signature or header
        leaf.on_down(frames)
    assert sim.client_inbox == [] and sim.turns == [0, 1, 2]
    sim.finish_turn(2)
    r, _, failed = outcome(sim)
    assert failed == {} and r.result().tobytes() == in_order(values, range(4)).tobytes()
    assert sim.holding() == set() and sim.pending_total() == 0


@pytest.mark.parametrize(
    "bad",
    [
        ("held", "<f8", [4], False, {"token": "1", "nbytes": 31}),  # the size is not the shape's
        ("held", "<f8", [4], False, {"token": 1, "nbytes": 32}),
        ("held", "|O", [4], False, {"token": "1", "nbytes": 32}),
        ("held", "<f8", [-4], False, {"token": "1", "nbytes": 32}),
        ("held", "<f8", "4", False, {"token": "1", "nbytes": 32}),
        ("held", "<f8", [0], False, {"token": "1", "nbytes": 0}),
        ("held", "<f8", [4], False, None),
    ],
)
def test_a_malformed_held_value_is_an_error_for_its_engine(bad):
    from ipyparallel_broadcast.wire.reduction import decode_engine

    with pytest.raises(ValueError, match="not a reduce value"):
        decode_engine(serialize_object(bad))


def test_an_engine_refuses_a_malformed_or_replayed_host_fold_message():
    engine = SimEngine()
    engine.hold_for(dict(prefix=shm.relay_prefix(), threshold=16))
    token = engine.holds.hold(np.ones(8))
    codec = P.Codec(Session(key=b"secret"))
    release = [b"relay", P.FOLD_KEY] + codec.pack(P.FOLD_RELEASE, dict(tokens=[token]))
    wrong = [b"relay", P.FOLD_KEY] + P.Codec(Session(key=b"other")).pack(P.FOLD_RELEASE, dict(tokens=[token]))
    for bad in (wrong, release[:4], [b"relay", P.FOLD_KEY] + codec.pack("ipb_gang_what", {})):
        with pytest.raises(P.ProtocolError):
            engine.on_fold_message(P.Codec(Session(key=b"secret")), bad[1:])
    assert engine.holding
    receiving = P.Codec(Session(key=b"secret"))
    assert engine.on_fold_message(receiving, release[1:]) is None and not engine.holding
    with pytest.raises(P.ProtocolError, match="replay"):
        engine.on_fold_message(receiving, release[1:])


# ------------------------------------------ host values in a chain of hosts
CHUNK = 1024  # bytes per chain chunk: a value of N float64 is 64 chunks, in 6 stripes


class ChainSim(FoldSim):
    """Hosts of ``per_host`` engines each under one leaf; each host's engines
    hold their values and combine them stripe by stripe while the chain
    sends each final stripe on. ``log``: turns (engine ids) and chain
    messages sent (``("chunk", host)``), in the order they happened."""

    def __init__(self, n_hosts, per_host, values, shape="chain"):
        hosts = {f"h{i}": (0, list(range(i * per_host, (i + 1) * per_host))) for i in range(n_hosts)}
        bulk = dict(chunk=CHUNK, threshold=CHUNK, reduce=shape)
        self.fail_at = {}  # engine id -> its turn (counted from 1) that fails
        self.log = self.turns = []
        self.parts_sent = []  # (place in the log, host, part) of each chain message
        super().__init__(range(n_hosts * per_host), values, hosts=hosts, bulk=bulk)
        self.log = self.turns
        for label in hosts:
            node = self.nodes["h", label]
            run = node.big.chains._message

            def message(link, content, data=b"", run=run, label=label):
                self.log.append(("chunk", label))
                self.parts_sent.append((len(self.log), label, link.key[-1]))
                return run(link, content, data)

            node.big.chains._message = message

    def _engine_receive(self, leaf_path, frames):
        uuid = P.as_bytes(frames[0]).decode()
        eid = next((e for e, u in self.engines.items() if u == uuid), None)
        if eid in self.fail_at and self.log.count(eid) + 1 == self.fail_at[eid]:
            self.failing.add(eid)
        super()._engine_receive(leaf_path, frames)


def by_host(values, n_hosts, per_host):
    """The chain's value: each host's engines in order, then host 0's + (host 1's + ...)."""
    hosts = [in_order(values, range(h * per_host, (h + 1) * per_host)) for h in range(n_hosts)]
    return functools.reduce(lambda acc, v: v + acc, hosts[::-1])


def test_a_hosts_value_goes_into_the_chain_stripe_by_stripe_and_the_sum_is_the_same_to_the_bit():
    values = values_of(range(9))
    sim = ChainSim(3, 3, values)
    sim.request(list(range(9)), reduce="sum")
    r, raised, failed = outcome(sim)
    assert r.result().tobytes() == by_host(values, 3, 3).tobytes()
    assert not raised and not failed
    ends = [hi for _, hi in stripes(0, N * 8, CHUNK)]
    assert ends == [2048, 6144, 14336, 30720, 63488, 65536]  # 2 chunks, then twice the last
    assert sum(isinstance(e, int) for e in sim.log) == 6 * 9  # a turn per stripe per engine
    tail = [i for i, e in enumerate(sim.log) if e == ("chunk", "h2")]
    last_turn = max(i for i, e in enumerate(sim.log) if e in (6, 7, 8))
    assert len(tail) == 64 and tail[0] < last_turn  # the tail sent before its host's value was whole
    assert sim.holding() == set() and sim.pending_total() == 0
    assert all(not node.big.chains.links for node in sim.nodes.values())


def by_trees(values, n_hosts, per_host):
    """Two trees' value: half t up a heap of the hosts (in order, then
    reversed), each host's value first, then its first feeder's, then its second's."""
    from ipyparallel_broadcast.relay.dataplane import ring

    host = [in_order(values, range(h * per_host, (h + 1) * per_host)) for h in range(n_hosts)]
    cut = [c // 8 for c in ring.cuts(N * 8, CHUNK, 2)]
    out = np.empty(N)
    for t, order in enumerate([list(range(n_hosts)), list(range(n_hosts))[::-1]]):

        def up(j, order=order, lo=cut[t], hi=cut[t + 1]):
            acc = host[order[j]][lo:hi]
            for c in (2 * j + 1, 2 * j + 2):
                if c < n_hosts:
                    acc = acc + up(c)
            return acc

        out[cut[t] : cut[t + 1]] = up(0)
    return out


@pytest.mark.parametrize("n_hosts", [3, 4, 7])
def test_a_hosts_value_goes_up_two_trees_stripe_by_stripe_and_the_sum_is_the_same_to_the_bit(n_hosts):
    values = values_of(range(2 * n_hosts))
    sim = ChainSim(n_hosts, 2, values, shape="two trees")
    sim.request(list(range(2 * n_hosts)), reduce="sum")
    r, raised, failed = outcome(sim)
    assert r.result().tobytes() == by_trees(values, n_hosts, 2).tobytes()
    assert r.result().tobytes() != by_host(values, n_hosts, 2).tobytes()  # not the chain's order: it can fail
    turns = [i for i, e in enumerate(sim.log) if isinstance(e, int)]
    first = {part: min(at for at, _, t in sim.parts_sent if t == part) for part in "01"}
    assert max(first.values()) < turns[len(turns) // 3]  # both trees start early: the halves take turns
    assert not raised and not failed
    assert sim.holding() == set() and sim.pending_total() == 0
    assert all(not node.big.chains.links for node in sim.nodes.values())


def test_a_holder_that_fails_before_any_stripe_went_on_is_named_and_its_host_starts_again():
    values = values_of(range(6))
    sim = ChainSim(2, 3, values)
    sim.fail_at[4] = 1  # its first turn, in host h1 (the tail): nothing of h1 has gone on
    sim.request(list(range(6)), reduce="sum")
    r, _, failed = outcome(sim)
    kept = dict(values)
    kept[4] = np.zeros(N)
    expected = in_order(values, [0, 1, 2]) + in_order(values, [3, 5])
    assert r.result().tobytes() == expected.tobytes()
    assert list(failed) == [4] and "could not combine its value" in failed[4]
    assert sim.holding() == set() and sim.pending_total() == 0


@pytest.mark.parametrize("shape", ["chain", "two trees"])
@pytest.mark.parametrize("host", [0, 1, 2])
def test_a_holder_that_fails_once_part_of_its_hosts_value_went_on_fails_the_chain_naming_it(host, shape):
    values = values_of(range(9))
    sim = ChainSim(3, 3, values, shape)
    eid = 3 * host + 1
    sim.fail_at[eid] = 3  # its third stripe: the first went on already
    sim.request(list(range(9)), reduce="sum")
    r, _, failed = outcome(sim)
    with pytest.raises(ReduceError, match=f"engine {eid} failed while this host combined its value"):
        r.result()
    assert "could not combine its value" in failed[eid]
    assert sim.holding() == set() and sim.pending_total() == 0
    assert all(not node.big.chains.links for node in sim.nodes.values())


# ------------------------------------------------- an allreduce round a ring
class RingSim(ChainSim):
    """ChainSim for an allreduce: engines map what the bind request names in
    shared memory (as ``engine.kernel`` does) and keep what they bind."""

    def __init__(self, n_hosts, per_host, values):
        super().__init__(n_hosts, per_host, values)
        self.bound, self.mapped = {}, {}
        for node in self.nodes.values():  # (they greeted it: they share its memory)
            node.sharing.local.update(self.engines[e] for e in node.engines if node.host)

    def _engine_receive(self, leaf_path, frames):
        at = shm.reference_in(frames[1:])
        if at is not None:  # (an engine maps the segment: the bind's value)
            frames = frames[:1] + shm.expand(list(frames[1:]), at, P.Codec(self.session).sign)
            self.mapped[P.as_bytes(frames[0]).decode()] = True
        super()._engine_receive(leaf_path, frames)

    def _store(self, key, shared):
        host = key[0] == "h" if key else False
        return shm.ShmStore(threshold=1 << 12) if host or (shared and self.shape.is_leaf(key)) else None

    def _value(self, eid, request):
        from ipyparallel.serialize import unpack_apply_message

        if len(request["buffers"]) >= 2:
            f, (name, value), _ = unpack_apply_message(request["buffers"])
            if f.__name__ == "assign":
                self.bound[eid] = np.array(value)  # (a copy: the mapping goes with the request)
                return {"status": "ok"}, serialize_object(("py", 1))
        return super()._value(eid, request)


def ring_of(values, n_hosts, per_host):
    """Part k: host k's value first, then host k-1's, ... round to host k+1's."""
    from ipyparallel_broadcast.relay.dataplane import ring

    host = [in_order(values, range(h * per_host, (h + 1) * per_host)) for h in range(n_hosts)]
    cut = [c // 8 for c in ring.cuts(N * 8, CHUNK, n_hosts)]
    out = np.empty(N)
    for k in range(n_hosts):
        parts = [host[(k - j) % n_hosts][cut[k] : cut[k + 1]] for j in range(n_hosts)]
        out[cut[k] : cut[k + 1]] = functools.reduce(lambda acc, v: v + acc, parts[::-1])
    return out


def test_an_allreduce_goes_round_the_ring_stripe_by_stripe_and_every_engine_maps_the_value_to_the_bit():
    values = values_of(range(9))
    sim = RingSim(3, 3, values)
    sim.request(list(range(9)), reduce="sum", allreduce="total")
    r, raised, failed = outcome(sim)
    assert r.result() == 9 and not raised and not failed
    expected = ring_of(values, 3, 3)
    assert sorted(sim.bound) == list(range(9)) and all(v.tobytes() == expected.tobytes() for v in sim.bound.values())
    assert len(sim.mapped) == 9  # each engine mapped its host's segment: no copy of the value went to it
    hosts = [sim.nodes["h", f"h{i}"] for i in range(3)]
    assert all(node.big.rings.gathered == 64 for node in hosts)  # each host wrote each final chunk once
    tail = [i for i, e in enumerate(sim.log) if e == ("chunk", "h1")]
    assert tail[0] < max(i for i, e in enumerate(sim.log) if e in (3, 4, 5))  # it sent before its value was whole
    assert sim.holding() == set() and sim.pending_total() == 0
    assert all(not n.big.rings.rings and not n.big.rings.results and not n.big.chains.links for n in hosts)


def test_a_holder_that_fails_once_part_of_its_hosts_value_went_round_ends_the_ring_and_nothing_binds():
    values = values_of(range(6))
    sim = RingSim(2, 3, values)
    sim.fail_at[4] = 3  # its third stripe: its host's first stripes went round already
    sim.request(list(range(6)), reduce="sum", allreduce="total")
    r, _, failed = outcome(sim)
    with pytest.raises(ReduceError, match="engine 4 failed while this host combined its value"):
        r.result()
    assert not sim.bound and "could not combine its value" in failed[4]
    assert sim.holding() == set() and sim.pending_total() == 0
    assert all(not n.big.rings.rings and not n.big.rings.results for n in (sim.nodes["h", "h0"], sim.nodes["h", "h1"]))
