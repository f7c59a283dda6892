"""The soak's checker: pure. The recorded history and the engines' logs in,
a verdict out (``Verdict``); nothing here touches a socket.

A call record (``workload.Record.as_dict``) holds the call's operation, reply
mode and targets; when it was sent and when it ended (``None``: it never did);
per engine, ``["ok", detail]`` or ``["error", text]``; results that were not
its own (``wrong``); engines whose output did not come (``output_missing``).

What the checker asserts (the issue's promise):
- every call ends within ``bound`` seconds (else *hung*);
- every target engine has an outcome: its result, or an error that names the
  engine and a cause (else *lost*);
- a result is the call's own (else *wrong*: another call's or client's);
- each token runs at most once on each engine (else *twice*);
- each engine that answered ``ok`` to an ``execute`` printed its token, or its
  output was named missing (counted apart: *output missing*);
- a call failed by a restart (an engine's error naming it: the controller,
  or a part of it, died with the call in flight) is work lost, though its
  engine lived (*restart lost*, per view). None is allowed of the broadcast
  view by the controller's own restart, after which it sends the call again;
  IPython Parallel's views lose such calls, and a relay node's restart still
  fails the broadcast's engines under it.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

CAUSES = (  # how an error names what happened to its engine
    ("died", re.compile(r"died|is gone|unregistered|was dropped|not registered", re.I)),
    ("unreachable", re.compile(r"not answered|not connected|unreachable|cut off|silent|lost|is down", re.I)),
    ("misrouted", re.compile(r"wrong subtree", re.I)),
    ("restarted", re.compile(r"restarted|lost the request", re.I)),
    ("data", re.compile(r"did not get the request's data|shared memory|No space", re.I)),
)


# an error of an engine that lived: the controller, or a part of it (a queue, a relay node), died with the call
RESTART = re.compile(r"restarted|lost the request|the controller died|the controller's \w+ queue died", re.I)
# ... the controller itself: a broadcast is sent again then (a relay node's restart is not yet)
CONTROLLER_RESTART = re.compile(r"the controller died|Relay node root lost the request", re.I)


def cause_of(text: str) -> str:
    for name, pattern in CAUSES:
        if pattern.search(text):
            return name
    return "other"


def names_engine(text: str, eid) -> bool:
    return re.search(rf"\b[Ee]ngine {eid}\b", text) is not None or f"engine {eid}" in text


@dataclass
class Verdict:
    calls: int = 0
    by_op: dict[str, collections.Counter] = field(default_factory=dict)  # op -> ok/failed/hung counts
    by_view: dict[str, collections.Counter] = field(default_factory=dict)  # view -> ok/failed/hung counts
    errors_by_cause: collections.Counter = field(default_factory=collections.Counter)
    hung: list[dict] = field(default_factory=list)
    ended_late: int = 0
    lost: list[tuple] = field(default_factory=list)
    unnamed: list[tuple] = field(default_factory=list)
    wrong: list[tuple] = field(default_factory=list)
    twice: list[tuple] = field(default_factory=list)
    output_missing: list[tuple] = field(default_factory=list)
    restart_lost: list[tuple] = field(default_factory=list)  # (client, seq, op, view, engine, whole controller?)
    send_errors: collections.Counter = field(default_factory=collections.Counter)
    executions: int = 0

    @property
    def clean(self) -> bool:
        return not (self.hung or self.lost or self.unnamed or self.wrong or self.twice or self.broadcasts_restart_lost)

    @property
    def broadcasts_restart_lost(self) -> list[tuple]:
        """The broadcast view's calls failed by the controller's restart: each should have been sent again."""
        return [item for item in self.restart_lost if item[3] == "tree" and item[5]]

    def summary(self) -> dict:
        return dict(
            calls=self.calls,
            hung=len(self.hung),
            lost=len(self.lost),
            unnamed=len(self.unnamed),
            wrong=len(self.wrong),
            twice=len(self.twice),
            output_missing=len(self.output_missing),
            restart_lost={
                view: n for view, n in sorted(collections.Counter(item[3] for item in self.restart_lost).items())
            },
            ended_late=self.ended_late,
            executions=self.executions,
            send_errors=sum(self.send_errors.values()),
            views={view: dict(counts) for view, counts in sorted(self.by_view.items())},
        )


def check(records: Iterable[dict], logs: dict[str, list[str]], bound: float) -> Verdict:
    v = Verdict()
    for r in records:
        op = r["op"]
        by_op = v.by_op.setdefault(op, collections.Counter())
        by_view = v.by_view.setdefault(r.get("view", "tree"), collections.Counter())

        def tally(outcome, by_op=by_op, by_view=by_view):
            by_op[outcome] += 1
            by_view[outcome] += 1

        if r.get("send_error"):
            v.send_errors[r["send_error"].split(":")[0]] += 1
            tally("refused")
            continue
        v.calls += 1
        ended = r.get("ended")
        if ended is None or ended - r["sent"] > bound:
            v.hung.append(
                dict(
                    client=r["client"],
                    seq=r["seq"],
                    op=op,
                    mode=r["mode"],
                    view=r.get("view", "tree"),
                    targets=len(r["targets"]),
                    ended_after=None if ended is None else ended - r["sent"],
                    waiting=r.get("hung"),
                )
            )
            tally("hung")
            if ended is not None:
                v.ended_late += 1
            continue
        outcomes = r["outcomes"]
        failed = False
        for eid in r["targets"]:
            got = outcomes.get(str(eid))
            if got is None:
                v.lost.append((r["client"], r["seq"], op, eid))
                failed = True
            elif got[0] == "error":
                failed = True
                v.errors_by_cause[cause_of(got[1])] += 1
                if RESTART.search(got[1]):
                    whole = bool(CONTROLLER_RESTART.search(got[1]))
                    v.restart_lost.append((r["client"], r["seq"], op, r.get("view", "tree"), eid, whole))
                whole = (
                    op in ("reduce", "bigreduce", "allreduce", "bigallreduce") or r.get("view") == "balanced"
                )  # no one engine's
                if not whole and not names_engine(got[1], eid):
                    v.unnamed.append((r["client"], r["seq"], op, eid, got[1][:160]))
        for item in r.get("wrong", ()):
            v.wrong.append((r["client"], r["seq"], op, r.get("mode"), len(r.get("targets") or ()), *item))
        for eid in r.get("output_missing", ()):
            v.output_missing.append((r["client"], r["seq"], eid))
        tally("failed" if failed else "ok")
    for name, tokens in logs.items():
        v.executions += len(tokens)
        for token, n in collections.Counter(tokens).items():
            if n > 1:
                v.twice.append((name, token, n))
    return v
