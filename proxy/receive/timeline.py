"""A poll's timeline, for finding where a slow answer waited: off unless the
``proxy.receive.timeline`` logger is at DEBUG.

Each stage of a poll is marked with its loop time (pop sent / answered, watch armed, probe
sent, hasMsg heard, answer written); the API logs the whole timeline as one line when the
request ends, in milliseconds from the request's arrival. It costs nothing when the logger
is off (no timeline is made), and a few list appends per poll when on. It is a debug log,
not a field of the event log: the event log's fields are a contract with its readers, and
the stages matter while investigating one slow answer, not in every line of analytics.
"""

from __future__ import annotations

import logging
import re

log = logging.getLogger("proxy.receive.timeline")


class Timeline:
    __slots__ = ("marks",)

    def __init__(self) -> None:
        self.marks: list[tuple[float, str, str]] = []  # (loop time, stage, detail)

    @staticmethod
    def wanted() -> Timeline | None:
        """A new timeline when the timeline logger is on, else None."""
        return Timeline() if log.isEnabledFor(logging.DEBUG) else None

    def mark(self, at: float, stage: str, detail: str = "") -> None:
        self.marks.append((at, stage, detail))

    def render(self, origin: float) -> str:
        """``stage[:detail]@ms`` for each mark, ms from ``origin`` (the arrival)."""
        return " ".join(
            f"{stage}{':' + detail if detail else ''}@{(at - origin) * 1000:.1f}"
            for at, stage, detail in self.marks
        )

    def log(self, origin: float, head: str) -> None:
        """Write the timeline as one debug line: ``head`` (who, what), then the stages."""
        log.debug("%s: %s", head, self.render(origin))


# The line ``proxy/api/receive.py`` logs for a poll, read back by the benchmarks.
TIMELINE = re.compile(
    r"proxy\.receive\.timeline: receive (?P<group>\S+)/(?P<topic>\S+) arrived_ms=(?P<arrived>\d+)"
    r" mode=(?P<mode>\S+) polling_ms=\d+ ids=(?P<ids>\S+): (?P<stages>.*)$"
)


def timelines(log_text: str) -> dict[str, dict[str, object]]:
    """Message id -> the poll that delivered it: its mode, arrival (epoch s) and stages."""
    out: dict[str, dict[str, object]] = {}
    for line in log_text.splitlines():
        m = TIMELINE.search(line)
        if m is None or m["ids"] == "-":
            continue
        stages = m["stages"].split()
        arrived = int(m["arrived"]) / 1000
        written = [float(s.rsplit("@", 1)[1]) for s in stages if s.startswith("written")]
        poll = {
            "mode": m["mode"],
            "arrived": arrived,
            "written": arrived + written[0] / 1000 if written else None,
            "stages": stages,
        }
        for msg_id in m["ids"].split(","):
            out[msg_id] = poll
    return out
