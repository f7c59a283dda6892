"""Across hosts, on the multi-host test bed: a controller host and three
engine hosts, each a network namespace, real engines on each (issue 16).

Each engine host runs one host relay, started by its engines; one request
crosses each host's link per call. Needs root (network namespaces): CI has
it and must not skip (``CI=true`` turns a skip into a failure).
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from contextlib import contextmanager

import ipyparallel as ipp
import numpy as np
import pytest
from cluster_util import every_operation, gated_clients, skip_or_fail, terminal_shell, until
from ipyparallel import error
from tcpgate import RemoteGate

import ipyparallel_broadcast as ipb
from ipyparallel_broadcast.tools.bedcluster import BedCluster
from ipyparallel_broadcast.tools.netbed import NetBed

pytestmark = pytest.mark.multihost

PER_HOST = 3
GATE = os.path.join(os.path.dirname(__file__), "tcpgate.py")
MODES = [True, False, ipb.Batch(2)]
MODE_IDS = ["coalescing", "streaming", "batch2"]


def needs_bed():
    why = NetBed.available()
    if why:
        skip_or_fail(why, "the multi-host tests")


@pytest.fixture(scope="module")
def bed():
    needs_bed()
    with NetBed(hosts=3) as bed, BedCluster(bed, depth=1, fanout=2) as cluster:
        for host in bed.hosts:
            cluster.start_engines(host, PER_HOST)
        cluster.rc = cluster.client(wait_for=3 * PER_HOST)
        # the relays as the engines first registered, before any test kills one
        cluster.first_relays, cluster.first_ids = relays(cluster.rc), list(cluster.rc.ids)
        yield cluster


def relays(rc):
    """Host relays by label, from a stats survey: {label: stats}."""
    return {n["host"]: n for n in rc.broadcast_stats() if n.get("host")}


def test_each_host_runs_one_relay_serving_its_engines(bed):
    rc = bed.rc
    first = bed.first_relays
    assert len(first) == 3 and all(n["engines"] == PER_HOST for n in first.values())
    # each registered its engines with the hub, by host (``relay.registrar``); a relay
    # that a later test killed is started again by its engines, which join it, not register
    assert all(n["registered_here"] == PER_HOST for n in first.values())
    assert sorted(e for n in first.values() for e in n["eids"]) == bed.first_ids
    found = relays(rc)
    assert set(found) == set(first) and all(n["engines"] == PER_HOST for n in found.values())
    layout = rc.broadcast_tree()
    assert set(layout.hosts) == set(found)
    for label in found:
        assert f"host {label}: engines" in repr(layout)


def test_one_copy_of_a_push_crosses_each_host_link(bed):
    rc, hosts = bed.rc, bed.bed.hosts
    data = np.zeros(4 * 2**20, dtype=np.uint8)
    before = [bed.bed.link_bytes(h)[0] for h in hosts]
    rc.broadcast_view().push(dict(data=data), block=True)
    received = [bed.bed.link_bytes(h)[0] - b for h, b in zip(hosts, before)]
    assert all(data.nbytes <= r < 1.1 * data.nbytes for r in received), received


def test_each_host_maps_one_copy_of_a_big_push_though_all_share_one_dev_shm(bed):
    rc = bed.rc
    before = relays(rc)
    data = np.arange(2**20, dtype=np.float64)
    view = rc.broadcast_view(block=True)
    view.push(dict(big=data))
    assert view.apply(_mapped_sum) == [(True, float(data.sum()))] * len(rc.ids)
    after = relays(rc)
    for label, n in after.items():  # each host relay's engines are its own, not the others'
        assert n["shm_local"] == PER_HOST
        assert n["shm_segments"] - before[label]["shm_segments"] == 1
        assert n["shm_saved"] - before[label]["shm_saved"] == PER_HOST * data.nbytes
    root = next(s for s in rc.broadcast_stats() if s["node"] == "root")
    assert root["shm_local"] == 0  # no engine on the controller's host


@ipp.interactive
def _data_size():
    return int(data.size)  # noqa: F821


@ipp.interactive
def _mapped_sum():
    with open("/proc/self/maps") as f:
        mapped = any("ipb-shm-" in line for line in f)
    return mapped, float(big.sum())  # noqa: F821


@pytest.mark.parametrize("coalescing", MODES, ids=MODE_IDS)
def test_every_operation_through_host_relays(bed, coalescing):
    every_operation(bed.rc, coalescing)


def test_outputs_errors_and_hub_records_through_host_relays(bed):
    rc = bed.rc
    ar = rc.broadcast_view().apply_async(lambda: print("hello") or 1 / 0)
    with pytest.raises(error.CompositeError):
        ar.get(30)
    assert ar.stdout == ["hello\n"] * len(rc.ids)
    query = {"msg_id": {"$in": ar.msg_ids}}
    until(
        lambda: (
            len(rc.db_query(query, keys=["completed"])) == len(rc.ids)
            and all(r["completed"] for r in rc.db_query(query, keys=["completed"]))
        ),
        what="the hub to file every engine's result from the host bundles",
    )


def test_a_traced_call_is_stamped_by_the_host_relays(bed):
    rc = bed.rc
    ar = rc.broadcast_view(trace=True).apply_async(lambda: 1)
    ar.get(30)
    places = {e["where"] for e in ar.trace}
    assert {f"host {label}" for label in relays(rc)} <= places


def _gate_until(path):
    import os
    import time

    while not os.path.exists(path):
        time.sleep(0.02)
    return os.getpid()


@pytest.mark.parametrize("coalescing", [True, False], ids=["coalescing", "streaming"])
def test_stock_clients_broadcast_view_through_host_relays(bed, coalescing):
    """ipyparallel's own BroadcastView (a stock client) through our tree and
    its host relays: replies as the engines signed them, in target order."""
    rc = ipp.Client(bed._file("client"))
    try:
        view = rc.broadcast_view(is_coalescing=coalescing)
        assert view.apply_sync(lambda x: x * 2, 4) == [8] * len(rc.ids)
    finally:
        rc.close()


@pytest.mark.parametrize("coalescing", MODES, ids=MODE_IDS)
def test_a_killed_host_relay_fails_its_engines_by_name_and_comes_back(bed, coalescing, tmp_path):
    rc = bed.rc
    label, victim = sorted(relays(rc).items())[0]
    gate = tmp_path / "gate"
    ar = rc.broadcast_view(coalescing=coalescing).apply_async(_gate_until, str(gate))
    os.kill(victim["pid"], signal.SIGKILL)
    gate.touch()
    by_engine = dict(zip(rc.ids, ar.get(timeout=60, return_exceptions=True)))
    for eid, r in by_engine.items():
        if eid in victim["eids"]:
            assert isinstance(r, error.RemoteError) and f"Host relay {label}" in str(r), r
        else:
            assert isinstance(r, int), r
    until(
        lambda: relays(rc).get(label, {}).get("pid") not in (None, victim["pid"]),
        what="the host's engines to start its relay again",
    )
    until(lambda: relays(rc)[label]["engines"] == PER_HOST, what="the engines to be back")
    assert rc.broadcast_view(victim["eids"]).apply_sync(lambda: 5) == [5] * PER_HOST


@pytest.fixture
def shell(tmp_path):
    os.environ["IPYTHONDIR"] = str(tmp_path / "ipython")
    with terminal_shell() as shell:
        yield shell


def test_curve_on_every_link_stock_engines_beside_ours_and_px(shell):
    """CurveZMQ on: the hosts' links and the host relays' local links are
    encrypted too. Stock ipengines on one host reach the controller-side leaves
    beside our engines (behind their relay) on another; ``%px`` reaches all."""
    from IPython.utils.io import capture_output

    if NetBed.available():
        pytest.skip(NetBed.available())  # the module fixture already failed under CI
    with NetBed(hosts=2) as bed, BedCluster(bed, controller_args=["--IPController.enable_curve=True"]) as cluster:
        cluster.start_engines(bed.hosts[0], 2)
        cluster.start_engines(bed.hosts[1], 2, kind="stock")
        rc = cluster.client(wait_for=4)
        found = relays(rc)
        assert len(found) == 1 and next(iter(found.values()))["engines"] == 2
        for coalescing in MODES:
            view = rc.broadcast_view(coalescing=coalescing, block=True)
            assert view.apply_sync(lambda: 1) == [1] * 4
        view.activate("_bed")
        with capture_output(display=False) as io:
            shell.run_cell_magic("px_bed", "--no-stream", "import os; print('pid', os.getpid())")
        assert len(re.findall(r"pid (\d+)", io.stdout)) == 4


def whole(bed):
    """The shared bed with each host serving its ``PER_HOST`` engines. A host
    whose engines the hub dropped while another bed loaded the machine (its
    relay's heart late past the controller's ``2.4 s``, found in the CI runs)
    gets engines again once those have exited; a relay killed by a test comes
    back by itself."""
    rc = bed.rc

    def served(label):
        return relays(rc).get(label, {}).get("engines") == PER_HOST

    for host in bed.bed.hosts:
        label = label_of(bed.bed, host)
        until(lambda h=host, lb=label: served(lb) or not bed.bed.pids(h), what=f"host {label} served, or emptied")
        if not served(label):
            bed.start_engines(host, PER_HOST)
    until(lambda: len(relays(rc)) == 3 and all(n["engines"] == PER_HOST for n in relays(rc).values()), what="3 relays")


def label_of(bed, host):
    import subprocess
    import sys

    code = "from ipyparallel_broadcast.host.link import host_label; print(host_label())"
    return subprocess.run(
        ["ip", "netns", "exec", host.netns, sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()


@contextmanager
def slow_bed(*extra_args):
    """3 hosts of one engine each, every link at 50 Mbit/s, a node timeout of
    1.5 s: (bed, client)."""
    needs_bed()
    args = ["--BroadcastController.node_timeout=1.5", "--BroadcastController.ping_interval=0.2", *extra_args]
    with NetBed(hosts=3) as bed, BedCluster(bed, depth=0, controller_args=args) as cluster:
        for host in [bed.controller] + bed.hosts:
            bed.limit(host, "50mbit")
        for host in bed.hosts:
            cluster.start_engines(host, 1)
        yield bed, cluster.client(wait_for=3)


def test_a_big_push_on_slow_links_is_not_taken_for_a_dead_host_and_a_dead_host_still_is():
    """Links capped so that the push takes longer than the node timeout: pings
    on the pulse link keep the busy hosts alive; a host killed mid-transfer
    is still found, and its engine fails by name while the others finish."""
    from ipyparallel_broadcast.tools.netbed import kill_namespace

    with slow_bed() as (bed, rc):  # the push below needs about 4 s at 50 Mbit/s
        view = rc.broadcast_view()
        assert view.apply_sync(lambda: 1) == [1] * 3
        data = np.zeros(8 << 20, dtype=np.uint8)
        view.push(dict(data=data), block=True)  # no EngineError: busy is not dead
        assert view.apply_sync(_data_size) == [data.size] * 3
        victim = bed.hosts[-1]
        (cut,) = relays(rc)[label_of(bed, victim)]["eids"]
        start = bed.link_bytes(victim)[0]
        ar = view.push(dict(data=data), block=False)
        until(lambda: bed.link_bytes(victim)[0] - start > 2 << 20, what="the push to be under way")
        kill_namespace(victim.netns)
        results = dict(zip(rc.ids, ar.get(timeout=60, return_exceptions=True)))
        assert isinstance(results.pop(cut), error.RemoteError)
        assert list(results.values()) == [None, None]


@ipp.interactive
def _late_value(late, seconds):
    import time

    eid = get_ipython().kernel.engine_id  # noqa: F821
    if eid == late:
        time.sleep(seconds)
    return np.full(1 << 18, 1.0 + eid)  # 2 MiB: past the data plane's threshold, so it goes host to host


def test_a_big_reduce_whose_last_host_computes_for_longer_than_the_stall_time_still_combines():
    """The hosts before it wait in the chain as long as the leaf does: not a
    node timeout (here 1.5 s, so a stall is 3 s; the last engine takes 7 s)."""
    with slow_bed("--BroadcastController.host_chunk_size=262144") as (bed, rc):
        hosts = relays(rc).values()  # the controller's settings reach the relays its engines start
        assert [(n["node_timeout"], n["ping_interval"], n["bulk_chunk"]) for n in hosts] == [(1.5, 0.2, 262144)] * 3
        view = rc.broadcast_view(block=True)
        view.execute("import numpy as np")
        late = max(rc.ids)
        result = view.reduce(_late_value, late, 7.0, op="sum")
        np.testing.assert_array_equal(result, np.full(1 << 18, sum(1.0 + e for e in rc.ids)))
        assert all(n["chain_sent"] for n in relays(rc).values())  # (it went by the chain)


def test_a_big_reduce_up_two_trees_enters_the_controller_once_and_a_host_killed_mid_way_is_named():
    """Each half of the value climbs its own tree of the hosts; every host
    sends each half once. A host killed while the others wait for it: the
    call fails naming it, and the survivors answer the next one."""
    from ipyparallel_broadcast.tools.netbed import kill_namespace

    with slow_bed("--BroadcastController.host_reduce_shape=two trees") as (bed, rc):
        view = rc.broadcast_view(block=True)
        view.execute("import numpy as np")
        into = bed.link_bytes(bed.controller)[0]
        result = view.reduce(_own_value, op="sum")  # 8 MiB from each engine: 16 chunks
        into = bed.link_bytes(bed.controller)[0] - into
        np.testing.assert_array_equal(result, np.arange(1 << 20, dtype=np.float64) * sum(1 + e for e in rc.ids))
        (leaf,) = [s for s in rc.broadcast_stats() if s.get("chain_shape")]  # (the root, at depth 0)
        assert leaf["chain_shape"] == "two trees"
        assert [n["chain_sent"] for n in relays(rc).values()] == [16] * 3  # each half once from each host
        assert into < 1.3 * result.nbytes
        late, found = max(rc.ids), relays(rc)
        label = next(label for label in found if found[label]["eids"] == [late])
        victim = next(h for h in bed.hosts if label_of(bed, h) == label)
        ar = view.reduce(_late_value, late, 600.0, op="sum", block=False)
        until(lambda: sum(n["chain_sent"] for n in relays(rc).values()) > 3 * 16, what="the others' halves to go")
        kill_namespace(victim.netns)
        with pytest.raises(Exception, match=re.escape(label)) as raised:
            ar.get(timeout=60)
        assert "reduce" in str(raised.value).lower()
        survivors = rc.broadcast_view(targets=[e for e in rc.ids if e != late])
        assert survivors.apply_sync(lambda: 5) == [5, 5]


def test_a_big_push_goes_host_to_host_in_chunks_and_leaves_the_controller_about_once(bed):
    rc = bed.rc
    whole(bed)  # every host's relay up and serving its engines (an earlier test may have killed one)
    before = {s["node"]: s for s in rc.broadcast_stats()}
    data = np.arange(1 << 20, dtype=np.float64)  # 8 MiB, in chunks of a size the leaf picks
    out = bed.bed.link_bytes(bed.bed.controller)[1]
    view = rc.broadcast_view(block=True)
    view.push(dict(big=data))
    out = bed.bed.link_bytes(bed.bed.controller)[1] - out
    assert view.apply(_mapped_sum) == [(True, float(data.sum()))] * len(rc.ids)
    after = {s["node"]: s for s in rc.broadcast_stats()}
    same = {k: before[k] if before.get(k, {}).get("pid") == after[k].get("pid") else {} for k in after}
    moved = {
        k: {f: after[k][f] - same[k].get(f, 0) for f in ("bulk_sent", "bulk_received", "bulk_forwarded")} for k in after
    }  # a relay restarted by an earlier test counts from zero
    leaves = [k for k in after if not after[k].get("host") and moved[k]["bulk_sent"]]
    relays_moved = [moved[k] for k in after if after[k].get("host")]
    plan = after[leaves[0]]["bulk_last"]
    n = -(-data.nbytes // plan["chunk"])
    assert plan["chunks"] == n and plan["shape"] == "chain" and n >= 2
    assert all(m["bulk_received"] == n for m in relays_moved)  # each host got each chunk once
    assert len(relays_moved) == 3
    # every host hangs under the first leaf: one chain, one copy out of the controller host
    assert [after[k]["node"] for k in leaves] == ["0"] and moved[leaves[0]]["bulk_sent"] == n
    assert out < 1.3 * data.nbytes
    shown = repr(rc.broadcast_tree())  # the data plane: the chunks' path from each leaf
    assert shown.count(f"chunks of the last big request ({n} of") == len(leaves)
    assert all(label in shown.split("chunks of the last", 1)[1] for label in relays(rc))


@ipp.interactive
def _own_value():
    return np.arange(1 << 20, dtype=np.float64) * (1 + get_ipython().kernel.engine_id)  # noqa: F821


def test_a_big_reduce_goes_host_to_host_and_enters_the_controller_about_once_per_leaf(bed):
    rc = bed.rc
    whole(bed)
    view = rc.broadcast_view(block=True)
    view.execute("import numpy as np")
    before = {s["node"]: s for s in rc.broadcast_stats()}
    into = bed.bed.link_bytes(bed.bed.controller)[0]
    result = view.reduce(_own_value, op="sum")  # 8 MiB from each engine: 16 chunks
    into = bed.bed.link_bytes(bed.bed.controller)[0] - into
    np.testing.assert_array_equal(result, np.arange(1 << 20, dtype=np.float64) * sum(1 + e for e in rc.ids))
    after = {s["node"]: s for s in rc.broadcast_stats()}
    chained = [k for k in after if after[k].get("host") and after[k]["chain_sent"] > before[k].get("chain_sent", 0)]
    # the first leaf chains every host: one value enters the controller host (one per host without)
    assert len(chained) == 3
    assert into < 1.3 * result.nbytes
    link = bed.bed.link_bytes(bed.bed.controller)
    view.allreduce(_own_value, op="max", name="peak")
    link = [now - then for now, then in zip(bed.bed.link_bytes(bed.bed.controller), link)]
    expected = float((1 << 20) - 1) * max(1 + e for e in rc.ids)
    assert view.apply(ipp.interactive(lambda: float(peak[-1]))) == [expected] * len(rc.ids)  # noqa: F821
    # round the ring of hosts: each host wrote each of the value's 16 chunks; none crossed the controller's link
    hosts = [s for s in rc.broadcast_stats() if s.get("host")]
    assert [n["ring_gathered"] - before.get(n["node"], {}).get("ring_gathered", 0) for n in hosts] == [16] * 3
    assert max(link) < 0.1 * result.nbytes


def test_a_host_that_feeds_others_killed_mid_push_is_healed_around():
    """A chain of three hosts at 50 Mbit/s; the first, which feeds the others,
    dies mid-push: its engine fails by name, the leaf feeds the other two
    itself, and their engines get the whole array once."""
    from ipyparallel_broadcast.host import shm
    from ipyparallel_broadcast.tools.netbed import kill_namespace

    chunks = ("--BroadcastController.host_chunk_fanout=1", "--BroadcastController.host_chunk_size=524288")
    with slow_bed(*chunks) as (bed, rc):  # (8 MiB: 16 chunks)
        view = rc.broadcast_view()
        found = relays(rc)
        head_label = min(found, key=lambda label: min(found[label]["eids"]))  # the chain's order: targets'
        head = next(h for h in bed.hosts if label_of(bed, h) == head_label)
        (cut,) = found[head_label]["eids"]
        data = np.ones(8 << 20, dtype=np.uint8)  # about 1.4 s on one link
        start = bed.link_bytes(head)[0]
        ar = view.push(dict(data=data), block=False)
        until(lambda: bed.link_bytes(head)[0] - start > 2 << 20, what="the push to be under way")
        kill_namespace(head.netns)
        results = dict(zip(rc.ids, ar.get(timeout=60, return_exceptions=True)))
        failed = results.pop(cut)
        assert isinstance(failed, error.RemoteError) and "Host relay" in str(failed)
        assert list(results.values()) == [None, None]
        survivors = rc.broadcast_view(targets=sorted(results))
        assert survivors.apply_sync(_data_size) == [data.size] * 2
        stats = {s["node"]: s for s in rc.broadcast_stats()}
        assert stats["root"]["bulk_sent"] > 16  # the head's chunks, and again to the hosts it fed
        # each survivor took each chunk once, whether it came from the head or from the leaf
        assert [s["bulk_received"] for s in stats.values() if s.get("host")] == [16, 16]
    # the killed relay's segment (it was writing the chunks into it) went with the bed
    left = [n for n in os.listdir(shm.directory()) if n.startswith(f"ipb-shm-{os.getuid()}-")]
    assert not [n for n in left if not shm.pid_alive(n.split("-")[3])], left


def test_a_push_down_two_trees_reaches_every_engine_and_the_next_is_planned_for_the_link_as_timed():
    """Two binary trees of the three hosts (``host_push_shape``): even chunks
    down one, odd down its mirror; every engine gets the exact bytes, and the
    leaf sends one copy. The first push is planned for a 10 Gbit/s link; the
    leaf times it, so the next is planned for the 50 Mbit/s link it has, in
    smaller chunks."""
    with slow_bed("--BroadcastController.host_push_shape=two trees") as (bed, rc):
        view = rc.broadcast_view(block=True)
        data = np.arange(1 << 20, dtype=np.float64)  # 8 MiB
        plans = []
        for _ in range(2):
            view.push(dict(big=data))
            assert view.apply(_mapped_sum) == [(True, float(data.sum()))] * 3
            (leaf,) = [s for s in rc.broadcast_stats() if s.get("bulk_last")]
            plans.append(leaf["bulk_last"])
        assert [p["shape"] for p in plans] == ["two trees"] * 2
        assert plans[0]["link"] == 10e9 and 10e6 < plans[1]["link"] < 60e6  # (its links are capped at 50 Mbit/s)
        assert plans[1]["chunk"] < plans[0]["chunk"]
        received = [n["bulk_received"] for n in relays(rc).values()]
        assert received == [plans[0]["chunks"] + plans[1]["chunks"]] * 3  # each host got each chunk once
        assert "two binary trees" in repr(rc.broadcast_tree())


def test_a_host_cut_off_fails_its_engines_naming_it_and_nothing_hangs(bed, tmp_path):
    """The cut-off host's engines exit; the host gets engines again afterwards,
    so that the tests after this one find the bed whole, whatever the order."""
    rc, host = bed.rc, bed.bed.hosts[-1]
    whole(bed)
    label = label_of(bed.bed, host)
    cut = relays(rc)[label]["eids"]
    gate, targets = tmp_path / "gate", list(rc.ids)
    ar = rc.broadcast_view(targets).apply_async(_gate_until, str(gate))
    bed.bed.set_link(host, False)
    gate.touch()
    results = dict(zip(targets, ar.get(timeout=60, return_exceptions=True)))
    for eid, r in results.items():
        if eid in cut:
            assert isinstance(r, error.RemoteError) and label in str(r), r
        else:
            assert isinstance(r, int), r
    live = [e for e in rc.ids if e not in cut]
    assert rc.broadcast_view(live).apply_sync(lambda: 3) == [3] * len(live)
    until(lambda: not set(cut) & set(rc.ids), what="the hub to drop the cut-off engines")
    bed.bed.set_link(host, True)
    # the relay hears they were dropped and tells them; they exit, and so does it
    until(lambda: not bed.bed.pids(host), what="the cut-off host's engines and relay to exit")

    def nothing_left():  # no request pending, and no leaf keeps the host
        nodes = rc.broadcast_stats()
        return all(n.get("pending") == 0 and label not in (n.get("hosts") or ()) for n in nodes)

    until(nothing_left, what="nothing left of the cut-off host at the controller")
    assert rc.broadcast_view().apply_sync(lambda: 4) == [4] * len(rc.ids)
    bed.start_engines(host, PER_HOST)
    until(
        lambda: len(rc.ids) == 3 * PER_HOST and relays(rc).get(label, {}).get("engines") == PER_HOST,
        what="the host's engines back",
    )


def test_a_client_whose_subscription_is_late_sees_real_engines_behind_host_relays():
    """As ``test_roster``, across hosts: engines of a second host register
    behind its host relay, and one of the first host's leaves, while two
    clients' subscriptions to the hub are held at a gate."""
    needs_bed()
    with NetBed(hosts=2) as bed, BedCluster(bed, depth=1, fanout=2) as cluster:
        first, second = bed.hosts
        cluster.start_engines(first, 2)
        rc = cluster.client(wait_for=2)
        with open(os.path.join(cluster.profile_dir, "security", "ipcontroller-client.json")) as f:
            info = json.load(f)
        argv = [sys.executable, GATE, bed.controller.addr, str(info["notification"]), bed.controller.addr]
        pipes = dict(stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        with RemoteGate(bed.popen(bed.controller, argv, **pipes)) as gate:  # where the client reaches the hub
            ours, stock = gated_clients(info, gate)
            try:
                assert ours.ids == stock.ids == rc.ids
                leaving = rc.ids[0]
                cluster.start_engines(second, 2)
                rc.wait_for_engines(4, timeout=120)
                rc.shutdown(targets=leaving, block=True)
                until(lambda: leaving not in rc.ids and len(rc.ids) == 3, what="the hub's table")
                assert len(ours.ids) == 2  # nothing reached it yet
                gate.open()
                ours.wait_for_engines(3, timeout=60)
                until(lambda: ours.ids == rc.ids, what="our client's table to be the hub's")
                assert ours.broadcast_view().apply_sync(lambda: 1) == [1, 1, 1]
                stock.wait_for_engines(3, timeout=60)
                until(lambda: set(rc.ids) <= set(stock.ids), what="the stock client's registrations")
            finally:
                ours.close()
                stock.close()


def test_a_controller_killed_and_restored_keeps_the_engines_behind_host_relays(tmp_path):
    """The controller SIGKILLed and started again with ``--restore`` (issue
    59): 8 engines on 2 hosts are kept behind their host relays, with their
    ids and namespaces; a call pending across it ends once; an engine that
    died meanwhile is found dead."""
    needs_bed()
    with NetBed(hosts=2) as bed, BedCluster(bed, depth=1, fanout=2) as cluster:
        for host in bed.hosts:
            cluster.start_engines(host, 4)
        rc = cluster.client(wait_for=8)
        view = rc.broadcast_view()
        view.push(dict(kept="state"), block=True)
        pids = dict(zip(rc.ids, view.apply_sync(os.getpid)))
        gate = tmp_path / "gate"
        pending = view.apply_async(_gate_until, str(gate))
        cluster.kill_controller()
        victim = rc.ids[-1]
        os.kill(pids[victim], signal.SIGKILL)  # while the controller is away
        # away for longer than the client's controller_timeout (10 s): engines and relays wait
        # for it (an engine for IPEngine.max_heartbeat_misses checks, 65 s by default)
        time.sleep(12)
        cluster.restart_controller()
        gate.touch()
        for r in pending.get(timeout=60, return_exceptions=True):
            assert isinstance(r, int) or (isinstance(r, error.RemoteError) and r.ename == "EngineError"), r
        survivors = [e for e in pids if e != victim]
        until(lambda: rc.ids == survivors, timeout=60, what="the dead engine unregistered, the others kept")

        def answers():
            try:
                return view.apply_async(os.getpid).get(timeout=10) == [pids[e] for e in survivors]
            except (error.CompositeError, error.RemoteError, TimeoutError):
                return False

        until(answers, timeout=60, what="a broadcast answered by the same engines")
        assert view.pull("kept", block=True) == ["state"] * len(survivors)
        assert len(relays(rc)) == 2


def test_calls_passed_host_to_host_reach_every_engine_and_a_killed_head_is_named_with_the_hosts_below_it(
    tmp_path,
):
    """``host_fanout=2`` with three hosts: the leaf sends each call to two
    host relays and one passes it on to the third over its chunk socket
    (``relay.forwarding``). Every operation, both reply modes, outputs and a
    trace that every host stamped. A head killed mid-call fails its engines
    and those of the host below it, both named; the next call goes around it."""
    needs_bed()
    args = ["--BroadcastController.host_fanout=2"]
    with NetBed(hosts=3) as bed, BedCluster(bed, depth=0, controller_args=args) as cluster:
        for host in bed.hosts:
            cluster.start_engines(host, 2)
        rc = cluster.client(wait_for=6)
        for coalescing in MODES:
            every_operation(rc, coalescing)
        ar = rc.broadcast_view(trace=True).apply_async(lambda: print("hi") or 1)
        assert ar.get(30) == [1] * 6 and ar.stdout == ["hi\n"] * 6
        assert {f"host {label}" for label in relays(rc)} <= {e["where"] for e in ar.trace}
        stats = rc.broadcast_stats()
        assert [n["calls_split"] > 0 for n in stats if not n.get("host")] == [True]
        before = {label: n["calls_passed"] for label, n in relays(rc).items()}
        assert rc.broadcast_view().apply_sync(lambda: 2) == [2] * 6
        by_label = relays(rc)
        passing = [label for label, n in by_label.items() if n["calls_passed"] > before[label]]
        assert len(passing) == 1  # (three hosts, two heads: one passes the call on; which, by the targets' order)
        (head,) = passing
        below = [label for label in by_label if label != head]
        gate = tmp_path / "gate"
        ar = rc.broadcast_view().apply_async(_gate_until, str(gate))
        os.kill(by_label[head]["pid"], signal.SIGKILL)
        gate.touch()
        results = dict(zip(rc.ids, ar.get(timeout=60, return_exceptions=True)))
        failed = {e for e, r in results.items() if isinstance(r, error.RemoteError)}
        assert all(isinstance(results[e], int) for e in set(results) - failed)
        assert set(by_label[head]["eids"]) <= failed and f"Host relay {head}" in str(results[min(failed)])
        passed_to = [label for label in below if set(by_label[label]["eids"]) <= failed]
        assert len(passed_to) == 1  # the host it was passing the call to, named too
        eid = by_label[passed_to[0]]["eids"][0]
        assert f"passing the call to host relay {passed_to[0]}," in str(results[eid])
        until(lambda: relays(rc).get(head, {}).get("engines") == 2, what="the head's engines to start it again")
        assert rc.broadcast_view().apply_sync(lambda: 5) == [5] * 6
