"""Every timer of a relay node, in one registry (as trio's ``Runner`` keeps
its ``Deadlines``): each part adds what it waits for, as when it next has
something to do and what it does then; the node asks the registry alone."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .events import Send


@dataclass(frozen=True)
class Timer:
    name: str  # what it waits for, as a log or test names it
    when: Callable[[], float | None]  # its next deadline (None: nothing timed)
    fire: Callable[[float], list[Send]]  # what is done once ``when`` has passed


class Deadlines:
    """Timers fire in the order they were added; each time is asked anew (a
    part's deadline moves with its state, so none is stored twice)."""

    def __init__(self):
        self.timers: list[Timer] = []

    def add(self, name: str, when: Callable[[], float | None], fire: Callable[[float], list[Send]]) -> None:
        if any(t.name == name for t in self.timers):
            raise ValueError(f"a timer named {name!r} is there already")
        self.timers.append(Timer(name, when, fire))

    def next(self) -> float | None:
        """The earliest deadline of all (None: nothing timed)."""
        return min((t for t in (timer.when() for timer in self.timers) if t is not None), default=None)

    def due(self, now: float) -> list[str]:
        """The names of the timers whose deadline has passed."""
        return [timer.name for timer in self.timers if (t := timer.when()) is not None and t <= now]

    def fire(self, now: float) -> list[Send]:
        """Fire every timer whose deadline has passed, in order."""
        sends = []
        for timer in self.timers:
            t = timer.when()
            if t is not None and t <= now:
                sends += timer.fire(now)
        return sends
