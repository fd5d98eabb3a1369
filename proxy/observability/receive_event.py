"""One record of the receive event log: what the proxy writes for each client
ReceiveMessage, in either format (``eventlog_parts``), and what the Spark job reads."""

from __future__ import annotations

from dataclasses import dataclass

import orjson


@dataclass(slots=True)
class ReceiveEvent:
    """One client ReceiveMessage, with exactly the contract's fields, in its order."""

    ts: int  # epoch ms, when the request arrived
    proxy: str
    group: str
    topic: str
    mode: str  # notify / coupled / slicing / lite
    is_long_polling: bool
    is_short_polling_hit: bool
    polling_ms: int  # long-polling time granted
    wait_ms: int  # arrival to answer
    messages: int
    result: str  # found / empty / error code name
    pops: int
    notifications: int
    broker: str | None  # broker that delivered, None when nothing was

    def to_json(self) -> bytes:
        """One JSON object, one line, no trailing newline."""
        # orjson serialises (slotted) dataclasses natively, in field order.
        return orjson.dumps(self)
