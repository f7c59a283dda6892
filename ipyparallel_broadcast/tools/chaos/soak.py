"""The soak's bed and run: real engines on network-namespace hosts, simulated
hosts of ``SimEngines`` beside them, busy clients, the nemesis, the checker.

    python -m ipyparallel_broadcast.tools.chaos.soak --hosts 4 --engines 4 \\
        --sim-hosts 16 --sim-engines 64 --clients 3 --seconds 600 --json OUT

Needs root (network namespaces, a tmpfs for the shared-memory fault).
``benchmarks/scripts/chaos_soak.py`` runs it and writes the report.
"""

from __future__ import annotations

import argparse
import glob
import json
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time

import psutil

from ...compat import ipp
from ...relay.dataplane import pushplan, reduce_trees
from ..bedcluster import BedCluster
from ..netbed import Managed, NetBed
from ..sim import SimEngines
from . import checker, workload
from .engine_side import LOG_ENV
from .nemesis import FAULTS, Nemesis

FLOOD_PORT = 5999
SINK = (
    "import socket\ns = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    f"s.bind(('0.0.0.0', {FLOOD_PORT})); s.listen(64)\n"
    "import threading\n"
    "def drain(c):\n    while c.recv(1 << 20): pass\n"
    "while True:\n    c, _ = s.accept(); threading.Thread(target=drain, args=(c,), daemon=True).start()\n"
)
FLOOD = (
    f"import socket, sys, time\ns = socket.create_connection((sys.argv[1], {FLOOD_PORT}))\n"
    "end = time.time() + float(sys.argv[2]); b = bytes(1 << 20)\n"
    "while time.time() < end: s.sendall(b)\n"
)


class SoakBed(Managed):
    """The bed: ``hosts`` namespaces of ``engines`` real engines each, a
    controller host, and ``sim_hosts`` simulated hosts of ``sim_engines`` each."""

    def __init__(
        self,
        hosts=2,
        engines=2,
        sim_hosts=2,
        sim_engines=16,
        link="200mbit",
        node_timeout=3.0,
        shm_size="128m",
        reduce_shape="auto",
        push_shape="auto",
    ):
        self.n_hosts, self.per_host, self.n_sims, self.per_sim = hosts, engines, sim_hosts, sim_engines
        self.reduce_shape = reduce_shape  # a big reduce's way between hosts (``host_reduce_shape``)
        self.push_shape = push_shape  # ... a big push's (``host_push_shape``)
        self.link, self.node_timeout, self.shm_size = link, node_timeout, shm_size
        self.tmp = tempfile.TemporaryDirectory(prefix="ipb-soak-")
        self.shm_dir = os.path.join(self.tmp.name, "shm")
        self.log_dir = os.path.join(self.tmp.name, "engine-logs")
        self.sim_file = os.path.join(self.tmp.name, "sim_ids.json")
        self.engines: dict[str, list] = {}  # host name -> engine Popens
        self.sims = None
        self.killed: set = set()  # ids of simulated engines whose host was killed
        self.simulated: set = set()  # ids of every simulated engine, killed or not
        self.missing_since: dict[int, float] = {}  # simulated host (pid) -> since when some engines are missing
        self.lock = threading.Lock()
        self._env = {}

    # ------------------------------------------------------------- lifecycle
    def start(self):
        os.makedirs(self.shm_dir)
        os.makedirs(self.log_dir)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.shm_size}", "tmpfs", self.shm_dir], check=True)
        for name, value in (("IPB_SHM_DIR", self.shm_dir), (LOG_ENV, self.log_dir)):
            self._env[name] = os.environ.get(name)
            os.environ[name] = value  # what the controller, engines and simulated hosts inherit
        self.bed = NetBed(hosts=self.n_hosts).__enter__()
        args = [f"--BroadcastController.node_timeout={self.node_timeout}", "--BroadcastController.ping_interval=0.3"]
        args.append(f"--BroadcastController.host_reduce_shape={self.reduce_shape}")
        args.append(f"--BroadcastController.host_push_shape={self.push_shape}")
        # kept: the nemesis kills the controller too (a budget no soak spends)
        self.cluster = BedCluster(self.bed, depth=1, fanout=2, controller_args=args, kept=1000).__enter__()
        for host in [self.bed.controller] + self.bed.hosts:
            self.bed.limit(host, self.link)
        for host in self.bed.hosts:
            self.engines[host.name] = self.cluster.start_engines(host, self.per_host)
        self.bed.popen(
            self.bed.controller, [sys.executable, "-c", SINK], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self.rc = self.cluster.client(wait_for=self.n_hosts * self.per_host, timeout=300)
        self.url_file = self.cluster._file("client")
        with open(self.cluster._file("engine")) as f:
            info = json.load(f)
        self.key = info["key"].encode()
        self.sims = SimEngines(
            self.cluster._file("engine"), self.n_sims * self.per_sim, per_process=self.per_sim, hosts=True
        )
        self.sims.start(timeout=300)
        self._write_sims()
        self.rc.wait_for_engines(self.expected, timeout=300)

    def close(self):
        if self.sims is not None:
            self.sims.stop()
        for part in ("cluster", "bed"):
            if hasattr(self, part):
                getattr(self, part).__exit__(None, None, None)
        subprocess.run(["umount", "-l", self.shm_dir], check=False)
        for name, value in self._env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self.tmp.cleanup()

    @property
    def expected(self) -> int:
        return self.n_hosts * self.per_host + self.n_sims * self.per_sim

    # ------------------------------------------------------ what faults use
    def survey(self) -> list[dict]:
        return [n for n in self.rc.broadcast_stats(timeout=5) if not n.get("error")]

    def engine_pids(self) -> list[int]:
        with self.lock:
            return [p.pid for ps in self.engines.values() for p in ps if p.poll() is None]

    def controller_children(self) -> dict[str, int]:
        """The controller's child processes other than relay nodes, by name
        (``ipb-mux``, ``ipb-control``, ``ipb-task``, ``ipb-iopub``, ``ipb-heart``)."""
        children = psutil.Process(self.cluster.hub_pid()).children()
        return {p.name(): p.pid for p in children if p.name().startswith("ipb-") and "-node-" not in p.name()}

    def engine_uuids(self) -> list[str]:
        sims = set(self.sims.ids)
        engines = ipp.engine_uuids(self.rc)
        return [u for e, u in engines.items() if e not in sims] or list(engines.values())

    def urls(self) -> list[str]:
        """Every ROUTER the controller binds, for clients and for engines."""
        urls = []
        for kind in ("client", "engine"):
            with open(self.cluster._file(kind)) as f:
                info = json.load(f)
            ip, transport = info["interface"].split("://")[1], info["interface"].split("://")[0]
            for name in ("mux", "task", "control", "registration", "broadcast"):
                ports = info.get(name)
                for port in ports if isinstance(ports, list) else [ports]:
                    if isinstance(port, int):
                        urls.append(f"{transport}://{ip}:{port}")
        return urls

    def flood(self, host, seconds: float):
        self.bed.popen(
            host,
            [sys.executable, "-c", FLOOD, self.bed.controller.addr, str(seconds)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def kill_sim_host(self, rng: random.Random) -> str:
        with self.lock:
            if len(self.sims.processes) <= 1:
                raise RuntimeError("one simulated host left")
            ids = self.sims.kill_process(rng.randrange(len(self.sims.processes)))
            self.killed.update(ids)
        return f"simulated host of engines {ids[0]}..{ids[-1]}"

    def settle(self, timeout: float = 300):
        """After the faults: every engine replaced and registered, and none of
        the dead still registered (the hub unregisters them by heartbeat)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.top_up()
            ids = set(self.rc.ids)
            if len(ids) == self.expected and not ids & self.killed and set(self.sims.ids) <= ids:
                return
            time.sleep(1)
        ids = set(self.rc.ids)
        with self.lock:
            alive = {h: len([p for p in ps if p.poll() is None]) for h, ps in self.engines.items()}
        raise TimeoutError(
            f"the bed did not settle in {timeout:g} s: {len(ids)} engines registered of {self.expected}; "
            f"real engines registered {sorted(ids - set(self.sims.ids))}, running per host {alive}; "
            f"simulated engines not registered {sorted(set(self.sims.ids) - ids)}"
        )

    def _write_sims(self):
        """The ids of every simulated engine there has been: a call sent to
        one before its host was killed is checked as a simulated engine's."""
        self.simulated.update(self.sims.ids)
        with open(self.sim_file + ".new", "w") as f:
            json.dump(sorted(self.simulated), f)
        os.replace(self.sim_file + ".new", self.sim_file)

    DROPPED_AFTER = 5.0  # seconds a simulated host's engines may be missing before it is taken for dropped

    def top_up(self):
        """Replace what the faults took: engines that exited, simulated hosts
        killed, and simulated hosts whose engines the hub dropped (a relay
        paused past the heartbeat bound takes its host's engines: a real
        engine told so exits and is replaced here; a simulated one only
        falls silent, so its host is replaced whole)."""
        with self.lock:
            for host in self.bed.hosts:
                alive = [p for p in self.engines[host.name] if p.poll() is None]
                if len(alive) < self.per_host:
                    alive += self.cluster.start_engines(host, self.per_host - len(alive))
                self.engines[host.name] = alive
            registered, now = set(self.rc.ids), time.monotonic()
            for index in reversed(range(len(self.sims.processes))):
                proc, _, ids = self.sims.processes[index]
                if set(ids) <= registered:
                    self.missing_since.pop(proc.pid, None)
                elif now - self.missing_since.setdefault(proc.pid, now) >= self.DROPPED_AFTER:
                    self.killed.update(self.sims.kill_process(index))
                    self.missing_since.pop(proc.pid, None)
            missing = self.n_sims - len(self.sims.processes)
        for _ in range(missing):
            self.sims.add(self.per_sim)
        if missing:
            self._write_sims()


# ------------------------------------------------------------------- run
def run(
    bed: SoakBed,
    clients=3,
    seconds=60.0,
    bound=60.0,
    rate=1.0,
    seed=0,
    progress=print,
    faults=FAULTS,
    ops=workload.OPS,
    views=workload.VIEWS,
    settle_timeout=300.0,
    after_budget=None,
) -> dict:
    """Clients and nemesis for ``seconds``, then the bed settles (at most
    ``settle_timeout``) and a new client tries every operation (at most
    ``after_budget`` in all; no limit if None); returns what the checker needs."""
    ctx = multiprocessing.get_context("spawn")
    outs = [os.path.join(bed.tmp.name, f"client{i}.jsonl") for i in range(clients)]
    procs = [
        ctx.Process(
            target=workload.run,
            args=(bed.url_file, f"c{i}", seed + i, seconds, bound, bed.sim_file, outs[i], ops, views),
            daemon=True,
        )
        for i in range(clients)
    ]
    for p in procs:
        p.start()
    nemesis = Nemesis(bed, seed=seed, faults=faults)
    rng = random.Random(seed)
    start = time.time()
    next_top_up = start + 5
    while time.time() - start < seconds:
        time.sleep(min(rng.expovariate(rate), 5))
        fault = nemesis.strike()
        progress(f"{time.time() - start:6.1f} s  {fault}: {nemesis.log[-1][2]}")
        if time.time() > next_top_up:
            try:
                bed.top_up()
            except Exception as e:  # the bed is short for now; the soak goes on, and says so
                progress(f"{time.time() - start:6.1f} s  top-up failed: {type(e).__name__}: {e}")
            next_top_up = time.time() + 5
    nemesis.calm()
    # a client's last call ends within 3 bounds (wait, wait again, its output)
    join_by = time.monotonic() + 3 * bound + 60
    for p in procs:
        p.join(max(0.0, join_by - time.monotonic()))
    stuck = [i for i, p in enumerate(procs) if p.is_alive()]
    failed = [i for i, p in enumerate(procs) if not p.is_alive() and p.exitcode != 0]  # (a client that could not run)
    for p in procs:
        p.kill()
    try:
        bed.settle(settle_timeout)
        settled = "ok"
    except Exception as e:  # reported, and the checker still reads what happened
        settled = f"{type(e).__name__}: {e}"
    after = serves_after(bed, bound, budget=after_budget)
    records = [json.loads(line) for out in outs if os.path.exists(out) for line in open(out)]
    logs = {os.path.basename(p): open(p).read().split() for p in glob.glob(os.path.join(bed.log_dir, "*.log"))}
    verdict = checker.check(records, logs, bound)
    return dict(
        records=records,
        faults=nemesis.log,
        verdict=verdict,
        after=after,
        stuck_clients=stuck,
        failed_clients=failed,
        started=start,
        engines=bed.expected,
        settled=settled,
    )


def serves_after(bed: SoakBed, bound: float, budget: float | None = None) -> dict[str, str]:
    """Once the nemesis stops: every operation, in every reply mode, on every
    engine, from a new client; ``{what: "ok" | the error}``. Within ``budget``
    seconds in all, if given: what is left untried says so."""
    import ipyparallel_broadcast as ipb

    from . import engine_side as E

    end = time.monotonic() + (budget if budget is not None else float("inf"))
    rc = ipb.Client(bed.url_file, timeout=min(bound, max(1.0, end - time.monotonic())))
    outcome = {}
    try:
        sims = set(bed.sims.ids)
        real = [e for e in rc.ids if e not in sims]
        for mode, coalescing in workload._modes().items():
            view = rc.broadcast_view(coalescing=coalescing)
            calls = dict(
                apply=lambda view=view, mode=mode: view.apply_async(E.logged, f"after:{mode}"),
                execute=lambda view=view, mode=mode: view.execute(f"x_{mode} = 1", block=False),
                push=lambda view=view: view.push(dict(after=1), block=False),
                map=lambda c=coalescing: rc.broadcast_view(real, coalescing=c).map_async(abs, range(len(real))),
            )
            if mode == "coalescing":  # IPython Parallel's own views, once
                calls["directview apply"] = lambda: rc.direct_view(real).apply_async(E.logged, "after:dv")
                calls["balanced apply"] = lambda: rc.load_balanced_view(real).apply_async(E.logged, "after:lb")
            for what, send in calls.items():
                left = end - time.monotonic()
                if left <= 0:
                    outcome[f"{what} {mode}"] = "not tried: out of time"
                    continue
                try:
                    send().get(timeout=min(bound, left))
                    outcome[f"{what} {mode}"] = "ok"
                except Exception as e:
                    outcome[f"{what} {mode}"] = f"{type(e).__name__}: {str(e)[:200]}"
    finally:
        rc.close()
    return outcome


def soak_options(ap, hosts=2, engines=2, sim_hosts=2, sim_engines=16, seconds=60.0):
    """The bed's and the run's options, for this module's command and the long
    soak's (``benchmarks/scripts/chaos_soak.py``), each with its own defaults."""
    ap.add_argument("--hosts", type=int, default=hosts)
    ap.add_argument("--engines", type=int, default=engines, help="real engines per host")
    ap.add_argument("--sim-hosts", type=int, default=sim_hosts)
    ap.add_argument("--sim-engines", type=int, default=sim_engines, help="simulated engines per simulated host")
    ap.add_argument("--clients", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=seconds)
    ap.add_argument("--bound", type=float, default=60, help="seconds within which every call must end")
    ap.add_argument("--rate", type=float, default=1.0, help="faults per second")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--faults", default=",".join(FAULTS), help="the nemesis's faults, comma-separated")
    ap.add_argument("--ops", default=",".join(workload.OPS), help="the clients' operations, comma-separated")
    ap.add_argument("--views", default=",".join(workload.VIEWS), help="the clients' views, comma-separated")
    ap.add_argument("--reduce-shape", default="auto", choices=reduce_trees.SHAPES, help="host_reduce_shape")
    ap.add_argument("--push-shape", default="auto", choices=pushplan.SHAPES, help="host_push_shape")


def soak(args, progress=print) -> dict:
    """A bed as ``args`` say, a run on it (``run``), the bed taken down; the run's result."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the bed is taken down on the way out
    shapes = dict(reduce_shape=args.reduce_shape, push_shape=args.push_shape)
    with SoakBed(args.hosts, args.engines, args.sim_hosts, args.sim_engines, **shapes) as bed:
        return run(
            bed,
            args.clients,
            args.seconds,
            args.bound,
            args.rate,
            args.seed,
            progress=progress,
            faults=args.faults.split(","),
            ops=args.ops.split(","),
            views=args.views.split(","),
        )


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    soak_options(ap)
    ap.add_argument("--json", help="write the whole run (records, faults, verdict) here")
    args = ap.parse_args(argv)
    result = soak(args)
    verdict = result["verdict"]
    print(json.dumps(dict(verdict.summary(), after=result["after"]), indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(result, verdict=verdict.__dict__), f, default=str)
    return 0 if verdict.clean else 1


if __name__ == "__main__":
    sys.exit(main())
