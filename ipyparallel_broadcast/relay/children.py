"""A node's children and whether they are alive.

Interior nodes have the relay nodes below them, fixed by the tree's shape;
a leaf has the host relays that said hello (they come and go). A node pings
them every ``ping_interval`` (further apart past ``FULL_RATE_CHILDREN``); each answers with its ``boot`` (new each time
its process starts). A child that restarted, or stayed silent for
``node_timeout``, is lost: the node fails what waited on it.

Host relays hang from their node over a network link that a big request can
fill for longer than ``node_timeout``; a ping queued behind it would make a
busy host look dead. So a node with a pulse link (``pulse_port``, a socket of
its own, hence a TCP connection of its own) tells host relays its port in
every ping; each connects to it, and from then on pings and pongs also go
that way, beside the bulk data instead of behind it, and no longer on the data
link (each costs the leaf a signed message each way, per host per interval).
A relay that stops hearing the pulse link (restarted, its connection broken)
says hello on the data link when its pings stop, unasked: pinged on the data
link again, it learns the port anew.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ..wire.topology import HOST_PREFIX, Path, node_identity, node_name
from .routes import Key

# children a node pings every ``ping_interval``; past them its pings come further apart, in
# proportion, as Dask stretches its workers' heartbeats with their number: a leaf under a hundred
# host relays pings as often per second as one under 16 (at most ``node_timeout`` / 4 apart, so
# a silent child is found as soon as before). Each ping and pong costs the leaf ~0.1 ms: 64 host
# relays at 32 a half-second held a leaf at 1.2 % of a core, idle.
FULL_RATE_CHILDREN = 16


class Children:
    def __init__(
        self, path: Path, digits: Iterable[int], clock: Callable[[], float], ping_interval: float, node_timeout: float
    ):
        self.clock, self.ping_interval, self.node_timeout = clock, ping_interval, node_timeout
        self.keys: dict[bytes, Key] = {node_identity(path + (d,)): d for d in digits}
        self.idents: dict[Key, bytes] = {k: i for i, k in self.keys.items()}
        self.names: dict[Key, str] = {d: node_name(path + (d,)) for d in self.idents}  # as stats say
        self.heard = {k: clock() for k in self.idents}  # child -> when it last spoke
        self.boots: dict[Key, str] = {}  # child -> the boot it last reported
        self.next_ping: float | None = clock() if self.keys and ping_interval else None
        self.pulsing: set[Key] = set()  # host relays pinged on the pulse link (alone)
        self.data_pinged: set[Key] = set()  # host relays pinged on the data link, not answered there yet
        self.bulk: dict[Key, str] = {}  # host relays' bulk sockets, where chunks go (``bulk``)

    @property
    def interval(self) -> float:
        """Seconds between this node's pings (``FULL_RATE_CHILDREN``); told to its children in each."""
        stretched = self.ping_interval * len(self.idents) / FULL_RATE_CHILDREN
        return max(self.ping_interval, min(stretched, self.node_timeout / 4))

    def __contains__(self, key) -> bool:
        return key in self.idents

    def __iter__(self):
        return iter(self.idents)

    def __len__(self):
        return len(self.idents)

    def key_of(self, ident: bytes) -> Key | None:
        return self.keys.get(ident)

    def add_host(self, ident: bytes) -> bytes:
        """A host relay said hello: a child from now on, keyed by its identity."""
        self.keys[ident] = self.idents[ident] = ident
        self.names[ident] = f"host {ident[len(HOST_PREFIX) :].decode(errors='replace')}"
        self.heard[ident] = self.clock()
        if self.next_ping is None and self.ping_interval:
            self.next_ping = self.clock()
        return ident

    def forget(self, key: bytes):
        """A host relay gone for good."""
        for table in (self.idents, self.names, self.heard, self.boots, self.bulk):
            table.pop(key, None)
        self.keys.pop(key, None)
        self.pulsing.discard(key)
        self.data_pinged.discard(key)

    def on_data_link(self) -> list[Key]:
        """The children pinged on the data link now: all but the host relays on
        the pulse link; those among them are to answer there (``data_pong``)."""
        keys = [k for k in self.idents if k not in self.pulsing]
        self.data_pinged.update(k for k in keys if isinstance(k, bytes))
        return keys

    def data_pong(self, key: Key) -> None:
        """A pong on the data link. From a host relay pinged on the pulse link
        alone, unasked, it says the relay does not hear that link (it restarted,
        or its pulse connection broke): pinged on the data link again, which tells
        it the pulse port anew."""
        if key in self.data_pinged:
            self.data_pinged.discard(key)  # the answer to a ping that went this way
        else:
            self.pulsing.discard(key)

    def bulk_link(self, key: bytes, url) -> None:
        """A host relay's pong named its bulk socket (or none)."""
        if isinstance(url, str) and url.startswith("tcp://") and len(url) < 256:
            self.bulk[key] = url
        else:
            self.bulk.pop(key, None)

    def phrase(self, key: Key) -> str:
        """How errors name it: "Relay node 0.1" or "Host relay h1"."""
        if isinstance(key, bytes):  # (one this relay passes calls to is not its child)
            return f"Host relay {key[len(HOST_PREFIX) :].decode(errors='replace')}"
        return f"Relay node {self.names.get(key, repr(key))}"

    def host_labels(self) -> list[str]:
        return sorted(self.names[k][5:] for k in self.idents if isinstance(k, bytes))

    def spoke(self, key: Key):
        self.heard[key] = self.clock()

    def pulse_heard(self, key: Key) -> None:
        """A host relay answered on the pulse link: pinged there alone from now on."""
        self.pulsing.add(key)
        self.spoke(key)

    def pulse_unreachable(self, ident: bytes) -> None:
        """The pulse link cannot reach this host relay: pinged on its data link again."""
        self.pulsing.discard(self.keys.get(ident))

    def knows_boot(self, key: Key) -> bool:
        """Whether ``key`` has answered a ping (or said hello) in this node's life."""
        return key in self.boots

    def pong(self, key: Key, boot: str) -> bool:
        """A child's boot id; True if it is a new one (the child restarted)."""
        known, self.boots[key] = self.boots.get(key), boot
        return known is not None and known != boot

    def silent(self, now: float) -> list[Key]:
        """Children silent for ``node_timeout`` (each once per silent spell);
        the next ping is due one interval from now."""
        self.next_ping = now + self.interval
        gone = [k for k, t in self.heard.items() if now - t > self.node_timeout]
        for key in gone:
            self.heard[key] = now
        return gone

    def after_pings(self):
        if not self.idents:
            self.next_ping = None
