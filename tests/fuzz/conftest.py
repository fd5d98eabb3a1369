"""Hypothesis budgets for the fuzzers.

``ci`` (the default, in the test suite): few examples, derandomized (the same examples on
every run, so CI cannot flake), no per-example deadline (a loaded machine is slow, not
wrong). ``fuzz`` (``make fuzz``, ``FUZZ_PROFILE=fuzz``): many more examples, random.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_common = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)
settings.register_profile("ci", _common, max_examples=60, derandomize=True)
settings.register_profile(
    "fuzz", _common, max_examples=int(os.environ.get("FUZZ_EXAMPLES", "3000"))
)
settings.load_profile(os.environ.get("FUZZ_PROFILE", "ci"))
