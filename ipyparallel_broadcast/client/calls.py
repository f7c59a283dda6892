"""The client's broadcasts, sans I/O: bundles in, per-call outcomes out.

A ``Call`` is one broadcast at the client: its targets, and each target's
outcome once known (an engine's parsed reply, or a failure). ``Calls`` is the
table of calls in flight plus the last few finished ones (``get_result`` can
still recall them). Per engine, nothing runs beyond filing its outcome in one
pass over a bundle; results are unpacked once, when the call is complete, and
metadata is built only for the engines someone asks about. No socket, no
thread, no ipyparallel internals here: the client (``client.py``) feeds
bundles and failures in, and settles one future per finished call.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

from ..wire import protocol as P
from ..wire.bundles import Entry
from ..wire.naming import is_broadcast_id

# An engine's outcome: ``("reply", parsed reply, streams)`` (``streams``: its
# outputs still come on IOPub, until its idle status); ``("reply", table,
# streams, k)``, reply ``k`` of a host's ``bundles.ReplyTable``, parsed only
# when read (``reply_of``: one tuple per engine, where an ``Entry`` object each
# tripled the cost of filing a table); or ``(FAILED, eid, uuid, message)``: the
# engine cannot answer.
FAILED = "failed"


def in_table(outcome: tuple) -> bool:
    """Is this outcome a reply in a host's table (``("reply", table, streams, k)``)?"""
    return len(outcome) == 4 and outcome[0] == "reply"


def reply_of(outcome: tuple):
    """A ``reply`` outcome's message: a dict, or an ``Entry`` that reads like one."""
    return Entry(outcome[1], outcome[3]) if in_table(outcome) else outcome[1]


def vid_parts(vid: str):
    """``(msg_id, uuid)`` of a per-engine id ``f"{msg_id}_{uuid}"`` (uuids have no ``_``)."""
    msg_id, _, uuid = vid.rpartition("_")
    return msg_id, uuid


def reply_mode(coalescing) -> tuple:
    """``(reply, batch)`` on the wire for a fixed ``coalescing`` setting."""
    if coalescing is True:
        return P.COALESCE, None
    if coalescing is False:
        return P.STREAM, None
    return P.STREAM, [coalescing.count, coalescing.interval]


class Call:
    """One broadcast: targets in order, and their outcomes as they come."""

    __slots__ = (
        "msg_id",
        "header",
        "eids",
        "uuids",
        "index",
        "outcomes",
        "left",
        "iopub",
        "received",
        "idle",
        "stream",
        "mds",
        "children",
        "future",
        "output",
        "tracker",
        "results",
        "_vids",
        "_by_eid",
        "__weakref__",  # a callback on its own future refers to it weakly (no cycle)
    )

    def __init__(self, msg_id: str, header: dict, eids: Sequence[int], uuids: Sequence[str]):
        self.msg_id, self.header = msg_id, header
        self.eids, self.uuids = list(eids), list(uuids)
        self.index = {u: i for i, u in enumerate(self.uuids)}
        self.outcomes: list[tuple | None] = [None] * len(self.uuids)
        self.left = len(self.uuids)  # outcomes still owed
        self.iopub = 0  # engines whose outputs still stream on IOPub (until their idle status)
        self.received: list[object] = [None] * len(self.uuids)  # when each outcome came
        self.idle: set = set()  # engines whose idle status came before their reply
        self.stream = False  # replies streamed (True) or coalesced into one message
        self.mds: list | None = None  # per-engine Metadata, built on first read
        self.children: list | None = None  # per-engine futures, built on first need
        self.future = self.output = self.tracker = None  # the client's: result, outputs, sent
        self.results: list | None = None  # per-engine results, once complete
        self._vids: list | None = None
        self._by_eid: dict | None = None

    @property
    def vids(self) -> list[str]:
        """Per-engine ids, in target order (what AsyncResult calls msg_ids)."""
        if self._vids is None:
            prefix = self.msg_id + "_"
            self._vids = [prefix + u for u in self.uuids]
        return self._vids

    def engine_index(self, uuid: str | None, eid: int | None) -> int | None:
        """A target's index, by its uuid or else by its engine id: an output
        whose metadata does not name its engine (a simulated engine's; any
        engine's IOPub topic) is still this call's after the client has
        forgotten the engine (it died, or unregistered, meanwhile)."""
        i = self.index.get(uuid) if uuid is not None else None
        if i is None and eid is not None:
            if self._by_eid is None:
                self._by_eid = {e: k for k, e in enumerate(self.eids)}
            i = self._by_eid.get(eid)
        return i

    @property
    def done(self) -> bool:
        return not self.left

    @property
    def outputs_done(self) -> bool:
        return not self.left and not self.iopub

    def settle(self, uuid: str, outcome: tuple, when=None) -> int | None:
        """File one engine's outcome; its index, or None if not owed (an
        unknown engine, or one already settled: e.g. failed before its reply)."""
        i = self.index.get(uuid)
        if i is None or self.outcomes[i] is not None:
            return None
        self.outcomes[i] = outcome
        self.received[i] = when
        self.left -= 1
        return i

    def pending(self) -> list[int]:
        return [i for i, o in enumerate(self.outcomes) if o is None]


class Calls:
    """The client's calls in flight, by msg_id, and the last ``kept`` finished
    (fewer if they hold more than ``kept_outcomes`` engines' outcomes in all;
    the last one is always kept)."""

    def __init__(self, kept: int = 16, kept_outcomes: int = 4096):
        self.kept, self.kept_outcomes = kept, kept_outcomes
        self.live: dict[str, Call] = {}
        self.recent: OrderedDict[str, Call] = OrderedDict()

    def __contains__(self, msg_id) -> bool:
        return msg_id in self.live

    def __len__(self) -> int:
        return len(self.live)

    def get(self, msg_id) -> Call | None:
        return self.live.get(msg_id)

    def find(self, msg_id) -> Call | None:
        """A live or recent call."""
        return self.live.get(msg_id) or self.recent.get(msg_id)

    def of_vid(self, vid) -> tuple:
        """``(call, index)`` of a per-engine id, live or recent; ``(None, None)``."""
        if not isinstance(vid, str) or not is_broadcast_id(vid):
            return None, None
        msg_id, uuid = vid_parts(vid)
        call = self.find(msg_id)
        if call is None:
            return None, None
        i = call.index.get(uuid)
        return (call, i) if i is not None else (None, None)

    def start(self, call: Call) -> Call:
        self.live[call.msg_id] = call
        return call

    def bundle(self, call: Call, outcomes: Iterable[tuple], when, unpack, log, shared=None) -> list[int]:
        """File a bundle's outcomes (``protocol.iter_bundle``); the indices
        settled. ``unpack`` reads a raw reply; ``shared`` fills a table's
        buffers from shared memory (``shared.SharedReplies.fill``). An outcome
        that cannot be read is logged and skipped (the root watch fails that
        engine later)."""
        settled, by_eid = [], None
        index, outs, received, header = call.index, call.outcomes, call.received, call.header
        for what, item in outcomes:  # the hot loop: one pass, nothing per engine but filing
            try:
                if what == "table":  # a host's replies: filed from its table, parsed when read
                    lost = shared(item) if item.shm and shared is not None else None
                    settled += self._table(call, item, when, lost)
                    if lost:
                        settled += self._lost(call, item, lost, when)
                    continue
                if what == "reply":
                    item, what = unpack(item), "parsed"
                    if item["parent_header"].get("msg_id") != call.msg_id:
                        raise P.ProtocolError("engine reply to another request")
                if what == "parsed":
                    md = item["metadata"]
                    i = index.get(md["engine"])
                    if i is None or outs[i] is not None:
                        continue  # not owed: an unknown engine, or one settled already
                    item["parent_header"] = header
                    outputs = md.get(P.OUTPUTS_KEY)
                    streams = (outputs is None or bool(outputs.get("iopub"))) and i not in call.idle
                    outs[i], received[i] = ("reply", item, streams), when
                    call.left -= 1
                    call.iopub += streams
                elif what == FAILED:
                    eid, uuid, message = item[:3]
                    if not isinstance(uuid, str):  # interior nodes know engines by id only
                        if by_eid is None:  # once per bundle: a lost subtree fails many at once
                            by_eid = dict(zip(call.eids, call.uuids))
                        uuid = by_eid.get(eid)
                    i = call.settle(uuid, (FAILED, eid, uuid, message), when)
                    if i is None:
                        continue
                else:
                    raise P.ProtocolError(f"unexpected outcome {what!r} in a bundle")
            except Exception as e:
                log.error("Dropped an engine outcome in a bundle of %s: %r", call.msg_id, e)
                continue
            settled.append(i)
        return settled

    @staticmethod
    def _table(call: Call, table, when, lost=None) -> list[int]:
        settled, index, outs, received, idle = [], call.index, call.outcomes, call.received, call.idle
        iopub, left, streaming = table.iopub, call.left, call.iopub
        for k, uuid in enumerate(table.engines):
            i = index.get(uuid)
            if i is None or outs[i] is not None or (lost and k in lost):
                continue  # not owed (an unknown engine, or one settled already), or failing
            streams = k in iopub and i not in idle
            outs[i], received[i] = ("reply", table, streams, k), when
            left -= 1
            streaming += streams
            settled.append(i)
        call.left, call.iopub = left, streaming
        return settled

    @staticmethod
    def _lost(call: Call, table, lost: dict, when) -> list[int]:
        """A table's engines whose shared buffers could not be read: each fails, saying why."""
        settled = []
        for k, why in lost.items():
            uuid = table.engines[k]
            i = call.index.get(uuid)
            if (
                i is not None
                and call.settle(uuid, (FAILED, call.eids[i], uuid, f"Engine {call.eids[i]}: {why}"), when) is not None
            ):
                settled.append(i)
        return settled

    def fail(self, call: Call, uuids: Iterable[str], message: Callable[[int], str], when=None) -> list[int]:
        """Engines that cannot answer: each owed one gets a failure."""
        settled = []
        for uuid in uuids:
            i = call.index.get(uuid)
            if i is not None and call.outcomes[i] is None:
                call.settle(uuid, (FAILED, call.eids[i], uuid, message(call.eids[i])), when)
                settled.append(i)
        return settled

    def output_done(self, call: Call, i: int) -> bool:
        """An engine's IOPub outputs are complete (its idle status came)."""
        o = call.outcomes[i]
        if o is None:  # IOPub overtook the reply
            call.idle.add(i)
            return False
        if o[0] == "reply" and o[2]:
            call.outcomes[i] = ("reply", o[1], False, *o[3:])
            call.iopub -= 1
            return True
        return False

    def finish(self, call: Call):
        """A complete call leaves the live table; the last ``kept`` stay recallable."""
        if self.live.pop(call.msg_id, None) is None:
            return
        self.recent[call.msg_id] = call
        outcomes = sum(len(c.uuids) for c in self.recent.values())
        while len(self.recent) > max(self.kept, 0) or (outcomes > self.kept_outcomes and len(self.recent) > 1):
            outcomes -= len(self.recent.popitem(last=False)[1].uuids)
