"""The adaptive switch's decisions on crafted request and first-pop sequences, with the
clock passed in (``now``), so every step is exact."""

from __future__ import annotations

from proxy.config import PollMode
from proxy.receive.adaptive import AdaptiveSwitch, Evidence, Thresholds, Window

NOTIFY, COUPLED = PollMode.NOTIFY, PollMode.COUPLED
G, T = "g", "t"


def switch(**evidence: float) -> AdaptiveSwitch:
    # 10 s window, coupled above 50 requests/s, notify again below 25.
    return AdaptiveSwitch(50.0, 25.0, 10.0, Evidence(**evidence))  # type: ignore[arg-type]


def run(
    s: AdaptiveSwitch,
    start: float,
    seconds: float,
    rate: float,
    hit_ratio: float,
    coupled_in_flight: int = 0,
    group: str = G,
) -> tuple[float, list[PollMode]]:
    """``rate`` requests per second for ``seconds`` from ``start``; each poll reports its
    first pop at once, a hit for the first ``hit_ratio`` of every 10. Returns the end time
    and the mode of every request."""
    modes: list[PollMode] = []
    n = round(seconds * rate)
    for i in range(n):
        now = start + i / rate
        modes.append(s.choose(group, T, now, coupled_in_flight).mode)
        s.first_pop(group, T, now, hit=(i % 10) < round(hit_ratio * 10))
    return start + n / rate, modes


def test_window_counts_the_last_seconds_only() -> None:
    w = Window(3)
    for now in (0.1, 0.5, 1.2, 2.9):
        w.add(now)
    assert w.count(2.99) == 4
    assert w.count(3.0) == 2  # second 0 left the window
    assert w.count(4.5) == 1
    assert w.count(100.0) == 0  # a jump clears everything
    w.add(100.2, 5)
    assert w.count(100.9) == 5


def test_a_high_rate_of_first_pop_hits_goes_coupled() -> None:
    s = switch()
    _, modes = run(s, 1000.0, 12, rate=80, hit_ratio=1.0)
    assert modes[0] is NOTIFY and modes[-1] is COUPLED
    switched_at = modes.index(COUPLED)
    # The rate passes 50/s (500 requests in the 10 s window) after 500 requests.
    assert 500 <= switched_at <= 510
    assert all(m is COUPLED for m in modes[switched_at:])


def test_a_high_rate_of_misses_stays_notify() -> None:
    """The idle fan-in: many consumers, a high rate, nothing found by the first pop."""
    s = switch()
    _, modes = run(s, 1000.0, 30, rate=250, hit_ratio=0.0)
    assert set(modes) == {NOTIFY}
    _, modes = run(s, 2000.0, 30, rate=250, hit_ratio=0.8)  # hits, but below 90 %
    assert set(modes) == {NOTIFY}


def test_a_low_rate_of_hits_stays_notify() -> None:
    s = switch()
    _, modes = run(s, 1000.0, 30, rate=40, hit_ratio=1.0)
    assert set(modes) == {NOTIFY}


def test_no_switch_before_enough_first_pops() -> None:
    """A burst of requests whose first pops have not answered yet: no evidence, no
    coupled. Then the moving average (weight 1/20) needs 45 hits in a row from nothing to
    reach 90 %: 1 - 0.95**44 = 0.895, 1 - 0.95**45 = 0.901."""
    s = switch(min_polls=20)
    for i in range(700):  # 70/s over 10 s, no first pop answered
        assert s.choose(G, T, 1000.0 + i / 70).mode is NOTIFY
    for _ in range(44):
        s.first_pop(G, T, 1010.0, hit=True)
    assert s.choose(G, T, 1010.0).mode is NOTIFY
    s.first_pop(G, T, 1010.0, hit=True)
    decision = s.choose(G, T, 1010.0)
    assert decision.mode is COUPLED and decision.switched
    assert "first-pop hit ratio 90% (45 in 10 s)" in decision.reason


def test_a_run_of_misses_goes_back_within_a_few_polls() -> None:
    """Busy, then idle consumers arrive: their coupled pops park (misses, reported at
    10 ms). A window full of old hits does not keep the key coupled: 7 misses in a row
    take the average from 1.0 to 0.95**7 = 0.698, under 70 %."""
    s = switch()
    now, modes = run(s, 1000.0, 12, rate=80, hit_ratio=1.0)
    assert modes[-1] is COUPLED
    seen = []
    for i in range(10):
        seen.append(s.choose(G, T, now + i / 100).mode)
        s.first_pop(G, T, now + i / 100, hit=False)
    assert seen == [COUPLED] * 7 + [NOTIFY] * 3


def test_hit_ratio_hysteresis_back_to_notify_below_the_low_ratio_only() -> None:
    s = switch(hit_high=0.9, hit_low=0.7)
    now, modes = run(s, 1000.0, 12, rate=80, hit_ratio=1.0)
    assert modes[-1] is COUPLED
    # 80 % hits: below the 90 % to enter, above the 70 % to leave: stays coupled.
    now, modes = run(s, now, 20, rate=80, hit_ratio=0.8)
    assert set(modes) == {COUPLED}
    # 50 % hits: the window's ratio falls under 70 %, back to notify, and stays there.
    now, modes = run(s, now, 20, rate=80, hit_ratio=0.5)
    assert modes[0] is COUPLED and modes[-1] is NOTIFY
    back = modes.index(NOTIFY)
    assert all(m is NOTIFY for m in modes[back:])
    # 80 % again: not enough to come back.
    _, modes = run(s, now, 20, rate=80, hit_ratio=0.8)
    assert set(modes) == {NOTIFY}


def test_rate_hysteresis() -> None:
    s = switch()
    now, modes = run(s, 1000.0, 12, rate=80, hit_ratio=1.0)
    assert modes[-1] is COUPLED
    now, modes = run(s, now, 20, rate=30, hit_ratio=1.0)  # under 50, over 25
    assert set(modes) == {COUPLED}
    now, modes = run(s, now, 20, rate=20, hit_ratio=1.0)  # under 25
    assert modes[-1] is NOTIFY
    _, modes = run(s, now, 20, rate=40, hit_ratio=1.0)  # under 50: stays notify
    assert set(modes) == {NOTIFY}


def test_evidence_running_out_goes_back_to_notify() -> None:
    """The rate stays high but no first pop is reported any more (none answers, say): the
    evidence ages out of the window and the key goes back to notify."""
    s = switch()
    now, modes = run(s, 1000.0, 12, rate=80, hit_ratio=1.0)
    assert modes[-1] is COUPLED
    seen = []
    for i in range(1500):  # 100/s for 15 s, nothing finishes
        seen.append(s.choose(G, T, now + i / 100).mode)
    assert seen[0] is COUPLED and seen[-1] is NOTIFY
    assert seen.index(NOTIFY) <= 1100  # within the 10 s window and a second


def test_polling_full_goes_back_at_once_and_holds_notify_for_a_window() -> None:
    s = switch()
    now, modes = run(s, 1000.0, 12, rate=80, hit_ratio=1.0)
    assert modes[-1] is COUPLED
    decision = s.polling_full(G, T, now)
    assert decision is not None and decision.mode is NOTIFY and decision.switched
    assert "POLLING_FULL" in decision.reason
    assert s.current(G, T) is NOTIFY
    # All hits again at a high rate: the evidence was dropped and the key is held, so it
    # comes back only after the hold (one window) and min_polls fresh polls.
    later, modes = run(s, now, 9.5, rate=80, hit_ratio=1.0)
    assert set(modes) == {NOTIFY}
    _, modes = run(s, later, 2, rate=80, hit_ratio=1.0)
    assert modes[-1] is COUPLED


def test_coupled_polls_near_the_per_key_limit_go_back_to_notify() -> None:
    s = switch(max_coupled=512)
    now, modes = run(s, 1000.0, 12, rate=80, hit_ratio=1.0)
    assert modes[-1] is COUPLED
    assert s.choose(G, T, now, coupled_in_flight=511).mode is COUPLED
    decision = s.choose(G, T, now, coupled_in_flight=512)
    assert decision.mode is NOTIFY and decision.switched
    assert "512 coupled polls in flight" in decision.reason
    # After the hold, hits again, but still 300 coupled polls parked (over half the
    # limit): stays notify until they drain.
    now, modes = run(s, now + 10, 8, rate=80, hit_ratio=1.0, coupled_in_flight=300)
    assert set(modes) == {NOTIFY}
    _, modes = run(s, now, 1, rate=80, hit_ratio=1.0, coupled_in_flight=0)
    assert modes[-1] is COUPLED


def test_per_key_thresholds_override_the_defaults() -> None:
    s = switch()
    s.set_thresholds({("busy", T): Thresholds(10.0, 5.0)})
    _, modes = run(s, 1000.0, 15, rate=20, hit_ratio=1.0, group="busy")
    assert modes[-1] is COUPLED
    _, modes = run(s, 1000.0, 15, rate=20, hit_ratio=1.0, group="other")
    assert set(modes) == {NOTIFY}  # the default 50/s still applies
    s.set_thresholds({})  # defaults again: 20/s < 25, back to notify
    _, modes = run(s, 1015.0, 2, rate=20, hit_ratio=1.0, group="busy")
    assert modes[-1] is NOTIFY


def test_keys_are_forgotten_least_recently_seen_first() -> None:
    s = AdaptiveSwitch(50.0, 25.0, 10.0, max_keys=3)
    for i, group in enumerate(["a", "b", "c"]):
        s.choose(group, T, 1000.0 + i)
    s.choose("a", T, 1003.0)  # a is now the most recent
    s.choose("d", T, 1004.0)  # forgets b
    assert len(s) == 3
    assert {e["group"] for e in s.snapshot(1004.0)} == {"a", "c", "d"}
    s.first_pop("b", T, 1004.0, hit=True)  # forgotten: ignored, not created again
    assert s.polling_full("b", T, 1004.0) is None
    assert len(s) == 3


def test_snapshot_shows_the_evidence() -> None:
    s = switch()
    now, _ = run(s, 1000.0, 12, rate=80, hit_ratio=1.0)
    (entry,) = s.snapshot(now - 0.001)
    assert entry["mode"] == "coupled"
    assert entry["hit_ratio"] == 1.0
    assert entry["polls"] == 800  # the last 10 whole seconds at 80/s
    assert entry["rate"] == 80.0
    assert entry["high_rate"] == 50.0
