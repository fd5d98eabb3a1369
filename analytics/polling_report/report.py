"""The readable report printed to stdout (plain text, fixed-width tables)."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from datetime import datetime

from polling_report.model import Summary

# The short form of the rule in recommend.py's docstring.
RULE = (
    "Rule: per (group, topic), every proxy's window is a point (request rate, first-pop "
    "hits). The threshold is the lowest observed rate at which the windows at that rate or "
    "above, together, hit on the first pop at least the target share of the time (with "
    "enough requests to judge). Above it coupled polling serves almost every poll from the "
    "first pop, so notification probes are rarely worth their broker requests. If no rate "
    "qualifies, pop-with-notify is the better mode at every rate seen: the threshold goes to "
    "twice the highest rate, at least the proxy's default; with too few requests, the default."
)


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], left: int = 3) -> list[str]:
    """Text columns (the first ``left``) left-aligned, numbers right-aligned."""
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if i < left else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return [line(headers), *(line(r) for r in rows)]


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.1f}%"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _time(t: datetime | None) -> str:
    return "-" if t is None else t.strftime("%Y-%m-%d %H:%M:%S")


def render(summary: Summary) -> str:
    s = summary
    out = [
        f"rmq-polling-report: {s.records:,} records, {s.malformed:,} malformed lines "
        f"from {s.source}",
        f"windows of {s.window_s} s, {_time(s.first_window)} to {_time(s.last_window_end)} "
        f"UTC; dates written: {', '.join(s.dates) or 'none'}",
        "",
        "All windows, all proxies",
    ]
    out += _table(
        [
            "group",
            "topic",
            "mode",
            "requests",
            "long polls",
            "first-pop hits",
            "found",
            "broker req/msg",
        ],
        [
            [
                t.group,
                t.topic,
                t.mode,
                f"{t.requests:,}",
                _pct(t.long_poll_share),
                _pct(t.short_poll_hit_ratio),
                _pct(t.found_ratio),
                _num(t.broker_requests_per_message),
            ]
            for t in s.totals
        ],
    )
    out.append("")
    if s.latest:
        first = s.latest[0]
        span = f"{_time(first.window_start)} to {_time(first.window_end)} UTC"
        if s.latest_complete:
            out.append(f"Latest complete window {span}")
        else:
            out.append(f"Newest window {span} (none complete yet: it may still grow)")
        out += _table(
            [
                "proxy",
                "group",
                "topic",
                "mode",
                "requests",
                "req/s",
                "long polls",
                "first-pop hits",
                "found",
                "broker req/msg",
                "wait p50/p90/p99 ms",
            ],
            [
                [
                    r.proxy,
                    r.group,
                    r.topic,
                    r.mode,
                    f"{r.requests:,}",
                    _num(r.request_rate),
                    _pct(r.long_poll_share),
                    _pct(r.short_poll_hit_ratio),
                    _pct(r.found_ratio),
                    _num(r.broker_requests_per_message),
                    f"{r.wait_p50_ms}/{r.wait_p90_ms}/{r.wait_p99_ms}",
                ]
                for r in s.latest
            ],
            left=4,
        )
    else:
        out.append("No windows: nothing was read.")
    out += ["", "Recommended adaptive threshold (receive.adaptive_high_rate, per proxy)"]
    for r in s.recommendations:
        out.append(
            f"{r.group} / {r.topic}: adaptive_high_rate {_num(r.threshold_rps)}, "
            f"adaptive_low_rate {_num(r.low_rps)} req/s"
        )
        out.append(textwrap.fill(r.explain(), 96, initial_indent="    ", subsequent_indent="    "))
    if not s.recommendations:
        out.append("No data.")
    out += ["", textwrap.fill(RULE, 96)]
    return "\n".join(out) + "\n"
