"""Durations on the command line: ``30s``, ``1m``, ``5m``, ``1h`` (or plain seconds)."""

from __future__ import annotations

import re

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_PATTERN = re.compile(r"^\s*(\d+)\s*([smhd]?)\s*$")


def parse_duration(text: str) -> int:
    """Whole seconds in ``text``; ValueError for anything else (negative, fractions, units)."""
    match = _PATTERN.match(text)
    if match is None:
        raise ValueError(f"not a duration: {text!r} (use e.g. 30s, 1m, 1h)")
    return int(match.group(1)) * _UNITS[match.group(2) or "s"]


def check_window(seconds: int) -> int:
    """A window must tile a UTC day, so that every window lies in one date partition and
    re-running a day replaces whole windows."""
    if seconds <= 0 or 86400 % seconds:
        raise ValueError(f"window of {seconds}s does not divide a day evenly")
    return seconds
