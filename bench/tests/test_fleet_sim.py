"""A small seeded fleet through the real receive code (bench/sim), on simulated time."""

from __future__ import annotations

import time
from typing import Any

from bench.sim.fleet import Scenario, run


def _fleet(**kw) -> dict:
    base: dict[str, Any] = dict(proxies=3, brokers=4, keys=1, sampled=1, consumers=6, spread="even")
    base |= dict(rate=0, warmup_s=21, measure_s=10, seed=3)
    return run(Scenario(**(base | kw)))


def test_a_minute_of_simulated_fleet_takes_no_real_minute():
    started = time.perf_counter()
    out = _fleet(mode="notify")
    assert time.perf_counter() - started < 20  # 31 s of simulated time, no sleeping
    # Probes are shared: each proxy parks one NOTIFICATION per broker for its 2 polls.
    assert out["fleet_parked_notifications"] == 3 * 4
    assert out["parked_pops_mean"] == 0


def test_coupled_parks_a_pop_per_poll():
    out = _fleet(mode="coupled")
    assert out["fleet_parked_pops"] == 6
    assert out["fleet_parked_notifications"] == 0


def test_notify_past_the_brokers_limit_is_refused_and_the_probe_cap_keeps_under_it():
    # 20 proxies x 10,000 keys with 40 consumers each want about 17.4 x 10,000 probes per
    # broker: past RocketMQ's 100,000. Ten keys played, each standing for 1,000.
    over = dict(proxies=20, consumers=40, keys=10_000, sampled=10, rate=0.5, spread="random")
    today = _fleet(mode="notify", **over)
    assert today["polling_full_per_s"] > 1_000
    capped = _fleet(mode="notify", probe_cap=4_000, **over)  # 20 x 4,000 = 80,000
    assert capped["polling_full_per_s"] == 0
    assert capped["parked_notifications_max"] <= 80_000
    assert capped["delivered"] > 5
    assert capped["false_empties"] == 0
    assert capped["broker_requests_per_s"] < today["broker_requests_per_s"] / 2


def test_one_prober_per_key_parks_the_keys_once_whatever_the_proxies():
    # The case above with the fleet sharing its probes (receive/shared.py): each broker
    # holds one NOTIFICATION per key, 10,000, not 17.4 per key; nothing refused, nothing
    # missed, and each message still wakes one poll through one hop between proxies.
    over = dict(proxies=20, consumers=40, keys=10_000, sampled=10, rate=0.5, spread="random")
    shared = _fleet(mode="notify", shared=True, **over)
    assert shared["polling_full_per_s"] == 0
    assert shared["parked_notifications_max"] <= 10_000
    assert shared["delivered"] > 5 and shared["false_empties"] == 0
    assert shared["latency_ms"]["p99"] < 100
    assert shared["fallbacks"] == 0
    assert shared["peer_messages"]["wake"] > 0
