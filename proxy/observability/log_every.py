"""A log line that may repeat many times a second (a refused client, a failed forward)
written at most once per interval; the next line written says how many were left out."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable


class LogEvery:
    def __init__(
        self,
        logger: logging.Logger,
        every_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.every_s = every_s
        self._clock = clock
        self._at: float | None = None
        self.left_out = 0  # lines not written since the last one

    def warning(self, message: str, *args: object) -> None:
        now = self._clock()
        if self._at is not None and now - self._at < self.every_s:
            self.left_out += 1
            return
        more = f" ({self.left_out} more since the last line)" if self.left_out else ""
        self.logger.warning(message + "%s", *args, more)
        self._at = now
        self.left_out = 0
