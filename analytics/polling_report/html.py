"""The report as one self-contained HTML page: per (group, topic), charts over time and the
numbers they are drawn from.

Operators read the text report for the latest window; the page shows how a group's polling
moved over the whole run, per proxy and for the fleet:

- the share of long polls (requests the proxy held past the first pop);
- the short-polling hit ratio (requests the first pop served);
- broker requests (pops and notification probes) per delivered message;
- the mode each proxy served the group in;
- each proxy's request rate, with the advised ``adaptive_high_rate`` / ``adaptive_low_rate``.

The charts are drawn with matplotlib into inline SVG when the job runs, so the page needs no
script and no network when it is opened (mailed, archived, served from a bucket). Each plot
area carries an id (``<key>-<chart>-area``) so that a browser test can find it; each
(group, topic) has a table of the per-window numbers behind its charts.
"""

from __future__ import annotations

import enum
import html
import io
import math
import os
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import matplotlib
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from polling_report.model import PollRatios, Summary, WindowRow
from polling_report.recommend import Recommendation
from polling_report.schema import FLEET


class Chart(enum.StrEnum):
    """The charts of each (group, topic), top to bottom; the value names its plot area."""

    LONG_POLLS = "long-polls"
    HITS = "hits"
    BROKER_REQUESTS = "broker-requests"
    MODES = "modes"
    RATE = "rate"

    @property
    def heading(self) -> str:
        return _HEADINGS[self]


_HEADINGS = {
    Chart.LONG_POLLS: "Long polls, share of requests",
    Chart.HITS: "Short-polling hits (the first pop found messages), share of requests",
    Chart.BROKER_REQUESTS: "Broker requests (pops and probes) per delivered message",
    Chart.MODES: "Mode each proxy served in (the mode of most of the window's requests)",
    Chart.RATE: "Requests per second per proxy, and the advised thresholds",
}
_MODE_COLOURS = {
    "notify": "#1f77b4",
    "coupled": "#d62728",
    "slicing": "#2ca02c",
    "lite": "#9467bd",
    "remoting": "#8c564b",
}
_FLEET_STYLE = {"color": "black", "linewidth": 2.2, "linestyle": "--", "label": "fleet"}


@dataclass(slots=True)
class Counts(PollRatios):
    """One proxy's (or the fleet's) window of a (group, topic), all modes summed."""

    requests: int = 0
    long_polls: int = 0
    short_poll_hits: int = 0
    messages: int = 0
    broker_requests: int = 0
    # Requests per mode: a proxy that switched within the window served in both.
    modes: dict[str, int] = field(default_factory=dict)

    def add(self, row: WindowRow) -> None:
        self.requests += row.requests
        self.long_polls += row.long_polls
        self.short_poll_hits += row.short_poll_hits
        self.messages += row.messages
        self.broker_requests += row.pops + row.notifications
        self.modes[row.mode] = self.modes.get(row.mode, 0) + row.requests

    @property
    def mode(self) -> str:
        """The mode that served most of the window's requests (ties: by name)."""
        return min(self.modes, key=lambda m: (-self.modes[m], m))


@dataclass(slots=True)
class Series:
    """What the charts of one (group, topic) show: per window start, per proxy and fleet."""

    group: str
    topic: str
    window_s: int
    key: str = ""  # the section's HTML id: the names made id-safe, unique in the page
    windows: list[datetime] = field(default_factory=list)
    proxies: list[str] = field(default_factory=list)
    # (window start, proxy or FLEET) -> counts
    cells: dict[tuple[datetime, str], Counts] = field(default_factory=dict)


# Past this many windows from a series' first to its last (a report over weeks of one-minute
# windows) only the windows with requests are drawn, joined across the gaps.
MAX_GRID_WINDOWS = 20_000


def series_of(rows: Iterable[WindowRow], window_s: int) -> list[Series]:
    """Group the aggregate rows by (group, topic), summing each window's modes."""
    by_key: dict[tuple[str, str], Series] = {}
    for row in rows:
        s = by_key.get((row.group, row.topic))
        if s is None:
            s = by_key[(row.group, row.topic)] = Series(row.group, row.topic, window_s)
        s.cells.setdefault((row.window_start, row.proxy), Counts()).add(row)
    keys: set[str] = set()
    for group_topic in sorted(by_key):
        s = by_key[group_topic]
        s.key = _unique_id(f"{s.group}--{s.topic}", keys)
        # Every window from the first to the last, so that a stretch with no request shows
        # as a gap in the lines instead of a straight line across it.
        seen = sorted({w for w, _ in s.cells})
        step = timedelta(seconds=window_s)
        count = int((seen[-1] - seen[0]) / step) + 1
        grid = count <= MAX_GRID_WINDOWS
        s.windows = [seen[0] + i * step for i in range(count)] if grid else seen
        s.proxies = sorted({p for _, p in s.cells if p != FLEET})
    return [by_key[k] for k in sorted(by_key)]


def _unique_id(name: str, taken: set[str]) -> str:
    """``name`` made safe for an HTML id, with a suffix if another section has it."""
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in name)
    key, n = safe, 0
    while key in taken:
        n += 1
        key = f"{safe}-{n}"
    taken.add(key)
    return key


def render_html(rows: Sequence[WindowRow], summary: Summary) -> str:
    """The whole page for the stored rows ``rows`` (``summary.window_rows``) of a run."""
    advice = {(r.group, r.topic): r for r in summary.recommendations}
    series = series_of(rows, summary.window_s)
    # A proxy keeps its colour in every section.
    proxies = sorted({p for s in series for p in s.proxies})
    colours = {p: f"C{i % 10}" for i, p in enumerate(proxies)}
    sections = [_section(s, advice.get((s.group, s.topic)), colours) for s in series]
    span = (
        f"{_stamp(summary.first_window)} to {_stamp(summary.last_window_end)} UTC"
        if summary.first_window
        else "no windows"
    )
    body = "\n".join(sections) or "<p>No windows: nothing was read.</p>"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>RocketMQ proxy polling report</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; color: #222; max-width: 1100px; }}
h2 {{ margin-top: 2em; border-bottom: 1px solid #ccc; }}
table {{ border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0 1em; }}
th, td {{ padding: 2px 8px; border-bottom: 1px solid #eee; }}
td.n {{ text-align: right; font-variant-numeric: tabular-nums; }}
.advice {{ background: #f4f6fa; padding: 0.5em 1em; }}
details summary {{ cursor: pointer; color: #345; }}
</style></head><body>
<h1>RocketMQ proxy polling report</h1>
<p>{summary.records:,} records ({summary.malformed:,} malformed lines) from
{html.escape(summary.source)}; windows of {summary.window_s} s, {span}.</p>
{body}
</body></html>
"""


def write_html(path: str, rows: Sequence[WindowRow], summary: Summary) -> None:
    """Write the page to ``path`` (a local file), replacing it whole: a reader never sees a
    half-written page while a stream rewrites it after each batch."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".report-", suffix=".html", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(render_html(rows, summary))
        os.chmod(tmp, 0o644)  # a page to share; mkstemp makes it private
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _section(s: Series, advice: Recommendation | None, colours: dict[str, str]) -> str:
    title = f"{html.escape(s.group)} / {html.escape(s.topic)}"
    advised = (
        f"<p class='advice'>Advised: adaptive_high_rate {advice.threshold_rps:.2f}, "
        f"adaptive_low_rate {advice.low_rps:.2f} req/s. {html.escape(advice.explain())}</p>"
        if advice is not None
        else "<p class='advice'>No advice: no window of this group and topic.</p>"
    )
    return (
        f"<section id='{s.key}' data-group='{html.escape(s.group, quote=True)}' "
        f"data-topic='{html.escape(s.topic, quote=True)}'>\n<h2>{title}</h2>\n{advised}\n"
        f"<div class='chart'>{_chart_svg(s, advice, colours)}</div>\n"
        f"<details open><summary>The numbers, per window</summary>\n{_table(s)}</details>\n"
        "</section>"
    )


def _value(c: Counts, chart: Chart, window_s: int) -> float | None:
    if chart is Chart.LONG_POLLS:
        return c.long_poll_share
    if chart is Chart.HITS:
        return c.short_poll_hit_ratio
    if chart is Chart.BROKER_REQUESTS:
        return c.broker_requests_per_message
    return c.requests / window_s  # Chart.RATE


def _values(s: Series, who: str, chart: Chart) -> list[float]:
    """One line of a chart: NaN (a gap) where ``who`` had no request, or no message."""
    out = []
    for w in s.windows:
        c = s.cells.get((w, who))
        v = None if c is None else _value(c, chart, s.window_s)
        out.append(math.nan if v is None else v)
    return out


def _chart_svg(s: Series, advice: Recommendation | None, colours: dict[str, str]) -> str:
    # Concise date ticks; the setting is read when the first dates are plotted.
    with matplotlib.rc_context({"date.converter": "concise", "svg.hashsalt": "report"}):
        return _draw(s, advice, colours)


def _draw(s: Series, advice: Recommendation | None, colours: dict[str, str]) -> str:
    fig = Figure(figsize=(11, 13), layout="constrained")
    axes = fig.subplots(len(Chart), 1, sharex=True)
    for ax, chart in zip(axes, Chart, strict=True):
        ax.set_title(chart.heading, loc="left", fontsize=10)
        ax.patch.set_gid(f"{s.key}-{chart}-area")
        ax.grid(True, alpha=0.3)
        if chart is Chart.MODES:
            _draw_modes(ax, s)
            continue
        for p in s.proxies:
            ax.plot(s.windows, _values(s, p, chart), marker=".", color=colours[p], label=p)
        if chart is not Chart.RATE:
            ax.plot(s.windows, _values(s, FLEET, chart), **_FLEET_STYLE)
        if chart in (Chart.LONG_POLLS, Chart.HITS):
            ax.set_ylim(-0.03, 1.03)
            ax.yaxis.set_major_formatter(lambda v, _: f"{v:.0%}")
        if chart is Chart.RATE and advice is not None:
            ax.axhline(advice.threshold_rps, color="dimgray", linestyle=":", label="advised high")
            ax.axhline(advice.low_rps, color="dimgray", linestyle="-.", label="advised low")
        # Beside the plot, not over lines that run along its top (ratios at 100%).
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    axes[-1].set_xlabel("window start (UTC)")
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    svg = buf.getvalue()
    return svg[svg.index("<svg") :]  # inline: without the XML prologue and doctype


def _draw_modes(ax: Axes, s: Series) -> None:
    """A lane per proxy, a bar per window coloured by its mode, centred on the window's
    start as the other charts' points are."""
    width = timedelta(seconds=s.window_s * 0.95)
    seen: set[str] = set()
    for lane, p in enumerate(s.proxies):
        for w in s.windows:
            c = s.cells.get((w, p))
            if c is None:
                continue
            mode = c.mode
            ax.broken_barh(
                # Dates go through matplotlib's unit conversion; its stubs say floats.
                [(w - width / 2, width)],  # type: ignore[list-item]
                (lane - 0.4, 0.8),
                facecolors=_MODE_COLOURS.get(mode, "#7f7f7f"),
                label=None if mode in seen else mode,
            )
            seen.add(mode)
    ax.set_yticks(range(len(s.proxies)), s.proxies)
    ax.set_ylim(-0.7, len(s.proxies) - 0.3)
    ax.grid(False)
    if seen:
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)


def _table(s: Series) -> str:
    head = (
        "<tr><th>window start (UTC)</th><th>proxy</th><th>mode</th><th>requests</th>"
        "<th>long polls</th><th>short-polling hits</th><th>broker req/msg</th></tr>"
    )
    lines = [f"<table class='windows' data-key='{s.key}'>", head]
    for w in s.windows:
        for who in [*s.proxies, FLEET]:
            c = s.cells.get((w, who))
            if c is None:
                continue
            per_message = c.broker_requests_per_message
            modes = ", ".join(sorted(c.modes))
            lines.append(
                f"<tr data-window='{int(w.timestamp())}' data-proxy='{html.escape(who)}'>"
                f"<td>{_stamp(w)}</td><td>{html.escape(who)}</td><td>{html.escape(modes)}</td>"
                f"<td class='n'>{c.requests}</td>"
                f"<td class='n'>{c.long_poll_share:.4f}</td>"
                f"<td class='n'>{c.short_poll_hit_ratio:.4f}</td>"
                f"<td class='n'>{'-' if per_message is None else f'{per_message:.4f}'}</td>"
                "</tr>"
            )
    lines.append("</table>")
    return "\n".join(lines)


def _stamp(t: datetime | None) -> str:
    return "-" if t is None else t.strftime("%Y-%m-%d %H:%M:%S")
