"""Recall handles (RocketMQ 5.3.2+): what a broker returns for a timed message, and what
RECALL_MESSAGE takes back.

A handle is URL-safe base64 of ``v1 <topic> <broker> <timestamp ms> <unique id>``, the
format of RocketMQ's ``RecallMessageHandle.HandleV1``; the broker adds one millisecond to
the delivery time (its timer floors to the slot).
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass


class RecallHandleError(ValueError):
    """Not a recall handle."""


@dataclass(frozen=True, slots=True)
class RecallHandle:
    topic: str
    broker: str
    timestamp_ms: int
    msg_id: str

    def encode(self) -> str:
        raw = " ".join(("v1", self.topic, self.broker, str(self.timestamp_ms), self.msg_id))
        return base64.urlsafe_b64encode(raw.encode()).decode()

    @classmethod
    def decode(cls, handle: str) -> RecallHandle:
        try:
            raw = base64.urlsafe_b64decode(handle.encode()).decode()
        except (binascii.Error, UnicodeError, ValueError):
            raise RecallHandleError("recall handle is invalid") from None
        items = raw.split(" ")
        if len(items) < 5 or items[0] != "v1" or not items[3].lstrip("-").isdigit():
            raise RecallHandleError("recall handle is invalid")
        return cls(items[1], items[2], int(items[3]), items[4])
