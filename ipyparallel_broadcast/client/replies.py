"""Replies coming back to the client: a bundle's outcomes filed in its call,
a call settled once every engine's outcome is in, a reduction's value, and
requests the root lost failing by name. Part of ``Client`` (``client``); runs
on the client's I/O thread.

The watch on the root (``RootWatch``): which requests can no longer come back.

The root is the client's only peer on the broadcast socket. While requests
are in flight, the client pings it every ``interval`` seconds, listing the
requests it has waited on for at least that long; the root answers with those
it does not hold (``protocol``: ``ipb_ping`` / ``ipb_pong``). The socket is
first in, first out both ways, so a request listed was in the root's hands
before the ping, and a reply the root sent before its pong is handled before
it: a request the root does not know was lost (the root died and restarted,
or dropped it). A root that answers nothing for ``timeout`` seconds loses
everything in flight.

No socket monitor: a monitor whose reader is gone blocks its context's I/O
thread on the next event, and with it every socket of that context.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable

from ipyparallel import util

from ..compat import ipp
from ..wire import bundles as B
from ..wire import protocol as P
from ..wire.reduction import Reduction
from .calls import Call, reply_of
from .copies import CallCopies
from .results import call_results, fill_metadata, resolve_reduction

log = logging.getLogger(__name__)


class ReplyFiling:
    """A part of our Client: what comes back from the tree, filed and
    settled. It counts what it read (``received``); ``client`` is the Client
    whose calls, futures and sockets it settles and reads (I/O thread)."""

    def __init__(self, client):
        self.client = client
        self.received = 0  # messages from the tree (tests count them)

    def settled(self, call: Call, indices):
        """Engines' outcomes were filed: update what exists, finish what is done."""
        client = self.client
        if call.done:  # (its own msg_id goes below, with its future)
            client.outstanding.drop_call(call.msg_id)
        else:
            uuids = call.uuids
            client.outstanding.settle(call.msg_id, [uuids[i] for i in indices])
        if call.mds is not None:
            for i in indices:
                fill_metadata(client, call, i)
        if call.msg_id in client._traces:
            for i in indices:
                if call.outcomes[i][0] == "reply":
                    client._traces.add_engine(call.msg_id, call.eids[i], reply_of(call.outcomes[i]))
        with client._children_lock:
            made = call.children is not None
        if made:  # (a thread that made them meanwhile also scheduled these on this thread)
            client._settle_children(call, indices)
        if call.done and not call.future.done():
            client._root_watch.done(call.msg_id)
            client.outstanding.discard(call.msg_id)
            call.future.set_result(call_results(client, call))
        if call.outputs_done and not call.output.done():
            self.call_finished(call)

    def call_finished(self, call: Call):
        """Results and outputs are all in: the call leaves the live table."""
        client = self.client
        if call.msg_id in client._traces:
            client._traces.add(call.msg_id, "done", time.time())
        with client._children_lock:  # per-engine futures made from now on are not registered
            client._calls.finish(call)
            made = call.children is not None
        client._reply_futures.pop(call.msg_id, None)
        if made:
            for vid in call.vids:
                client._reply_futures.pop(vid, None)
                client._iopub_futures.pop(vid, None)
        call.output.set_result(None)

    def output_done(self, call: Call, i: int):
        """Engine ``i``'s output of ``call`` ended."""
        if self.client._calls.output_done(call, i):
            if call.children is not None and not call.children[i].output.done():
                call.children[i].output.set_result(None)
            if call.outputs_done and not call.output.done():
                self.call_finished(call)

    def to_root(self, msg_id, send, *args, **kwargs):
        """IO thread: hand a request to the socket, and watch for it."""
        self.client._root_watch.sent(msg_id)
        send(*args, **kwargs)

    def watch_root(self):
        """Ping the root about requests waited on; fail what it lost."""
        client = self.client
        ids, lost = client._root_watch.tick()
        if ids:
            client._root_stream.send_multipart(client._codec.pack(P.PING, dict(ids=ids)))
        self.root_lost(lost)

    def root_lost(self, lost, again: bool = True):
        """Requests that cannot come back: each is sent again (``again``, at most
        ``CallCopies.tries`` times), else every engine's part fails."""
        client = self.client
        if again:
            lost = [(msg_id, why) for msg_id, why in lost if not self.again(msg_id, why)]
        if lost:
            log.error("%s: failing %d request(s)", lost[0][1], len(lost))
        for msg_id, why in lost:
            client._root_watch.done(msg_id)
            call = client._calls.get(msg_id)
            if call is not None:
                owed = [call.uuids[i] for i in call.pending()]
                self.settled(
                    call,
                    client._calls.fail(
                        call, owed, lambda eid, why=why: f"{why}; engine {eid} did not answer", util.utcnow()
                    ),
                )
            future = client._reductions.pop(msg_id, None)
            if future is not None:
                failed = [[e, client._engine_table.get(e), f"{why}; engine {e} did not answer"] for e in future.targets]
                resolve_reduction(client._codec, future, Reduction(future.op), [], failed)
            client._tree_surveys.lost(msg_id, why)

    def again(self, msg_id: str, why: str) -> bool:
        """Send a lost call again, to the engines still owed (to all of a
        reduction's, or a scatter's: their parts go together); the engines
        answer a copy with the reply they kept. False if it may not go again."""
        client = self.client
        kept = client._root_watch.copies.again(msg_id)
        if kept is None:
            return False
        request, call = dict(kept.request), client._calls.get(msg_id)
        if call is not None and "each" not in request:
            request["targets"] = [call.eids[i] for i in call.pending()]
        log.warning("%s: sending %s again (try %d of %d)", why, msg_id, kept.tries, client._root_watch.copies.tries)
        frames = client.session.serialize(client.session.msg(P.REQUEST, content=request)) + kept.frames
        self.to_root(msg_id, client._root_stream.send_multipart, frames, copy=kept.copy)
        return True

    def dispatch(self, frames):
        """A message from the tree: a bundle, a reduction, the root's pong or a survey's answer."""
        client = self.client
        arrived = time.time()
        try:
            _, body = P.split_idents(frames)
            msg = client._codec.unpack(body)
            kind = msg["header"].get("msg_type")
            if kind == P.PONG:  # the root's, not a reply
                return self.root_lost(client._root_watch.pong(msg["content"].get("unknown") or ()))
            self.received += 1
            if kind == P.STATS_REPLY:
                client._root_watch.done(msg["content"].get("msg_id"))
                return client._tree_surveys.answered(msg["content"].get("msg_id"), msg["content"].get("nodes", []))
            if kind != P.BUNDLE:
                return ipp.stock_reply(client, frames)  # a stock broadcast reply
            msg_id = msg["metadata"].get("msg_id")
            if msg_id in client._traces:
                client._traces.add(msg_id, "reply in", arrived, msg["metadata"].get("kind"))
            if msg_id in client._reductions:
                return self.reduced(client._reductions.pop(msg_id), msg)
            if msg["metadata"].get("kind") == "reduced":  # its call ended first (failed: its controller died)
                log.debug("reduction reply for a call that ended: %s", msg_id)
                return client._shared.drop_value(B.reduced_parts(msg)[0].get("value"))
            call = client._calls.get(msg_id)
            outcomes = B.iter_bundle(client._codec, msg, tables=True)
            if call is None:
                log.debug("bundle for unknown broadcast %s", msg_id)
                for what, item in outcomes:  # no one will read its shared buffers
                    if what == "table" and item.shm:
                        client._shared.drop(item)
                return
            shared, unpack = client._shared, client._codec.unpack
            settled = client._calls.bundle(call, outcomes, util.utcnow(), unpack, log, shared.fill)
        except P.ProtocolError as e:
            log.error("Dropped an invalid broadcast reply: %s", e)
            return
        self.settled(call, settled)

    def reduced(self, future, msg):
        """Resolve a reduction: its value, or the engines' errors."""
        client = self.client
        try:
            state, value, raised, failed = B.reduced_parts(msg)
            reduction = Reduction(state.get("op"))
            reduction.add_partial(state, value, take=client._shared.take_value)  # a big value of this host: by name
        except (P.ProtocolError, ValueError, TypeError) as e:
            log.error("An invalid reduction reply: %s", e)
            future.set_result(P.ProtocolError(f"the tree's reply to this reduction cannot be read: {e}"))  # no wait
            return
        resolve_reduction(client._codec, future, reduction, raised, failed)


LOST = "Relay node root lost the request (it restarted, or dropped the request)"


class RootWatch:
    def __init__(
        self, interval: float = 0.5, timeout: float = 10.0, clock: Callable[[], float] = time.monotonic, most: int = 256
    ):
        self.interval, self.timeout, self.clock, self.most = interval, timeout, clock, most
        self.in_flight: dict[str, float] = {}  # msg_id -> when it was handed to the socket
        self.pings: deque[float] = deque()  # when each unanswered ping went out, oldest first
        self.copies = CallCopies()  # what each call needs to go again (``ReplyFiling.again``)

    def sent(self, msg_id: str):
        self.in_flight[msg_id] = self.clock()

    def done(self, msg_id: str):
        """The request ended: it is not watched, nor sent again."""
        self.in_flight.pop(msg_id, None)
        self.copies.done(msg_id)

    def tick(self) -> tuple[list[str], list[tuple[str, str]]]:
        """``(ids to ping about, [(msg_id, why)] lost)``."""
        now, pings = self.clock(), self.pings
        if not self.in_flight:
            pings.clear()
            return [], []
        if pings and now - pings[0] > self.timeout:
            why = f"Relay node root has not answered for {self.timeout:g} s"
            lost = [(m, why) for m, t in list(self.in_flight.items()) if t <= pings[0]]
            for m, _ in lost:
                del self.in_flight[m]
            pings.clear()
            return [], lost
        ids = [m for m, t in list(self.in_flight.items()) if now - t >= self.interval][: self.most]
        if ids:
            pings.append(now)
        return ids, []

    def pong(self, unknown) -> list[tuple[str, str]]:
        """The root answered its oldest ping: the listed requests it did not hold
        then are lost (not one sent again since: the root had not had it yet)."""
        asked = self.pings.popleft() if self.pings else self.clock()
        in_flight = self.in_flight
        lost = [(m, LOST) for m in unknown if isinstance(m, str) and in_flight.get(m, asked + 1) <= asked]
        for m, _ in lost:
            del in_flight[m]
        return lost

    def lose_all(self, why: str) -> list[tuple[str, str]]:
        """Every request in flight is lost (the controller restarted): ``[(msg_id, why)]``."""
        lost = [(m, why) for m in self.in_flight]
        self.in_flight.clear()
        self.pings.clear()
        return lost
