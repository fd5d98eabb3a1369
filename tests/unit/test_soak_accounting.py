"""The official-client soak's accounting: which part of a rolling restart an error falls in."""

from __future__ import annotations

from bench.soak_official import restart_phase

ROLLING = {
    "t": 10_000,
    "fault": "rolling",
    "took_s": 30.0,
    "steps": [
        {"proxy": "proxy-1", "term": 10_000, "exit": 14_000, "ready": 20_000},
        {"proxy": "proxy-2", "term": 22_000, "exit": 25_000, "ready": 31_000},
    ],
}


def test_an_error_is_placed_in_the_step_of_the_restart_it_came_in():
    faults = [{"t": 1_000, "fault": "proxy", "took_s": 2.0}, ROLLING]
    assert restart_phase(500, faults) is None  # before any fault
    assert restart_phase(2_000, faults) is None  # a SIGKILL is no rolling restart
    assert restart_phase(10_000, faults) == "drain"
    assert restart_phase(13_999, faults) == "drain"
    assert restart_phase(14_000, faults) == "start"
    assert restart_phase(21_000, faults) == "serving"  # between the two proxies' turns
    assert restart_phase(23_000, faults) == "drain"
    assert restart_phase(30_000, faults) == "start"
    assert restart_phase(31_000, faults) == "serving"
    assert restart_phase(40_001, faults) is None  # after the restart ended
