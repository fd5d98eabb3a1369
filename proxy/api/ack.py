"""AckMessage, ChangeInvisibleDuration and ForwardMessageToDeadLetterQueue: parse the
receipt handles and report, per entry, what the consumer processor did."""

from __future__ import annotations

import functools
import time
from typing import Protocol

from proxy.api import validation as check
from proxy.api.context import Context
from proxy.api.errors import ApiError, Code, ack_error, code_name, dead_letter_error, ok
from proxy.api.handles import ReceiptHandle, parse_receipt_handle
from proxy.api.v2 import definition_pb2 as pb
from proxy.api.v2 import service_pb2 as api
from proxy.config import LimitsConfig
from proxy.fleet.messages import Outcome
from proxy.fleet.settle import FleetSettles, Lent
from proxy.processor.consumer import ConsumerProcessor, Popped
from proxy.processor.renewal import HandleRenewer
from proxy.remoting.client import RemotingError
from proxy.remoting.popinfo import PopCheckpointInfo


class Finish(Protocol):
    """Ends a settle made with a current checkpoint (``HandleRenewer.end_settle`` here,
    ``FleetSettles.give_back`` at the member that lent it)."""

    def __call__(self, settled: bool, *, by_ack: bool = False) -> None: ...


# A message acked already (by the member that renews it): a retry, answered OK.
ACKED_ALREADY = None


class AckActivity:
    def __init__(
        self,
        consumer: ConsumerProcessor,
        max_delivery_attempts: int,
        renewer: HandleRenewer,
        limits: LimitsConfig,
        settles: FleetSettles | None = None,
    ) -> None:
        self.consumer = consumer
        self.limits = limits
        self.max_delivery_attempts = max_delivery_attempts
        self.renewer = renewer
        self.settles = settles  # set when the proxy joins a fleet

    async def _current(
        self,
        group: str,
        text: str,
        now_ms: int | None = None,
        lite_topic: str | None = None,
        handle: ReceiptHandle | None = None,
    ) -> tuple[ReceiptHandle | None, Finish | None]:
        """The handle to settle, and what ends the settle:

        - for a message this proxy renews, its current checkpoint (the client's may have
          expired meanwhile), and ``end_settle`` of its renewal;
        - for one another member of the fleet renews (the handle names it), the current
          checkpoint borrowed from it, and ``give_back``; or None (``ACKED_ALREADY``)
          when that member acked it lately;
        - else the client's, and no ``Finish``.

        The caller calls the ``Finish`` with the outcome, whatever happens. ``handle``:
        the client's, already parsed with expiry allowed (``_loose``)."""
        if handle is None:
            handle = _loose(text)
        if handle is not None:
            renewal = await self.renewer.begin_settle(group, handle.checkpoint, lite_topic)
            if renewal is not None:
                current = PopCheckpointInfo.parse(renewal.popped.checkpoint)
                finish = functools.partial(self.renewer.end_settle, renewal)
                return ReceiptHandle(current, handle.commit_log_offset), finish
            if handle.renewer and self.settles is not None:
                lent = await self.settles.lend(handle.renewer, group, handle.checkpoint, lite_topic)
                if isinstance(lent, Lent):
                    finish = functools.partial(self.settles.give_back, lent)
                    return ReceiptHandle(lent.checkpoint, handle.commit_log_offset), finish
                if lent is Outcome.ACKED:
                    return ACKED_ALREADY, None
        return parse_receipt_handle(text, now_ms=now_ms), None

    async def ack_message(
        self, request: api.AckMessageRequest, context: Context
    ) -> api.AckMessageResponse:
        topic = check.validate_topic(request.topic.name)
        group = check.validate_group(request.group.name)
        if not request.entries:
            raise ApiError(Code.BAD_REQUEST, "no entry to ack")
        statuses: list[pb.Status | None] = [None] * len(request.entries)
        parsed: list[tuple[int, PopCheckpointInfo, Finish | None]] = []
        now_ms = int(time.time() * 1000)
        acked = ok()  # one object for every entry: the response copies it into each
        errors: list[RemotingError | None] | None = None
        try:
            for i, entry in enumerate(request.entries):
                try:
                    if await self._look_up(group, i, entry, now_ms, parsed):
                        statuses[i] = acked
                except ApiError as err:
                    statuses[i] = err.status
            errors = await self.consumer.ack(
                group,
                topic,
                [ck for _, ck, _ in parsed],
                [_lite_topic(request.entries[i]) for i, _, _ in parsed],
            )
        finally:
            # Failed, or cancelled (the client's deadline passed, even while a later entry
            # was being looked up): each renewal goes on, and the client's retry settles
            # its current checkpoint.
            for n, (_, _, finish) in enumerate(parsed):
                if finish is not None:
                    finish(errors is not None and errors[n] is None, by_ack=True)
        for (i, ck, _), error in zip(parsed, errors, strict=True):
            statuses[i] = acked if error is None else ack_error(ck.broker_name, error).status
        entries = [
            api.AckMessageResultEntry(
                message_id=e.message_id, receipt_handle=e.receipt_handle, status=status
            )
            for e, status in zip(request.entries, statuses, strict=True)
        ]
        # The response's status names the entries' one code, or MULTIPLE_RESULTS, its message
        # the code's name, as the Apache proxy answers (the clients raise it as the error);
        # each entry's status says what went wrong with it.
        codes = {status.code for status in statuses if status is not None}
        code = codes.pop() if len(codes) == 1 else Code.MULTIPLE_RESULTS
        status = pb.Status(code=code, message=code_name(code).upper())
        return api.AckMessageResponse(status=status, entries=entries)

    async def _look_up(
        self,
        group: str,
        i: int,
        entry: api.AckMessageEntry,
        now_ms: int,
        parsed: list[tuple[int, PopCheckpointInfo, Finish | None]],
    ) -> bool:
        """Entry ``i`` of an ack: True for a message acked already (answered OK at once),
        else its checkpoint to ack joins ``parsed``, with what ends its settle."""
        lite = _lite_topic(entry)
        loose = _loose(entry.receipt_handle)
        if loose is not None and self.renewer.was_acked(group, loose.checkpoint, lite):
            # A retry of an ack this proxy made, whose answer the client did not wait
            # for: its handle has expired meanwhile, but the message is acked.
            return True
        current, finish = await self._current(group, entry.receipt_handle, now_ms, lite, loose)
        if current is ACKED_ALREADY:
            return True
        parsed.append((i, current.checkpoint, finish))
        return False

    async def change_invisible_duration(
        self, request: api.ChangeInvisibleDurationRequest, context: Context
    ) -> api.ChangeInvisibleDurationResponse:
        topic = check.validate_topic(request.topic.name)
        group = check.validate_group(request.group.name)
        invisible = check.validate_invisible(
            check.duration_ms(request.invisible_duration), 0, self.limits.max_invisible_ms
        )
        lite = _lite_topic(request)
        handle, finish = await self._current(group, request.receipt_handle, lite_topic=lite)
        if handle is ACKED_ALREADY:
            raise ApiError(Code.INVALID_RECEIPT_HANDLE, "the message has been acked")
        changed = False
        try:
            checkpoint = await self.consumer.change_invisible(
                group, topic, handle.checkpoint, invisible, lite_topic=lite, suspend=request.suspend
            )
            changed = True  # the client holds the new handle now: no more renewal
        except RemotingError as exc:
            raise ack_error(handle.broker, exc) from None
        finally:
            if finish is not None:
                finish(changed)
        return api.ChangeInvisibleDurationResponse(
            status=ok(), receipt_handle=f"{checkpoint} {handle.commit_log_offset}"
        )

    async def forward_message_to_dead_letter_queue(
        self,
        request: api.ForwardMessageToDeadLetterQueueRequest,
        context: Context,
    ) -> api.ForwardMessageToDeadLetterQueueResponse:
        topic = check.validate_topic(request.topic.name)
        group = check.validate_group(request.group.name)
        lite = _lite_topic(request)
        handle, finish = await self._current(group, request.receipt_handle, lite_topic=lite)
        if handle is ACKED_ALREADY:
            raise ApiError(Code.INVALID_RECEIPT_HANDLE, "the message has been acked")
        max_attempts = request.max_delivery_attempts or self.max_delivery_attempts
        popped = Popped(
            handle.broker,
            group,
            topic,
            handle.extra_info,
            handle.commit_log_offset,
            request.message_id,
            lite,
        )
        forwarded = False
        try:
            await self.consumer.dead_letter(popped, max_attempts - 1)
            forwarded = True
        except RemotingError as exc:
            raise dead_letter_error(handle.broker, exc) from None
        finally:
            if finish is not None:
                finish(forwarded)
        return api.ForwardMessageToDeadLetterQueueResponse(status=ok())


def _loose(text: str) -> ReceiptHandle | None:
    """The client's handle even when expired (a renewed message's handle is replaced, not
    dead), or None when malformed: the strict parse then gives the error."""
    try:
        return parse_receipt_handle(text, allow_expired=True)
    except ApiError:
        return None


def _lite_topic(
    request: api.AckMessageEntry
    | api.ChangeInvisibleDurationRequest
    | api.ForwardMessageToDeadLetterQueueRequest,
) -> str | None:
    """The lite topic a lite consumer names for a lite message (RocketMQ 5.5), else None.
    Not checked against the handle: the broker refuses a lite ack whose topic, queue or
    group does not fit, and the client's code says so."""
    return request.lite_topic if request.HasField("lite_topic") and request.lite_topic else None
