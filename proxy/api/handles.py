"""Receipt handles: POP_CK plus the commit-log offset, nine space-separated fields.

``startOffset popTime invisibleTime reviveQid retryFlag brokerName queueId offset
commitLogOffset``. The broker name routes an ack through any proxy, so proxies keep no
state; the commit-log offset lets a message be forwarded to the dead-letter queue.

A push consumer's message delivered by a proxy of a fleet has a tenth: the fleet address
(``host:port``) of that proxy, which renews it, so that another proxy can settle it with
its current checkpoint (``proxy/fleet/settle.py``). Clients do not read handles; they
hand them back as they got them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from proxy.api.errors import PROCESSOR_ERROR, ApiError, Code
from proxy.remoting.popinfo import PopCheckpointInfo

# An expired handle, in the Apache proxy's words.
EXPIRED = f"{PROCESSOR_ERROR}receipt handle is expired"


@dataclass(frozen=True, slots=True)
class ReceiptHandle:
    checkpoint: PopCheckpointInfo
    commit_log_offset: int
    renewer: str = ""  # the fleet member that renews the message, if one does

    @property
    def extra_info(self) -> str:
        return self.checkpoint.encode()

    @property
    def broker(self) -> str:
        return self.checkpoint.broker_name

    def encode(self) -> str:
        tail = f" {self.renewer}" if self.renewer else ""
        return f"{self.checkpoint.encode()} {self.commit_log_offset}{tail}"

    def expired(self, now_ms: int | None = None) -> bool:
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        return self.checkpoint.next_visible_time <= now_ms


def parse_receipt_handle(
    text: str, *, allow_expired: bool = False, now_ms: int | None = None
) -> ReceiptHandle:
    """Parse a client's handle; INVALID_RECEIPT_HANDLE when malformed or expired (at
    ``now_ms``, by default the current time)."""
    if not text or not text.strip():
        raise ApiError(Code.INVALID_RECEIPT_HANDLE, "receipt handle is blank")
    head, _, offset = text.rpartition(" ")
    renewer = ""
    if ":" in offset:  # host:port, never an offset: the renewer's tenth field
        renewer = offset
        head, _, offset = head.rpartition(" ")
    try:
        handle = ReceiptHandle(PopCheckpointInfo.parse(head), int(offset), renewer)
    except ValueError as exc:
        raise ApiError(Code.INVALID_RECEIPT_HANDLE, f"receipt handle is malformed: {exc}") from None
    if not allow_expired and handle.expired(now_ms):
        raise ApiError(Code.INVALID_RECEIPT_HANDLE, EXPIRED)
    return handle
