"""Engines' outputs and errors grouped by equality, as MRNet's equivalence-class filters.

Five hundred engines that print the same line show it once, headed by the
engines that printed it (``[stdout:0-510 (511 engines)]``); one traceback
stands for every engine that raised the same error. Groups come in target
order of first appearance. Up to ``GROUP_ABOVE`` engines, everything shows
per engine, as ipyparallel shows it. Per-engine detail stays one call away:
``ar.stdout[i]``, ``ar.display_outputs(expand=True)``, ``err.elist``.

Pure functions and containers: ``results.py`` and the view use them.
"""

from __future__ import annotations

import html
import json
from collections.abc import Hashable, Iterable, Sequence
from contextlib import contextmanager

from ipyparallel import error

from ...compat import ipp

GROUP_ABOVE = 16  # more engines than this: outputs and errors are grouped


def grouped(count: int, expand: bool = False) -> bool:
    """Whether ``count`` engines' outputs are shown grouped."""
    return not expand and count > GROUP_ABOVE


def engine_ranges(eids: Iterable[int]) -> str:
    """``[0, 1, 2, 3, 7, 9, 10]`` -> ``'0-3,7,9-10'`` (sorted, runs joined)."""
    ids = sorted(set(eids))
    runs: list[list[int]] = []
    for e in ids:
        if runs and e == runs[-1][1] + 1:
            runs[-1][1] = e
        else:
            runs.append([e, e])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def label(kind: str, eids: Sequence[int]) -> str:
    """``[stdout:7]`` for one engine, as ipyparallel; ``[stdout:0-510 (511 engines)]`` for more."""
    if len(eids) == 1:
        return f"[{kind}:{eids[0]}]"
    return f"[{kind}:{engine_ranges(eids)} ({len(eids)} engines)]"


def groups(keys: Iterable[Hashable], eids: Iterable[int]) -> list[tuple[Hashable, list[int]]]:
    """``(key, engines)`` for each distinct key, in order of first appearance."""
    out: dict = {}
    for key, eid in zip(keys, eids):
        out.setdefault(key, []).append(eid)
    return list(out.items())


def output_key(output: dict) -> str:
    """A display output's identity: its data and metadata."""
    return json.dumps([output.get("data"), output.get("metadata")], sort_keys=True, default=repr)


class Outputs(list):
    """Engines' text (``ar.stdout``, ``ar.stderr``), a list in target order
    whose repr groups equal texts. ``engines[i]`` printed ``self[i]``."""

    def __init__(self, texts: Iterable[str], engines: Sequence[int], kind: str = "stdout"):
        super().__init__(texts)
        self.engines, self.kind = list(engines), kind

    def groups(self) -> list[tuple[str, list[int]]]:
        return groups(self, self.engines)

    def __repr__(self) -> str:
        if not grouped(len(self)):
            return list.__repr__(self)
        parts = [f"{label(self.kind, eids)}: {text!r}" for text, eids in self.groups()]
        return f"<{self.kind} of {len(self)} engines, {len(parts)} distinct\n " + "\n ".join(parts) + ">"

    def _repr_pretty_(self, p, cycle):
        p.text(repr(self))

    def _repr_html_(self):
        """One collapsible block per distinct text, headed by its engines
        (None up to ``GROUP_ABOVE`` engines: Jupyter shows the list)."""
        if not grouped(len(self)):
            return None
        blocks = []
        for text, eids in self.groups():
            head = html.escape(label(self.kind, eids))
            blocks.append(
                f"<details open><summary><code>{head}</code></summary>"
                f"<pre style='margin:0 0 0 1em'>{html.escape(text)}</pre></details>"
            )
        return (
            f"<div class='ipb-outputs'><b>{self.kind}</b> of {len(self)} engines, "
            f"{len(blocks)} distinct" + "".join(blocks) + "</div>"
        )


def _engine(ei) -> int:
    return (ei or {}).get("engine_id", -1)


class GroupedCompositeError(error.CompositeError):
    """A ``CompositeError`` whose message and tracebacks show each distinct
    error once, with the engines that raised it (``elist`` is ipyparallel's:
    every engine's error, in target order)."""

    @classmethod
    def of(cls, e: error.CompositeError) -> GroupedCompositeError:
        grouped_error = cls(e.msg, e.elist)
        grouped_error.__dict__.update({k: v for k, v in e.__dict__.items() if k not in ("msg", "elist")})
        return grouped_error

    def error_groups(self) -> list[tuple[tuple, list[int], str]]:
        """``((ename, evalue, traceback), engines, method)`` per distinct error."""
        method = {}
        for en, ev, etb, ei in self.elist:
            method.setdefault((en, str(ev), etb or ""), (ei or {}).get("method", "?"))
        keys = [(en, str(ev), etb or "") for en, ev, etb, _ in self.elist]
        return [(key, eids, method[key]) for key, eids in groups(keys, (_engine(ei) for *_, ei in self.elist))]

    def _head(self, eids, method) -> str:
        """ipyparallel's ``[7:apply]``; ``[0-510:apply] (511 engines)`` for a group."""
        return f"[{engine_ranges(eids)}:{method}]" + (f" ({len(eids)} engines)" if len(eids) > 1 else "")

    def __str__(self) -> str:
        if not grouped(len(self.elist)):
            return super().__str__()
        found = self.error_groups()
        lines = [str(self.msg)]
        lines += [f"{self._head(eids, m)} {en}: {ev}" for (en, ev, _), eids, m in found[: self.tb_limit]]
        lines += self._more(found)
        return "\n".join(lines)

    def _more(self, found) -> list[str]:
        rest = found[self.tb_limit :]
        if not rest:
            return []
        eids = [e for _, es, _ in rest for e in es]
        return [f"... {len(rest)} more distinct errors, on engines {engine_ranges(eids)} ..."]

    def render_traceback(self, excid=None) -> list[str]:
        if excid is not None or not grouped(len(self.elist)):
            return super().render_traceback(excid)
        found = self.error_groups()
        lines = [f"{self.msg}: {len(found)} distinct errors on {len(self.elist)} engines", ""]
        for (en, ev, etb), eids, method in found[: self.tb_limit]:
            lines.append(self._head(eids, method) + ":")
            lines.extend((etb or f"{en}: {ev}").splitlines())
            lines.append("")
        return lines + self._more(found)


class GroupedDisplay:
    """AsyncResult mixin: ``stdout`` and ``stderr`` as ``Outputs``, and
    ``display_outputs`` (``%px``) grouped by equality above ``GROUP_ABOVE``
    engines. ``groupby='engine'`` groups engines whose every output is equal;
    ``'order'`` shows as ``'type'``."""

    @property
    def stdout(self):
        return self._texts("stdout")

    @property
    def stderr(self):
        return self._texts("stderr")

    def _texts(self, kind):
        texts = self[kind]
        return texts if self._single else Outputs(texts, self["engine_id"], kind)

    @contextmanager
    def stream_output(self):
        """ipyparallel's live streaming (``%px``'s default) up to ``GROUP_ABOVE``
        engines. Above, live output could only come one engine at a time: the
        outputs are shown grouped once the call is done, and its errors as one
        traceback per distinct error (``%px`` then reports them as displayed)."""
        if self._single or not grouped(len(self.msg_ids)):
            with super().stream_output():
                yield
            return
        try:
            yield
        finally:
            self._show_grouped_at_end()

    def _show_grouped_at_end(self):
        import sys

        self.wait_for_output(1)
        self.display_outputs()
        if self.done():
            try:
                self.get(0)
            except error.CompositeError as e:
                print("\n".join(e.render_traceback()), file=sys.stderr)
            except Exception:  # not the engines' errors: the caller's get() raises it
                pass

    def display_outputs(self, groupby="type", result_only=False, expand=False):
        """ipyparallel's, grouped by equality; ``expand=True``: one block per engine."""
        self.wait_for_output()
        if self._single or not grouped(len(self.msg_ids), expand):
            return super().display_outputs(groupby, result_only)
        if groupby not in ("type", "order", "engine"):
            raise ValueError(f"groupby must be one of 'type', 'engine', 'order', not {groupby!r}")
        from IPython import get_ipython

        targets, outs = self["engine_id"], self["outputs"]
        shown = dict(stdout=self["stdout"], stderr=self["stderr"], outputs=outs, results=self["execute_result"])
        first = {eid: i for i, eid in reversed(list(enumerate(targets)))}
        values = self.get(return_exceptions=True)
        ipython = get_ipython() is not None
        if groupby == "engine":
            keys = zip(shown["stdout"], shown["stderr"], _outputs_keys(outs), _result_keys(shown["results"]))
            for _, eids in groups(keys, targets):
                self._show_group(first[eids[0]], eids, shown, values, result_only, ipython)
            return
        if not result_only:
            for kind in ("stdout", "stderr"):
                for text, eids in groups(shown[kind], targets):
                    self._show_stream(kind, text, eids)
        if not ipython:
            return
        if not result_only:
            for key, eids in groups(_outputs_keys(outs), targets):
                if key:
                    self._show_outputs(first[eids[0]], eids, outs)
        for key, eids in groups(_result_keys(shown["results"]), targets):
            if key is not None:
                self._show_result(first[eids[0]], eids, values)

    def _show_stream(self, kind, text, eids):
        import sys

        self._print_stream(text, label(kind, eids) + " ", file=sys.stderr if kind == "stderr" else None)

    def _show_outputs(self, i, eids, outs):
        ipp.raw_text(label("output", eids))
        for output in outs[i]:
            self._show_rich(output, eids[0])

    def _show_result(self, i, eids, values):
        from IPython.display import display

        if len(eids) > 1:
            ipp.raw_text(label("output", eids))
        display(values[i])

    def _show_group(self, i, eids, shown, values, result_only, ipython):
        if not result_only:
            self._show_stream("stdout", shown["stdout"][i], eids)
            self._show_stream("stderr", shown["stderr"][i], eids)
        if not ipython:
            return
        if not result_only and shown["outputs"][i]:
            self._show_outputs(i, eids, shown["outputs"])
        if shown["results"][i] is not None:
            self._show_result(i, eids, values)


def _outputs_keys(outs) -> list[tuple]:
    return [tuple(output_key(o) for o in engine_outputs) for engine_outputs in outs]


def _result_keys(results) -> list:
    return [None if r is None else output_key(r) for r in results]
