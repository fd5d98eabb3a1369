"""The HTML report (``rmq-polling-report --html``) rendered in a real headless Chromium: every
chart of every (group, topic) drew its data inside its plot area, the numbers the page shows
are the Parquet output's, and opening the page fetches nothing from the network."""

from __future__ import annotations

import io

import pytest
from PIL import Image
from pyspark.sql import functions as F

from polling_report.cli import main
from polling_report.html import Chart
from polling_report.schema import FLEET
from tests.analytics._events import event, write_log
from tests.support.chromium import headless_chromium

pytestmark = pytest.mark.slow

DAY = "2024-05-01"
# matplotlib's default cycle for the two proxies (C0, C1), the modes' colours, the fleet.
PROXY_COLOURS = {"p1": (0x1F, 0x77, 0xB4), "p2": (0xFF, 0x7F, 0x0E)}
MODE_COLOURS = {
    "notify": (0x1F, 0x77, 0xB4),
    "coupled": (0xD6, 0x27, 0x28),
    "slicing": (0x2C, 0xA0, 0x2C),
}
BLACK = (0, 0, 0)


def fleet_log(root) -> None:
    """Six minutes of two proxies: p1 serves orders/Orders in notify mode for three minutes
    (long polls, few first-pop hits), then coupled (every first pop hits); p2 in notify
    throughout. p2 alone serves audit/Audit, in slicing mode, with nothing to deliver in
    its third minute (no broker requests per message there: a gap)."""
    p1, p2, audit = [], [], []
    for minute in range(6):
        coupled = minute >= 3
        for i in range(4 + minute):
            hit = coupled or i == 0
            p1.append(
                event(
                    f"{DAY}T10:0{minute}:{i * 5:02d}", proxy="p1", group="orders",
                    topic="Orders", mode="coupled" if coupled else "notify",
                    is_long_polling=not hit, is_short_polling_hit=hit,
                    messages=2 if hit else 1, result="found", pops=1 if hit else 2,
                    notifications=0 if hit else 3,
                )
            )  # fmt: skip
        for i in range(3):
            p2.append(
                event(
                    f"{DAY}T10:0{minute}:{i * 7 + 1:02d}", proxy="p2", group="orders",
                    topic="Orders", is_short_polling_hit=i == 2, is_long_polling=i != 2,
                    messages=1, result="found", pops=1, notifications=i,
                )
            )  # fmt: skip
        audit.append(
            event(
                f"{DAY}T10:0{minute}:30", proxy="p2", group="audit", topic="Audit",
                mode="slicing", messages=0 if minute == 2 else 1,
                result="empty" if minute == 2 else "found", pops=3,
            )
        )  # fmt: skip
    write_log(root, "part-p1", p1)
    write_log(root, "part-p2", p2 + audit)


Cell = tuple[int, float, float, float | None]


def expected_cells(spark, out) -> dict[tuple[str, int, str], Cell]:
    """(section key, window epoch s, proxy) -> requests, long-poll share, hit ratio, broker
    requests per message: the Parquet output summed over modes, as the page should show."""
    rows = (
        spark.read.parquet(out)
        .groupBy(F.unix_seconds("window_start").alias("w"), "proxy", "group", "topic")
        .agg(
            F.sum("requests").alias("requests"),
            F.sum("long_polls").alias("long_polls"),
            F.sum("short_poll_hits").alias("hits"),
            F.sum(F.col("pops") + F.col("notifications")).alias("broker"),
            F.sum("messages").alias("messages"),
        )
        .collect()
    )
    return {
        (f"{r['group']}--{r['topic']}", r["w"], r["proxy"]): (
            r["requests"],
            r["long_polls"] / r["requests"],
            r["hits"] / r["requests"],
            r["broker"] / r["messages"] if r["messages"] else None,
        )
        for r in rows
    }


def pixels_near(png: bytes, colour: tuple[int, int, int], tolerance: int = 40) -> int:
    """How many pixels of ``png`` are within ``tolerance`` of ``colour`` on every channel."""
    image = Image.open(io.BytesIO(png)).convert("RGB")
    near = 0
    for count, pixel in image.getcolors(maxcolors=image.width * image.height) or []:
        assert isinstance(pixel, tuple)  # RGB
        if all(abs(a - b) <= tolerance for a, b in zip(pixel, colour, strict=True)):
            near += count
    return near


PAGE_ROWS = """
[...document.querySelectorAll('table.windows tr[data-window]')].map(tr => [
  tr.closest('table').dataset.key, Number(tr.dataset.window), tr.dataset.proxy,
  ...[...tr.querySelectorAll('td.n')].map(td => td.textContent)])
"""

AREAS = """
Object.fromEntries([...document.querySelectorAll('[id$="-area"]')].map(e => {
  const r = e.getBoundingClientRect();
  return [e.id, {x: r.x + window.scrollX, y: r.y + window.scrollY,
                 width: r.width, height: r.height}];
}))
"""


async def test_the_html_report_draws_every_chart_with_the_parquet_numbers(spark, tmp_path):
    events, out, page_path = tmp_path / "events", str(tmp_path / "out"), tmp_path / "r.html"
    fleet_log(events)
    options = ["--min-requests", "1", "--target-hit-ratio", "0.8"]
    assert main([str(events), "--out", out, "--html", str(page_path), *options]) == 0
    expected = expected_cells(spark, out)
    assert len(expected) == 6 * 5  # a minute: orders of p1, p2, the fleet; audit of p2, the fleet

    async with headless_chromium(tmp_path / "chromium") as page:
        await page.open(page_path.as_uri())
        # Self-contained: the page itself is the only thing it loads.
        assert page.requested_urls() == [page_path.as_uri()]

        shown = await page.evaluate(PAGE_ROWS)
        assert len(shown) == len(expected)
        for key, window, proxy, requests, long_share, hits, per_message in shown:
            want = expected[(key, window, proxy)]
            assert int(requests) == want[0]
            assert float(long_share) == pytest.approx(want[1], abs=5e-5)
            assert float(hits) == pytest.approx(want[2], abs=5e-5)
            if want[3] is None:
                assert per_message == "-"
            else:
                assert float(per_message) == pytest.approx(want[3], abs=5e-5)

        areas = await page.evaluate(AREAS)
        sections = {"orders--Orders": ["p1", "p2"], "audit--Audit": ["p2"]}
        assert set(areas) == {f"{key}-{chart}-area" for key in sections for chart in Chart}
        for key, proxies in sections.items():
            for chart in Chart:
                area = areas[f"{key}-{chart}-area"]
                assert area["width"] > 300 and area["height"] > 80, (key, chart, area)
                # Inside the frame: the axes' black spines are not the fleet's line.
                inner = {
                    "x": area["x"] + 4,
                    "y": area["y"] + 4,
                    "width": area["width"] - 8,
                    "height": area["height"] - 8,
                }
                png = await page.screenshot(inner)
                if chart is Chart.MODES:
                    modes = ["notify", "coupled"] if key == "orders--Orders" else ["slicing"]
                    for mode in modes:
                        assert pixels_near(png, MODE_COLOURS[mode]) > 500, (key, mode)
                    continue
                for proxy in proxies:
                    assert pixels_near(png, PROXY_COLOURS[proxy]) > 50, (key, chart, proxy)
                if chart is not Chart.RATE:
                    assert pixels_near(png, BLACK, 60) > 50, (key, chart, FLEET)

        full = await page.screenshot()
    width, height = Image.open(io.BytesIO(full)).size
    assert width >= 1000 and height > 2 * 900  # two sections of five charts each


def test_series_show_gaps_keep_ids_unique_and_take_the_busiest_mode():
    """No Spark: the grouping behind the charts. A window with no request is a gap (its
    value NaN), not skipped; two (group, topic) names that make the same HTML id get
    distinct ones; a proxy's mode in a window is the one that served most requests."""
    from datetime import UTC, datetime, timedelta

    from polling_report.html import series_of
    from polling_report.model import WindowRow

    t0 = datetime(2024, 5, 1, 10, tzinfo=UTC)

    def row(minute: int, group: str, mode: str, requests: int) -> WindowRow:
        start = t0 + timedelta(minutes=minute)
        return WindowRow(start, start + timedelta(minutes=1), "p1", group, "t", mode,
                         requests, 0, 0, 0, 0, 0, 0, requests / 60, 0.0, 0.0, 0.0, None,
                         1, 1, 1)  # fmt: skip

    rows = [row(0, "g.1", "notify", 5), row(0, "g.1", "coupled", 7), row(3, "g.1", "notify", 2),
            row(0, "g_1", "notify", 1)]  # fmt: skip
    first, second = series_of(rows, 60)
    assert (first.group, second.group) == ("g.1", "g_1")
    assert (first.key, second.key) == ("g_1--t", "g_1--t-1")
    assert first.windows == [t0 + timedelta(minutes=m) for m in range(4)]
    assert first.cells[(t0, "p1")].mode == "coupled"
    assert first.cells[(t0, "p1")].requests == 12
    assert (t0 + timedelta(minutes=1), "p1") not in first.cells
