"""A client that connects while engines register or unregister sees every
engine (``controller.roster``, ``client.roster``), with simulated engines
against a real controller.

The moment is held, not guessed: the client's subscription to the hub's
notifications goes through a TCP gate (``TcpGate``) kept shut while engines
register and die, so every notification of theirs is published before the
subscription exists. Without the roster such a client keeps the table of its
connection reply for good (ipyparallel's client does, on a stock hub).
"""

import glob
import json
import os
import tempfile
import threading

import ipyparallel as ipp
import pytest
import zmq
from cluster_util import gated_clients, quiet_config, until
from jupyter_client.session import Session
from tcpgate import TcpGate

import ipyparallel_broadcast as ipb
from ipyparallel_broadcast.controller.roster import REPLAY_TOPIC
from ipyparallel_broadcast.tools.sim import SimEngines
from ipyparallel_broadcast.wire import protocol as P
from ipyparallel_broadcast.wire.naming import ROSTER_HELLO_PREFIX

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def controller():
    with tempfile.TemporaryDirectory(prefix="ipb-roster-") as profile_dir:
        cluster = ipb.Cluster(n=0, depth=1, fanout=2, profile_dir=profile_dir, config=quiet_config(), log_level=40)
        cluster.start_controller_sync()
        rc = cluster.connect_client_sync()  # a witness, connected before any engine
        (engine_file,) = glob.glob(os.path.join(profile_dir, "security", "*-engine.json"))
        (client_file,) = glob.glob(os.path.join(profile_dir, "security", "*-client.json"))
        with open(client_file) as f:
            info = json.load(f)
        farm = SimEngines(engine_file, 0)
        try:
            yield rc, info, farm
        finally:
            rc.close()
            farm.stop()
            cluster.stop_cluster_sync()


def test_a_client_whose_subscription_is_late_sees_every_engine_registered_and_gone(controller):
    rc, info, farm = controller
    first = farm.add(16)
    until(lambda: set(first) <= set(rc.ids), what="the first engines")
    port = info["notification"]
    with TcpGate(info["interface"].split("//")[1], port) as gate:
        ours, stock = gated_clients(info, gate)
        try:
            snapshot = set(rc.ids)
            assert set(ours.ids) == snapshot and set(stock.ids) == snapshot
            later = farm.add(200)  # registered while the gate is shut...
            dead = first[:3]
            for eid in dead:  # ... and these unregistered
                farm.kill(eid)
            until(lambda: set(later) <= set(rc.ids) and not set(dead) & set(rc.ids), what="the hub's table")
            assert set(ours.ids) == snapshot  # nothing reached them: they missed it all
            gate.open()
            ours.wait_for_engines(len(rc.ids), timeout=60)
            until(lambda: ours.ids == rc.ids, what="our client's table to be the hub's")
            assert ours._engine_roster.sync.rosters == 1 and ours._engine_roster.sync.gaps == 0
            view = ours.broadcast_view()
            assert view.apply_sync(lambda: 1) == [b""] * len(rc.ids)  # every engine, on "all"
            # a stock client is sent the registrations it missed (not the unregistrations)
            stock.wait_for_engines(len(rc.ids), timeout=60)
            until(lambda: set(rc.ids) <= set(stock.ids), what="the stock client's registrations")
            assert set(stock.ids) - set(rc.ids) <= set(dead)
        finally:
            ours.close()
            stock.close()


def test_clients_made_while_hundreds_register_each_see_them_all(controller):
    """Many clients, ours and stock, made one after another while 300 more
    engines register: each ends with every engine, however its
    subscription's moment fell."""
    rc, info, farm = controller
    before = set(rc.ids)
    registering = threading.Thread(target=farm.add, args=(300,))
    clients = []
    registering.start()
    try:
        while registering.is_alive() or len(clients) < 8:
            if len(clients) >= 40:
                break
            clients.append(ipb.Client(info, roster_timeout=0) if len(clients) % 2 else ipp.Client(info))
    finally:
        registering.join()
    try:
        until(lambda: len(set(rc.ids) - before) == 300, what="300 more engines at the hub")
        want = len(rc.ids)
        for client in clients:
            client.wait_for_engines(want, timeout=60)
            assert set(rc.ids) <= set(client.ids)
            if isinstance(client, ipb.Client):
                assert client.ids == rc.ids
    finally:
        for client in clients:
            client.close()


def test_a_leafs_lookup_leaves_no_reply_for_a_subscriber_to_replay_from(controller):
    """A leaf asks the hub for its engine table (``TABLE_ONLY``) and never
    subscribes as a client does: its reply, counted as a client's, stayed
    unmatched, and every later subscriber to everything was replayed every
    registration since (at 4,096 engines, each client connecting was sent
    thousands of messages and waited seconds for its roster behind them)."""
    rc, info, farm = controller
    codec = P.Codec(Session(key=info["key"].encode(), signature_scheme=info["signature_scheme"]))
    ctx = zmq.Context.instance()
    leaf = ctx.socket(zmq.DEALER)
    leaf.LINGER = 0
    leaf.connect(f"{info['interface']}:{info['registration']}")
    sub = ctx.socket(zmq.SUB)
    sub.LINGER = 0
    try:
        leaf.send_multipart(codec.pack("connection_request", {P.TABLE_ONLY: True}))
        assert leaf.poll(30_000), "the hub did not answer the lookup"
        leaf.recv_multipart()
        later = farm.add(4)
        until(lambda: set(later) <= set(rc.ids), what="the engines registered after the lookup")
        hello = ROSTER_HELLO_PREFIX + b"a-subscriber-with-no-reply"
        sub.setsockopt(zmq.SUBSCRIBE, b"")  # as a stock client, but with no connection reply of its own
        sub.setsockopt(zmq.SUBSCRIBE, hello)  # answered once the subscriptions before it are applied
        sub.connect(f"{info['interface']}:{info['notification']}")
        topics = []
        while not topics or topics[-1] != hello:
            assert sub.poll(30_000), "no roster came"
            topics.append(sub.recv_multipart()[0])
        assert not [t for t in topics if t.startswith(REPLAY_TOPIC)]
    finally:
        leaf.close()
        sub.close()
