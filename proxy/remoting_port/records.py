"""A pull or pop of the remoting port as a receive record: what the receive metrics and
the event log hold of it, as of a gRPC client's ReceiveMessage (mode ``remoting``)."""

from __future__ import annotations

import time

from proxy.config import PollMode
from proxy.observability.receive_record import Outcome, ReceiveRecord
from proxy.remoting.codes import RequestCode, ResponseCode, code_name
from proxy.remoting.command import RemotingCommand
from proxy.remoting.message import count_messages
from proxy.remoting_port.routing import long_poll_s

# The requests that receive messages: each is a receive record.
RECEIVES = {RequestCode.PULL_MESSAGE, RequestCode.LITE_PULL_MESSAGE, RequestCode.POP_MESSAGE}
# What a pull or pop answers when the broker had nothing (before or after holding it).
_EMPTY = {ResponseCode.PULL_NOT_FOUND, ResponseCode.NO_MESSAGE, ResponseCode.POLLING_TIMEOUT}


def receive_record(
    cmd: RemotingCommand, answer: RemotingCommand, broker: str, wait_s: float
) -> ReceiveRecord:
    """The receive record of a pull or pop that took ``wait_s``. Long polling: the client
    asked the broker to hold it (a pull's suspend time, a pop's poll time)."""
    poll_s = long_poll_s(cmd) or 0.0
    rec = ReceiveRecord(
        arrived_at=time.monotonic() - wait_s,
        arrived_ms=int((time.time() - wait_s) * 1000),
        mode=PollMode.REMOTING,
        group=cmd.fields.get("consumerGroup", ""),
        topic=cmd.fields.get("topic", ""),
        is_long_polling=poll_s > 0,
        polling_ms=int(poll_s * 1000),
        pops=1 if cmd.code == RequestCode.POP_MESSAGE else 0,
    )
    messages = count_messages(answer.body) if answer.code == ResponseCode.SUCCESS else 0
    if messages:
        rec.messages, rec.broker = messages, broker
        rec.ended(Outcome.FOUND, "ok")
    elif answer.code in _EMPTY or answer.code == ResponseCode.SUCCESS:
        rec.ended(Outcome.EMPTY, code_name(answer.code, ResponseCode))
    else:
        rec.ended(Outcome.ERROR, code_name(answer.code, ResponseCode))
    return rec
