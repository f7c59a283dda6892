"""One soak client: a process that loops over every operation, in every reply
mode, with and without targets, and records each call (``Record``) as a line
of JSON. Calls that run code carry a token unique to the client and call;
the engines log it (``engine_side``) and return it, so the checker can tell a
lost, a doubled or a misdelivered result.

Simulated engines (ids in the file ``sim_ids``) answer ``apply`` without
running it, so operations that need the function's value (map, scatter and
gather, reduce, pull) target real engines only.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from ...compat import ipp
from ..simanswers import SIM_UUID_PREFIX
from . import engine_side as E

OPS = (
    "apply",
    "execute",
    "push",
    "pull",
    "scatter",
    "map",
    "reduce",
    "bigpush",
    "bigreduce",
    "allreduce",
    "bigallreduce",
)
WEIGHTS = (3, 3, 2, 1, 2, 2, 1, 1, 1, 1, 1)
# the views a call goes through: a BroadcastView on each path, and IPython Parallel's own two
VIEWS = ("tree", "direct", "auto", "directview", "balanced")
VIEW_OPS = {  # what each of IPython Parallel's views can do (a BroadcastView does all)
    "directview": ("apply", "execute", "push", "pull", "scatter", "map", "bigpush"),
    "balanced": ("apply", "map"),
}
ANY_ENGINE = -1  # the target of a load-balanced call: whichever engine runs it
BIG = 2 << 20  # bytes: over the host chunk threshold (the big-data path)


@dataclass
class Record:
    client: str
    seq: int
    op: str
    mode: str
    targets: list[int]  # [ANY_ENGINE] for a load-balanced call
    sent: float
    ended: float | None = None
    outcomes: dict[str, list] = field(default_factory=dict)
    wrong: list[list] = field(default_factory=list)
    output_missing: list[int] = field(default_factory=list)
    send_error: str | None = None
    hung: dict | None = None  # what a call that did not end was waiting for
    view: str = "tree"  # one of VIEWS


def _modes():
    import ipyparallel_broadcast as ipb

    return {"coalescing": True, "streaming": False, "batch4": ipb.Batch(4)}


def _error_text(e) -> str:
    return f"{getattr(e, 'ename', type(e).__name__)}: {getattr(e, 'evalue', e)}"


class WorkloadClient:
    """The loop of one client process (``run``)."""

    def __init__(self, url_file: str, name: str, seed: int, bound: float, sim_file: str, ops=OPS, views=VIEWS):
        import ipyparallel_broadcast as ipb

        self.rc = ipb.Client(url_file)
        self.name, self.rng, self.bound, self.sim_file = name, random.Random(seed), bound, sim_file
        self.seq, self.modes = 0, _modes()
        self.sims, self._sims_read = set(), 0.0
        self.ops = [(op, w) for op, w in zip(OPS, WEIGHTS) if op in ops]
        self.views = list(views)

    def sim_ids(self) -> set:
        if time.monotonic() - self._sims_read > 2:
            try:
                with open(self.sim_file) as f:
                    self.sims = set(json.load(f))
            except (OSError, ValueError):
                pass
            self._sims_read = time.monotonic()
        return self.sims

    def is_sim(self, eid) -> bool:
        """A simulated engine: in the bed's list as last read, or by its uuid
        (a simulated host added since the list was written)."""
        return eid in self.sim_ids() or str(ipp.engine_uuids(self.rc).get(eid, "")).startswith(SIM_UUID_PREFIX)

    def pick(self, op: str, real_only=False) -> list[int] | None:
        """Targets for ``op``: real engines only where simulated ones cannot
        serve (they answer the tree's ``apply`` without running it, and never
        connect to IPython Parallel's own queues)."""
        ids = list(self.rc.ids)
        if real_only or op in ("scatter", "map", "reduce", "pull", "bigreduce", "allreduce", "bigallreduce"):
            ids = [e for e in ids if not self.is_sim(e)]
        if not ids:
            return None
        if self.rng.random() < 0.5:
            return ids
        return sorted(self.rng.sample(ids, self.rng.randint(1, len(ids))))

    def one_call(self) -> Record | None:
        kind = self.rng.choice(self.views)
        ops = [(o, w) for o, w in self.ops if o in VIEW_OPS.get(kind, OPS)]
        if not ops:
            return None
        op = self.rng.choices([o for o, _ in ops], [w for _, w in ops])[0]
        mode = self.rng.choice(list(self.modes)) if kind not in VIEW_OPS else "-"
        targets = self.pick(op, real_only=kind in ("direct", "directview", "balanced"))
        if targets is None:
            return None
        self.seq += 1
        token = f"{self.name}:{self.seq}"
        if kind == "balanced":
            view = self.rc.load_balanced_view(targets)
            targets = [ANY_ENGINE]
        elif kind == "directview":
            view = self.rc.direct_view(targets)
        else:
            view = self.rc.broadcast_view(targets, coalescing=self.modes[mode], path=kind)
        rec = Record(self.name, self.seq, op, mode, targets, time.time(), view=kind)
        try:
            ar, check = self.send(view, op, token, targets)
        except Exception as e:  # refused up front: a target died meanwhile
            rec.send_error = _error_text(e)
            return rec
        if not ar.wait(self.bound):
            rec.hung = self.waiting_for(ar)
            ar.wait(self.bound)  # did it end later? (the checker counts it hung either way)
            rec.ended = time.time() if ar.ready() else None
            return rec
        rec.ended = time.time()
        self.file(rec, ar, check, token)
        return rec

    def waiting_for(self, ar) -> dict:
        """What a call that has not ended waits for: its kind, path, and the
        per-engine ids still outstanding, with the engines they are for."""
        rc = self.rc
        owed = [m for m in ar.msg_ids if m in rc.outstanding]
        engines = {m: rc.metadata[m].get("engine_id") if m in rc.metadata else None for m in owed}
        call = getattr(ar, "_call", None)
        targets = ipp.ar_targets(ar) or []
        owed_targets = (
            [t for m, t in zip(ar.msg_ids, targets) if m in rc.outstanding] if len(targets) == len(ar.msg_ids) else None
        )
        try:  # what the hub's records say of them (direct-path requests)
            status = rc.result_status(owed[:8], status_only=True) if owed and call is None else None
        except Exception as e:
            status = repr(e)[:200]
        return dict(
            kind=type(ar).__name__,
            tree=call is not None,
            owed=owed[:8],
            engines=list(engines.values())[:8],
            owed_targets=owed_targets,
            hub=status,
            registered=sorted(rc.ids)[:64],
        )

    def send(self, view, op, token, targets):
        """``(AsyncResult, check)``: ``check(eid, value)`` says whether a value is right."""

        def real(eid):
            return not self.is_sim(eid)

        if op == "apply":
            return view.apply_async(E.logged, token), lambda e, v: v == token or not real(e)
        if op == "execute":
            return view.execute(E.execute_code(token), block=False), None
        if op == "push":
            return view.push({f"chaos_{self.name}": token}, block=False), lambda e, v: v is None or not real(e)
        if op == "pull":

            def mine(e, v):  # the last value this client pushed there, or none yet
                return not real(e) or v is None or str(v).startswith(f"{self.name}:")

            return view.apply_async(_pull, f"chaos_{self.name}"), mine
        if op == "bigpush":
            return view.push({"chaos_big": np.full(BIG // 8, self.seq, dtype=np.int64)}, block=False), None
        if op == "scatter":
            return view.scatter(f"chaos_s_{self.name}", list(range(3 * len(targets))), block=False), None
        if op == "map":
            items = [f"{token}/{i}" for i in range(2 * len(targets))]
            return view.map_async(E.logged, items), ("map", items)
        if op == "reduce":
            return view.reduce(E.one, token, op="sum", block=False), ("reduce", len(targets))
        if op == "bigreduce":  # over the thresholds: shared memory on a host, the chain between hosts
            expected = np.full(BIG // 8, float(len(targets)))
            return view.reduce(E.big_one, token, BIG // 8, op="sum", block=False), ("bigreduce", expected)
        if op == "allreduce":  # the value is bound in every engine; the call gives None
            ar = view.allreduce(E.one, token, op="sum", name=f"chaos_ar_{self.name}", block=False)
            return ar, ("allreduce", None)
        if op == "bigallreduce":  # round the ring of hosts; bound in every engine
            ar = view.allreduce(E.big_one, token, BIG // 8, op="sum", name="chaos_big_sum", block=False)
            return ar, ("allreduce", None)
        raise ValueError(op)

    def file(self, rec: Record, ar, check, token):
        """Each target's outcome, from a call that ended."""
        if isinstance(check, tuple):  # map and reduce: one value for the call
            return self.file_whole(rec, ar, check)
        values = ar.get(return_exceptions=True) if hasattr(ar, "get") else []
        if not isinstance(values, list):
            values = [values]
        for eid, value in zip(rec.targets, values):
            if isinstance(value, BaseException):
                rec.outcomes[str(eid)] = ["error", _error_text(value)]
                continue
            rec.outcomes[str(eid)] = ["ok", None]
            if check is not None and not check(eid, value):
                self._sims_read = 0.0  # a simulated host added since the list was read?
                self.sim_ids()
                if check(eid, value):
                    continue
                rec.wrong.append([eid, repr(value)[:80]])
        if rec.op == "execute":
            ar.wait_for_output(self.bound)
            for eid, out, err in zip(rec.targets, ar.stdout, ar.stderr):
                if rec.outcomes[str(eid)][0] == "ok" and token not in out:
                    if "may be incomplete" in err:
                        rec.output_missing.append(eid)
                    else:
                        rec.wrong.append([eid, f"stdout {out[-60:]!r}"])

    def file_whole(self, rec: Record, ar, check):
        from ipyparallel import error

        kind, expected = check
        try:
            value = ar.get()
        except error.CompositeError as e:
            failed = {}
            for ename, evalue, _tb, info in e.elist:
                eid = (info or {}).get("engine_id")
                failed[eid] = f"{ename}: {evalue}"
            for eid in rec.targets:
                rec.outcomes[str(eid)] = ["error", failed[eid]] if eid in failed else ["ok", None]
            return
        except Exception as e:  # the whole call failed
            for eid in rec.targets:
                rec.outcomes[str(eid)] = ["error", _error_text(e)]
            return
        for eid in rec.targets:
            rec.outcomes[str(eid)] = ["ok", None]
        if not (np.array_equal(value, expected) if kind == "bigreduce" else value == expected):
            self._sims_read = 0.0  # a simulated host added since the list was read, and targeted?
            if not any(self.is_sim(e) for e in rec.targets):
                rec.wrong.append([None, repr(value)[:80]])


def _pull(key):
    return globals().get(key)


def run(
    url_file: str, name: str, seed: int, seconds: float, bound: float, sim_file: str, out: str, ops=OPS, views=VIEWS
):
    """Process entry point: calls for ``seconds``, each recorded to ``out`` (JSON lines)."""
    client = WorkloadClient(url_file, name, seed, bound, sim_file, ops, views)
    end = time.monotonic() + seconds
    with open(out, "w") as f:
        while time.monotonic() < end:
            rec = client.one_call()
            if rec is None:
                time.sleep(0.2)
                continue
            f.write(json.dumps(asdict(rec)) + "\n")
            f.flush()
    client.rc.close()
