"""Plain records of what a run found, for the report and the Pushgateway (no Spark here)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from polling_report.recommend import Recommendation


@dataclass(frozen=True, slots=True)
class WindowRow:
    """One aggregate row: a window of one proxy (or ``_fleet``), group, topic and mode."""

    window_start: datetime
    window_end: datetime
    proxy: str
    group: str
    topic: str
    mode: str
    requests: int
    long_polls: int
    short_poll_hits: int
    found: int
    messages: int
    pops: int
    notifications: int
    request_rate: float
    long_poll_share: float
    short_poll_hit_ratio: float
    found_ratio: float
    broker_requests_per_message: float | None
    wait_p50_ms: int
    wait_p90_ms: int
    wait_p99_ms: int

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> WindowRow:
        return cls(**{name: values[name] for name in cls.__slots__})


class PollRatios:
    """The ratios operators read, from the counts of a set of receive requests (never
    empty): the run's totals, and each window of the HTML report."""

    __slots__ = ()
    requests: int
    long_polls: int
    short_poll_hits: int
    messages: int
    broker_requests: int  # pops + notifications

    @property
    def long_poll_share(self) -> float:
        return self.long_polls / self.requests

    @property
    def short_poll_hit_ratio(self) -> float:
        return self.short_poll_hits / self.requests

    @property
    def broker_requests_per_message(self) -> float | None:
        return self.broker_requests / self.messages if self.messages else None


@dataclass(frozen=True, slots=True)
class Totals(PollRatios):
    """All windows of the run, all proxies, for one group, topic and mode."""

    group: str
    topic: str
    mode: str
    requests: int
    long_polls: int
    short_poll_hits: int
    found: int
    messages: int
    broker_requests: int  # pops + notifications

    @property
    def found_ratio(self) -> float:
        return self.found / self.requests


@dataclass(slots=True)
class Summary:
    """What one run read and produced."""

    source: str
    window_s: int
    lines: int = 0  # lines read, malformed included
    malformed: int = 0
    dates: list[str] = field(default_factory=list)  # date partitions written
    first_window: datetime | None = None
    last_window_end: datetime | None = None
    totals: list[Totals] = field(default_factory=list)
    latest: list[WindowRow] = field(default_factory=list)  # the latest complete window
    latest_complete: bool = True  # False: no window is complete yet, ``latest`` is the newest
    recommendations: list[Recommendation] = field(default_factory=list)

    @property
    def records(self) -> int:
        return self.lines - self.malformed

    @property
    def latest_window_end(self) -> datetime | None:
        return self.latest[0].window_end if self.latest else None
