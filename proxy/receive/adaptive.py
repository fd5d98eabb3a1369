"""Adaptive switching between notify and coupled polling, per (group, topic), on evidence.

The request rate is the operator's knob, but a high rate alone does not show that coupled
polling pays: a thousand idle consumers make a high rate with nothing to find, and coupled
polling then parks one pop per consumer on the brokers (at most 1,024 per key before they
answer POLLING_FULL) where notify parks one probe per broker. So a (group, topic) goes to
coupled polling only when both hold:

- over the last ``window_s`` seconds its receive requests per second are above
  ``high_rate``, and at least ``min_polls`` of its first pops were reported;
- its first-pop hit ratio is at least ``hit_high``. The ratio is a moving average over
  about the last ``min_polls`` first pops (weight 1/min_polls each), so a change of regime
  shows within a few polls, not after a whole window of old hits. A first pop is reported
  as soon as it is known (``PollContext.first_pop_done``): in notify mode when the first
  pop answers, in coupled mode when its parked pop answered with messages within 10 ms (a
  hit) or did not (a miss, reported at 10 ms).

It goes back to notify, each with its own hysteresis, when

- the rate falls below ``low_rate`` (< ``high_rate``),
- the hit ratio falls below ``hit_low`` (< ``hit_high``), or fewer than ``min_polls``
  first pops were reported in the window,
- a broker answered POLLING_FULL, or this proxy holds ``max_coupled`` coupled polls of the
  key in flight (the broker parks at most 1,024 per ``topic@group@queueId``, other proxies
  park there too). These two also drop the key's evidence and hold it in notify for one
  window, and until its coupled polls are below half of ``max_coupled``.

Every request and every report costs O(1): counters in one-second buckets with a running
total, a moving average, and one dictionary entry per key, the least recently seen
forgotten first beyond ``max_keys``. A forgotten key starts again in notify, the safe mode.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

from proxy.config import PollMode


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Request rates per second per proxy: coupled above ``high_rate`` (with evidence),
    notify again below ``low_rate``."""

    high_rate: float
    low_rate: float


@dataclass(frozen=True, slots=True)
class Evidence:
    """How much first-pop evidence coupled polling needs, and where it gives up."""

    hit_high: float = 0.9  # go coupled at or above this first-pop hit ratio
    hit_low: float = 0.7  # back to notify below it
    min_polls: int = 20  # first pops in the window before the ratio counts; 1/weight
    max_coupled: int = 512  # coupled polls in flight per key, this proxy


@dataclass(frozen=True, slots=True)
class Decision:
    mode: PollMode
    switched: bool = False
    reason: str = ""  # why it switched, for the log


class Window:
    """Events in the last ``seconds`` whole seconds: one bucket per second and a running
    total, so adding and counting cost O(1) (a jump in time clears at most every bucket)."""

    __slots__ = ("buckets", "newest", "seconds", "total")

    def __init__(self, seconds: int) -> None:
        self.seconds = seconds
        self.buckets = [0] * seconds
        self.newest = 0  # the second the newest bucket counts
        self.total = 0

    def add(self, now: float, n: int = 1) -> None:
        self._advance(now)
        self.buckets[self.newest % self.seconds] += n
        self.total += n

    def count(self, now: float) -> int:
        self._advance(now)
        return self.total

    def clear(self) -> None:
        self.buckets = [0] * self.seconds
        self.total = 0

    def _advance(self, now: float) -> None:
        second = math.floor(now)
        if second <= self.newest:
            return
        if second - self.newest >= self.seconds:
            self.clear()
        else:
            for s in range(self.newest + 1, second + 1):
                i = s % self.seconds
                self.total -= self.buckets[i]
                self.buckets[i] = 0
        self.newest = second


class _Key:
    __slots__ = ("hit_ratio", "hold_until", "last_seen", "mode", "polls", "requests")

    def __init__(self, seconds: int) -> None:
        self.requests = Window(seconds)
        self.polls = Window(seconds)  # first pops reported
        self.hit_ratio = 0.0  # moving average of first-pop hits (1) and misses (0)
        self.mode = PollMode.NOTIFY
        self.last_seen = 0.0
        self.hold_until = 0.0  # no coupled polling before this (after a forced return)


class AdaptiveSwitch:
    def __init__(
        self,
        high_rate: float,
        low_rate: float,
        window_s: float,
        evidence: Evidence | None = None,
        max_keys: int = 100_000,
    ) -> None:
        self.defaults = Thresholds(high_rate, low_rate)
        self.window_s = max(1, round(window_s))
        self.evidence = evidence or Evidence()
        self.max_keys = max_keys
        self._keys: OrderedDict[tuple[str, str], _Key] = OrderedDict()
        self._thresholds: Mapping[tuple[str, str], Thresholds] = {}

    # -- thresholds -----------------------------------------------------------------------

    def set_thresholds(self, table: Mapping[tuple[str, str], Thresholds]) -> None:
        """Per-(group, topic) thresholds; keys not in ``table`` use the defaults."""
        self._thresholds = table

    def thresholds(self, group: str, topic: str) -> Thresholds:
        return self._thresholds.get((group, topic), self.defaults)

    # -- decisions ------------------------------------------------------------------------

    def choose(self, group: str, topic: str, now: float, coupled_in_flight: int = 0) -> Decision:
        """Count one request; the mode to serve it in. ``coupled_in_flight``: this proxy's
        coupled polls of the key in flight now."""
        key = (group, topic)
        entry = self._keys.get(key)
        if entry is None:
            while len(self._keys) >= self.max_keys:
                self._keys.popitem(last=False)  # the least recently seen
            entry = self._keys[key] = _Key(self.window_s)
        else:
            self._keys.move_to_end(key)
        entry.last_seen = now
        entry.requests.add(now)
        limits = self.thresholds(group, topic)
        ev = self.evidence
        rate = entry.requests.count(now) / self.window_s
        polls = entry.polls.count(now)
        ratio = entry.hit_ratio
        if entry.mode is PollMode.NOTIFY:
            if (
                rate > limits.high_rate
                and polls >= ev.min_polls
                and ratio >= ev.hit_high
                and now >= entry.hold_until
                and coupled_in_flight < ev.max_coupled // 2
            ):
                entry.mode = PollMode.COUPLED
                return Decision(
                    PollMode.COUPLED,
                    True,
                    f"{rate:.1f} requests/s > {limits.high_rate:g}, first-pop hit ratio "
                    f"{ratio:.0%} ({polls} in {self.window_s} s)",
                )
            return Decision(PollMode.NOTIFY)
        if coupled_in_flight >= ev.max_coupled:
            self._force_notify(entry, now)
            return Decision(PollMode.NOTIFY, True, f"{coupled_in_flight} coupled polls in flight")
        if rate < limits.low_rate:
            reason = f"{rate:.1f} requests/s < {limits.low_rate:g}"
        elif polls < ev.min_polls:
            reason = f"only {polls} first pops in {self.window_s} s"
        elif ratio < ev.hit_low:
            reason = f"first-pop hit ratio {ratio:.0%} < {ev.hit_low:.0%}"
        else:
            return Decision(PollMode.COUPLED)
        entry.mode = PollMode.NOTIFY
        return Decision(PollMode.NOTIFY, True, reason)

    def first_pop(self, group: str, topic: str, now: float, hit: bool) -> None:
        """A poll of the key learnt whether its first pop found messages."""
        entry = self._keys.get((group, topic))
        if entry is None:
            return  # forgotten meanwhile: it starts again in notify anyway
        entry.polls.add(now)
        weight = 1.0 / self.evidence.min_polls
        entry.hit_ratio += weight * ((1.0 if hit else 0.0) - entry.hit_ratio)

    def polling_full(self, group: str, topic: str, now: float) -> Decision | None:
        """A broker answered POLLING_FULL to a poll of the key: notify, and hold it there.
        Returns the Decision when this switched the key."""
        entry = self._keys.get((group, topic))
        if entry is None:
            return None
        was = entry.mode
        self._force_notify(entry, now)
        if was is PollMode.COUPLED:
            return Decision(PollMode.NOTIFY, True, "a broker answered POLLING_FULL")
        return None

    def _force_notify(self, entry: _Key, now: float) -> None:
        entry.mode = PollMode.NOTIFY
        entry.polls.clear()
        entry.hit_ratio = 0.0
        entry.hold_until = now + self.window_s

    # -- status ---------------------------------------------------------------------------

    def current(self, group: str, topic: str) -> PollMode:
        entry = self._keys.get((group, topic))
        return entry.mode if entry is not None else PollMode.NOTIFY

    def snapshot(self, now: float) -> list[dict[str, object]]:
        """Mode, rate and first-pop evidence of every (group, topic) seen in the window."""
        out: list[dict[str, object]] = []
        for (g, t), e in self._keys.items():
            if now - e.last_seen > self.window_s:
                continue
            polls = e.polls.count(now)
            limits = self.thresholds(g, t)
            out.append(
                {
                    "group": g,
                    "topic": t,
                    "mode": e.mode.value,
                    "rate": round(e.requests.count(now) / self.window_s, 3),
                    "polls": polls,
                    "hit_ratio": round(e.hit_ratio, 3) if polls else None,
                    "high_rate": limits.high_rate,
                    "low_rate": limits.low_rate,
                }
            )
        return out

    def __len__(self) -> int:
        return len(self._keys)
