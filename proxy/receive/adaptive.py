"""Adaptive switching between notify and coupled polling, per (group, topic).

Each receive request is counted in a sliding window of one-second buckets. Above
``high_rate`` requests per second a (group, topic) uses coupled polling: messages are
almost always found by the first pop or a broker long poll, and probing every broker would
cost N requests per poll. Below ``low_rate`` it returns to notify. The gap between the two
rates is the hysteresis that keeps a group near the threshold from flapping.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from proxy.config import PollMode


@dataclass(slots=True)
class RateWindow:
    """Events per second over the last ``seconds`` whole seconds."""

    seconds: int
    buckets: list[int] = field(default_factory=list)
    newest: int = 0  # the second the last bucket counts

    def __post_init__(self) -> None:
        self.buckets = [0] * self.seconds

    def add(self, now: float) -> None:
        self._advance(now)
        self.buckets[self.newest % self.seconds] += 1

    def rate(self, now: float) -> float:
        self._advance(now)
        return sum(self.buckets) / self.seconds

    def _advance(self, now: float) -> None:
        second = math.floor(now)
        if second <= self.newest:
            return
        for s in range(max(self.newest + 1, second - self.seconds + 1), second + 1):
            self.buckets[s % self.seconds] = 0
        self.newest = second


@dataclass(slots=True)
class _GroupTopic:
    window: RateWindow
    mode: PollMode = PollMode.NOTIFY
    last_seen: float = 0.0


class AdaptiveSwitch:
    def __init__(
        self, high_rate: float, low_rate: float, window_s: float, max_keys: int = 100_000
    ) -> None:
        self.high_rate = high_rate
        self.low_rate = low_rate
        self.window_s = max(1, round(window_s))
        self.max_keys = max_keys
        self._keys: dict[tuple[str, str], _GroupTopic] = {}

    def choose(self, group: str, topic: str, now: float) -> tuple[PollMode, bool]:
        """Count one request; return the mode to use and whether it just switched."""
        key = (group, topic)
        entry = self._keys.get(key)
        if entry is None:
            if len(self._keys) >= self.max_keys:
                self._forget_idle(now)
            entry = self._keys[key] = _GroupTopic(RateWindow(self.window_s))
        entry.window.add(now)
        entry.last_seen = now
        rate = entry.window.rate(now)
        before = entry.mode
        if entry.mode is PollMode.NOTIFY and rate > self.high_rate:
            entry.mode = PollMode.COUPLED
        elif entry.mode is PollMode.COUPLED and rate < self.low_rate:
            entry.mode = PollMode.NOTIFY
        return entry.mode, entry.mode != before

    def current(self, group: str, topic: str) -> PollMode:
        entry = self._keys.get((group, topic))
        return entry.mode if entry is not None else PollMode.NOTIFY

    def snapshot(self, now: float) -> list[dict[str, str | float]]:
        """Mode and rate of every (group, topic) seen within the window."""
        return [
            {"group": g, "topic": t, "mode": e.mode.value, "rate": round(e.window.rate(now), 3)}
            for (g, t), e in self._keys.items()
            if now - e.last_seen <= self.window_s
        ]

    def _forget_idle(self, now: float) -> None:
        idle = [k for k, e in self._keys.items() if now - e.last_seen > self.window_s]
        for key in idle or list(self._keys)[: len(self._keys) // 10 + 1]:
            del self._keys[key]
