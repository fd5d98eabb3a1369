"""The adaptive threshold recommendation, derived from the observed hit ratio against rate.

What the threshold means in the proxy (proxy/receive/adaptive.py): each proxy counts the
receive requests of a (group, topic) per second; above ``adaptive_high_rate``, while the
first pop keeps finding messages (checked live by the proxy), it serves them with coupled
long polling, below ``adaptive_low_rate`` with pop-with-notify again. ``write_thresholds``
writes the recommendation as the proxies' ``receive.adaptive_thresholds_file``. Notify
pays off when the first pop misses: it then probes every broker and catches a message on
any of them at once. When the first pop almost always hits, the probes are rarely needed
and coupled polling is enough.

The rule: take every per-proxy window of the (group, topic) as a point (its request rate
per second, its requests, its first-pop hits), modes together. The recommended threshold
is the lowest observed rate ``r`` such that the windows at rate ``r`` or more, taken
together, hit on the first pop at least ``target`` of the time (and hold at least
``min_requests`` requests, so that a few lucky windows do not decide). Above it coupled
polling would have served almost every request from the first pop anyway. If no rate
qualifies, pop-with-notify is the better mode at every rate observed: keep it, with the
threshold above the highest rate seen: twice that rate (so that even the busiest windows
seen stay below the low rate), and at least the proxy's default. With too few requests to
judge, the recommendation is the proxy's default. The low rate keeps the configuration's
2:1 hysteresis.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from proxy.config import ReceiveConfig

DEFAULT_TARGET = 0.9
DEFAULT_MIN_REQUESTS = 100
_DEFAULTS = ReceiveConfig()
PROXY_DEFAULT_RPS = _DEFAULTS.adaptive_high_rate
# adaptive_low_rate = HYSTERESIS * adaptive_high_rate, as in the proxy's defaults (50 / 25).
HYSTERESIS = _DEFAULTS.adaptive_low_rate / _DEFAULTS.adaptive_high_rate


@dataclass(frozen=True, slots=True)
class RatePoint:
    """One proxy's window of one (group, topic), all modes together."""

    group: str
    topic: str
    rate: float  # requests per second
    requests: int
    hits: int  # requests whose first pop found messages


@dataclass(frozen=True, slots=True)
class Recommendation:
    group: str
    topic: str
    threshold_rps: float  # the recommended adaptive_high_rate
    qualified: bool  # a rate reached the target; else notify is kept at every rate seen
    windows: int
    requests: int
    max_rate: float
    overall_hit_ratio: float
    hit_ratio_above: float | None = None  # of the windows at or above the threshold
    requests_above: int = 0
    windows_above: int = 0
    target: float = DEFAULT_TARGET
    enough_data: bool = True

    @property
    def low_rps(self) -> float:
        return self.threshold_rps * HYSTERESIS

    def explain(self) -> str:
        if not self.enough_data:
            return (
                f"only {self.requests} requests in {self.windows} windows: too few to judge; "
                f"keep the proxy's default of {self.threshold_rps:.2f}"
            )
        if not self.qualified:
            return (
                f"no observed rate reached a {self.target:.0%} first-pop hit ratio (overall "
                f"{self.overall_hit_ratio:.0%}, up to {self.max_rate:.2f} req/s per proxy): "
                "pop-with-notify pays off at every rate seen; keep adaptive_high_rate above "
                f"twice that rate, and at least the default: {self.threshold_rps:.2f}"
            )
        return (
            f"{self.windows_above} of {self.windows} windows ran at >= "
            f"{self.threshold_rps:.2f} req/s per proxy and hit on the first pop "
            f"{self.hit_ratio_above:.0%} of {self.requests_above} requests (target "
            f"{self.target:.0%}; overall {self.overall_hit_ratio:.0%}): above it coupled "
            f"polling serves almost every poll from the first pop; adaptive_high_rate = "
            f"{self.threshold_rps:.2f}, adaptive_low_rate = {self.low_rps:.2f}"
        )


def recommend(
    points: Iterable[RatePoint],
    target: float = DEFAULT_TARGET,
    min_requests: int = DEFAULT_MIN_REQUESTS,
) -> list[Recommendation]:
    """One recommendation per (group, topic), sorted by group and topic."""
    by_key: dict[tuple[str, str], list[RatePoint]] = defaultdict(list)
    for p in points:
        by_key[(p.group, p.topic)].append(p)
    return [_one(g, t, by_key[(g, t)], target, min_requests) for g, t in sorted(by_key)]


class _Base(TypedDict):
    """The fields every recommendation of a (group, topic) shares."""

    group: str
    topic: str
    windows: int
    requests: int
    max_rate: float
    overall_hit_ratio: float
    target: float


def _one(
    group: str, topic: str, points: list[RatePoint], target: float, min_requests: int
) -> Recommendation:
    requests = sum(p.requests for p in points)
    hits = sum(p.hits for p in points)
    base: _Base = {
        "group": group,
        "topic": topic,
        "windows": len(points),
        "requests": requests,
        "max_rate": max(p.rate for p in points),
        "overall_hit_ratio": hits / requests if requests else 0.0,
        "target": target,
    }
    if requests < min_requests:
        return Recommendation(
            threshold_rps=PROXY_DEFAULT_RPS, qualified=False, enough_data=False, **base
        )
    # Walk from the busiest window down; after each distinct rate the running sums are the
    # windows at that rate or above. The last rate that qualifies is the lowest.
    ordered = sorted(points, key=lambda p: p.rate, reverse=True)
    best: tuple[float, int, int, int] | None = None  # rate, requests, hits, windows
    run_requests = run_hits = 0
    for i, p in enumerate(ordered):
        run_requests += p.requests
        run_hits += p.hits
        if i + 1 < len(ordered) and ordered[i + 1].rate == p.rate:
            continue  # ties: a threshold cannot split windows of equal rate
        if run_requests >= min_requests and run_hits >= target * run_requests:
            best = (p.rate, run_requests, run_hits, i + 1)
    if best is None:
        above_all = max(2 * base["max_rate"], PROXY_DEFAULT_RPS)
        return Recommendation(threshold_rps=above_all, qualified=False, **base)
    rate, above, above_hits, windows_above = best
    return Recommendation(
        threshold_rps=rate,
        qualified=True,
        hit_ratio_above=above_hits / above,
        requests_above=above,
        windows_above=windows_above,
        **base,
    )


def thresholds_document(recommendations: Iterable[Recommendation]) -> dict[str, Any]:
    """The proxies' thresholds file (``receive.adaptive_thresholds_file``, read by
    proxy/receive/thresholds.py): one entry per (group, topic) with enough data; the others
    keep the proxies' defaults."""
    return {
        "generated_by": "rmq-polling-report",
        "thresholds": [
            {
                "group": r.group,
                "topic": r.topic,
                "high_rate": round(r.threshold_rps, 3),
                "low_rate": round(r.low_rps, 3),
            }
            for r in recommendations
            if r.enough_data
        ],
    }


def write_thresholds(recommendations: Iterable[Recommendation], path: str) -> int:
    """Write the thresholds file at ``path`` (a local path) whole: a temporary file in the
    same directory renamed over it, so a proxy never reads half of it. Returns the entries."""
    doc = thresholds_document(recommendations)
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent or Path("."))
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        os.unlink(tmp)
        raise
    return len(doc["thresholds"])
