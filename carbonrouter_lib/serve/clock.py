"""The proxy's clocks: what "now" is for its backend, TTL, carbon replay and accounting.

Times are float seconds since the Unix epoch ("virtual" when scaled). A scaled clock lets an
emulated week pass in minutes: the engine emulators divide their service times by the same
scale, so TTFT and decode times keep their proportions to think times and TTLs.
"""

from __future__ import annotations

import time

__all__ = ["Clock", "WallClock", "ScaledClock", "ManualClock"]


class Clock:
    """``now()``: the current time, s since the Unix epoch; never goes backwards."""

    #: Virtual seconds per wall second.
    scale: float = 1.0

    def now(self) -> float:
        """The current time, s since the Unix epoch."""
        raise NotImplementedError


class WallClock(Clock):
    """The wall clock (``time.time``, made monotonic)."""

    def __init__(self) -> None:
        self._last = -float("inf")

    def now(self) -> float:
        self._last = max(self._last, time.time())
        return self._last


class ScaledClock(Clock):
    """Virtual time ``start + scale · (wall seconds since creation)``.

    Parameters
    ----------
    start
        Virtual time at creation, s since the Unix epoch.
    scale
        Virtual seconds per wall second, > 0.
    """

    def __init__(self, start: float, scale: float = 1.0) -> None:
        if not scale > 0:
            raise ValueError(f"ScaledClock.scale must be > 0, got {scale!r}")
        self.start, self.scale = float(start), float(scale)
        self._t0 = time.monotonic()

    def now(self) -> float:
        return self.start + self.scale * (time.monotonic() - self._t0)


class ManualClock(Clock):
    """A clock set by its owner (replays, tests): ``set(t)`` moves it forward, never back.

    Its ``scale`` tells engine emulators how to map virtual to wall seconds; with
    ``float("inf")`` they answer at once.
    """

    def __init__(self, start: float, scale: float = float("inf")) -> None:
        self._t = float(start)
        self.scale = scale

    def now(self) -> float:
        return self._t

    def set(self, t: float) -> None:
        """Move to ``t`` (s); an earlier time raises ``ValueError``."""
        if t < self._t:
            raise ValueError(f"ManualClock: {t!r} s is before {self._t!r} s")
        self._t = float(t)
