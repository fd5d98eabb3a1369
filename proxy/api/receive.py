"""ReceiveMessage: validate and translate the request, run it through the receive engine,
write the answer to the client's stream, and record it once.

The stream carries the status first, then one response per message, then
``delivery_timestamp``. A message the client did not get (the stream broke, the client
went away) is handed back at once.

A push consumer's request (``auto_renew``, no invisible duration) is popped with the
renewal slice and served on the broker its assigned queue names; what it gets is renewed
(``processor/renewal.py``). A FIFO group's request pops orderly, with its attempt id. A
lite group's poll of its parent topic (``lite.bind.topic``, RocketMQ 5.5) is a lite poll
(``receive/lite.py``), keyed by the client id.
"""

from __future__ import annotations

import asyncio
import time

from proxy.api import validation as check
from proxy.api.context import Context
from proxy.api.convert import timestamp, to_api_message
from proxy.api.errors import ApiError, Code, code_name, ok, receive_error
from proxy.api.v2 import definition_pb2 as pb
from proxy.api.v2 import service_pb2 as api
from proxy.brokers import TopicNotFound
from proxy.config import LimitsConfig, ReceiveConfig
from proxy.groups import GroupSettings
from proxy.observability.receive_record import Outcome, ReceiveRecord, ReceiveRecorder
from proxy.processor.consumer import ConsumerProcessor
from proxy.processor.renewal import HandleRenewer
from proxy.receive.engine import ReceiveEngine, TooManyRequests
from proxy.receive.types import PolledMessage, ReceiveRequest
from proxy.remoting.client import RemotingError

_NOT_FOUND = pb.Status(code=Code.MESSAGE_NOT_FOUND, message="no new message")


class ReceiveActivity:
    def __init__(
        self,
        config: ReceiveConfig,
        engine: ReceiveEngine,
        consumer: ConsumerProcessor,
        recorder: ReceiveRecorder,
        groups: GroupSettings,
        renewer: HandleRenewer,
        limits: LimitsConfig,
    ) -> None:
        self.config = config
        self.limits = limits
        self.engine = engine
        self.consumer = consumer
        self.recorder = recorder
        self.groups = groups
        self.renewer = renewer
        self.accepting = True  # off while the proxy shuts down

    async def receive_message(self, request: api.ReceiveMessageRequest, context: Context) -> None:
        loop = asyncio.get_running_loop()
        rec = ReceiveRecord(
            arrived_at=loop.time(),
            arrived_ms=int(time.time() * 1000),
            mode=self.config.mode.initial_poll_mode,
        )
        try:
            client_id = check.require_client_id(context)
            if not self.accepting:
                # Draining: a poll that still reaches this proxy is answered empty at once
                # (not refused: the client would report an error); its next one goes to
                # another proxy.
                await self._write([], context, rec)
                return
            req = self._translate(request, context, rec)
            self.renewer.seen(client_id)
            # Never raises: a failed look-up reads as a plain group, and the poll's own route
            # look-up below says what is wrong with the topic.
            group = await self.groups.config(req.group, req.topic)
            req.fifo = group.fifo
            req.max_attempts = group.retry.max_attempts
            try:
                if group.is_lite(req.topic):
                    # A lite push consumer polls every broker itself; a poll of it parked on
                    # the others too would stay parked there after it answered, and the
                    # next message for the client could wake that stale pop first.
                    req.named_broker_only = req.named_broker_only or request.auto_renew
                    result = await self.engine.receive_lite(req, client_id)
                else:
                    result = await self.engine.receive(req)
            except TooManyRequests as exc:
                raise ApiError(Code.TOO_MANY_REQUESTS, str(exc)) from None
            except (TopicNotFound, RemotingError) as exc:
                raise receive_error(req.topic, exc) from None
            finally:
                rec.mode = req.mode or rec.mode
            rec.is_short_polling_hit = result.is_short_polling_hit
            rec.pops = result.pops
            rec.notifications = result.probes
            # A push consumer's messages are renewed here: in a fleet, their handles say so.
            renewer = self.renewer.member if request.auto_renew else ""
            await self._write(result.messages, context, rec, renewer)
            if result.timeline is not None:
                result.timeline.mark(loop.time(), "written", str(rec.messages))
                ids = ",".join(m.message.msg_id for m in result.messages[: rec.messages])
                result.timeline.log(
                    rec.arrived_at,
                    f"receive {rec.group}/{rec.topic} arrived_ms={rec.arrived_ms} "
                    f"mode={rec.mode.value} polling_ms={rec.polling_ms} ids={ids or '-'}",
                )
            if request.auto_renew:
                for polled in result.messages[: rec.messages]:
                    self.renewer.add(client_id, polled.popped, polled.message.reconsume_times)
        except ApiError as err:
            rec.ended(Outcome.ERROR, code_name(err.code))
            await context.write(api.ReceiveMessageResponse(status=err.status))
        except asyncio.CancelledError:
            # The client went away. Whatever was popped and not written has been handed back
            # where the cancel landed: by the poll (receive/context.py, lite.py), the
            # dead-letter check (ConsumerProcessor.divert_exhausted) or _write.
            rec.ended(Outcome.CANCELLED, Outcome.CANCELLED.value)
            raise
        finally:
            self.recorder.record(rec, loop.time() - rec.arrived_at)

    def _translate(
        self,
        request: api.ReceiveMessageRequest,
        context: Context,
        rec: ReceiveRecord,
    ) -> ReceiveRequest:
        """The poll the client asked for, within RocketMQ's bounds. Fills in the record as
        each value is known, so a refused request is recorded with what it asked."""
        rc = self.config
        # Polling time, as the RocketMQ proxy grants it: what the client asked, else what
        # its deadline leaves, within [min, max] and before the deadline. Checked first, then
        # topic, group, invisible time and filter: the Apache proxy's order.
        remaining = context.time_remaining()
        remaining_ms = None if remaining is None else int(remaining * 1000)
        if request.HasField("long_polling_timeout"):
            asked = check.duration_ms(request.long_polling_timeout)
        else:
            asked = rc.min_polling_ms if remaining_ms is None else remaining_ms - 1_500
        rec.is_long_polling = asked >= rc.min_polling_ms
        polling = min(max(asked, rc.min_polling_ms), rc.max_polling_ms)
        if remaining_ms is not None and polling > remaining_ms - rc.reserve_ms:
            if remaining_ms - rc.reserve_ms < rc.min_polling_ms:
                raise check.polling_time_error(context)
            polling = remaining_ms - rc.reserve_ms
        rec.topic = topic = check.validate_receive_topic(request.message_queue.topic.name)
        rec.group = group = check.validate_group(request.group.name)
        if request.auto_renew:
            # A push consumer: the proxy renews what it delivers, slice by slice.
            invisible = self.renewer.slice_ms
        else:
            # Unset is 0 ms: too small.
            invisible = check.validate_invisible(
                check.duration_ms(request.invisible_duration),
                self.limits.min_receive_invisible_ms,
                self.limits.max_invisible_ms,
            )
        expression, expression_type = check.validate_filter(
            request.filter_expression.expression, request.filter_expression.type
        )
        batch = check.validate_batch_size(request.batch_size)
        rec.polling_ms = polling
        return ReceiveRequest(
            group=group,
            topic=topic,
            expression=expression,
            expression_type=expression_type,
            batch_size=batch,
            invisible_ms=invisible,
            polling_ms=polling,
            answer_by=rec.arrived_at + polling / 1000,
            arrived_at=rec.arrived_at,
            broker_hint=request.message_queue.broker.name or None,
            attempt_id=request.attempt_id or None,
            named_broker_only=request.auto_renew and rc.push_named_broker_only,
        )

    async def _write(
        self,
        messages: list[PolledMessage],
        context: Context,
        rec: ReceiveRecord,
        renewer: str = "",
    ) -> None:
        """Write the answer; hand back, and leave out of the record, every message the
        client did not get. ``renewer``: the fleet address the handles name (``handles.py``)."""
        if not messages:
            await context.write(api.ReceiveMessageResponse(status=_NOT_FOUND))
            rec.ended(Outcome.EMPTY, code_name(Code.MESSAGE_NOT_FOUND))
            return
        written = 0
        try:
            await context.write(api.ReceiveMessageResponse(status=ok()))
            for polled in messages:
                message = to_api_message(polled, renewer=renewer)
                await context.write(api.ReceiveMessageResponse(message=message))
                written += 1
            await context.write(
                api.ReceiveMessageResponse(delivery_timestamp=timestamp(int(time.time() * 1000)))
            )
        except BaseException as exc:
            cancelled = isinstance(exc, asyncio.CancelledError)
            outcome = Outcome.CANCELLED if cancelled else Outcome.WRITE_FAILED
            self.consumer.hand_back([m.popped for m in messages[written:]], outcome.value)
            rec.ended(outcome, outcome.value)
            raise
        finally:
            rec.messages = written
            rec.broker = messages[0].broker if written else None
        rec.ended(Outcome.FOUND, code_name(Code.OK))
