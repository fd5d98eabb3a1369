"""The peer benchmark's one-screen summary: each figure per proxy, and ours over the best of
the others, in the direction that figure is better."""

from __future__ import annotations

from bench.peer import slowest_stages, summary


def test_ours_is_compared_with_the_best_peer_in_each_figures_direction():
    results = {
        "reported": {
            "apache": {"latency_ms_p99": 9300.0, "false_empties": 4, "sent": 20, "delivered": 19},
            "rust": {"latency_ms_p99": 7000.0, "false_empties": 3, "sent": 20, "delivered": 0},
            "notify": {"latency_ms_p99": 14.0, "false_empties": 0, "sent": 25, "delivered": 25},
            "adaptive": {"latency_ms_p99": 21.0, "false_empties": 0},
        },
        "busy": {
            "apache": {"delivered_per_s": 800.0},
            "notify": {"delivered_per_s": 1000.0},
            "coupled": {"delivered_per_s": 900.0},
        },
        "fanin": {
            "2000": {"apache": {"kb_per_poll": 24.0}, "notify": {"kb_per_poll": 30.0}},
            "20000": {"apache": {"kb_per_poll": 20.0}, "notify": {"kb_per_poll": 18.0}},
        },
        "overhead": {"msgs_per_s": {"apache": 2000, "notify": 1500, "direct": 3000}},
    }

    table = summary(results)

    # Lower is better: our best (14 ms) over their best (7,000 ms).
    assert table["reported p99 ms"]["ours / best peer"] == 0.0
    assert table["reported p99 ms"]["rust"] == 7000.0
    assert table["reported false empties"]["ours / best peer"] == 0.0
    # Delivered as a share of what each proxy's slots sent; higher is better.
    assert table["reported delivered / sent"] == {
        "apache": 0.95,
        "rust": 0.0,
        "notify": 1.0,
        "ours / best peer": 1.05,
    }
    # Higher is better: our best (1,000 msg/s) over theirs (800).
    assert table["busy msg/s"]["ours / best peer"] == 1.25
    # The largest fan-in only, as a number of polls (not "2000" > "20000" as text).
    assert table["RSS KB per idle poll (20000)"]["ours / best peer"] == 0.9
    assert table["overhead / direct"] == {"apache": 0.67, "notify": 0.5, "ours / best peer": 0.75}
    assert table["overhead msg/s"]["ours / best peer"] == 0.75


def test_the_slowest_messages_are_split_into_the_stages_of_the_poll_that_took_them(tmp_path):
    # A poll arrived at epoch 1000.000 s; its first pop found nothing, a probe of broker-b
    # answered 1,500 ms in, the pop it woke took the message, and the answer was written.
    line = (
        "2026-11-26 00:00:00,000 DEBUG proxy.receive.timeline: receive G/T "
        "arrived_ms=1000000 mode=notify polling_ms=10000 ids=SLOW: mode:notify@0.0 "
        "pop:broker-a@0.2 popped:broker-a/0@2.0 watch:broker-b@2.1 has_msg:broker-b@1500.0 "
        "pop:broker-b@1500.4 popped:broker-b/1@1503.0 written:1@1503.5\n"
    )
    (tmp_path / "proxy-notify.log").write_text(line)
    rows = {
        # The slow one was sent 1,498 ms after the poll arrived, received 1,506 ms after.
        "notify": {"messages": [("FAST", 0.0, 0.005), ("SLOW", 1001.498, 1001.506)]},
        "apache": {"messages": [("X", 0.0, 9.0)]},  # a foreign proxy has no timelines
    }

    slowest = slowest_stages(rows, tmp_path)

    assert list(slowest) == ["notify"]
    first, second = slowest["notify"]
    assert first["id"] == "SLOW" and first["latency_ms"] == 8.0
    assert first["found_by"] == "probe"
    assert (first["heard_ms"], first["pop_sent_ms"], first["popped_ms"], first["written_ms"]) == (
        2.0,
        2.4,
        5.0,
        5.5,
    )
    assert second == {"latency_ms": 5.0, "id": "FAST"}  # no timeline of its poll
