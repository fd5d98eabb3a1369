"""Typed calls to one RocketMQ broker: send, pop, ack, invisible time, notification.

This is the broker side of the proxy, and what tests and benchmarks use against the stub.
Headers and response handling follow the RocketMQ client (``MQClientAPIImpl``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from proxy.remoting import fastjson
from proxy.remoting.answers import (
    BrokerError,
    NotificationResult,
    PopResult,
    SendResult,
    json_object,
    pop_lite_result,
    pop_result,
    readable,
)
from proxy.remoting.client import (
    RemotingClient,
    RemotingError,
    RemotingTimeoutError,
    RequestHook,
    ServerHandler,
)
from proxy.remoting.codes import CURRENT_VERSION, LanguageCode, RequestCode, ResponseCode, code_name
from proxy.remoting.command import RemotingCommand
from proxy.remoting.filter import ExpressionType
from proxy.remoting.headers import (
    INIT_MODE_MAX,
    AckMessageHeader,
    ChangeInvisibleTimeHeader,
    ChangeInvisibleTimeResponseHeader,
    ConsumerSendMsgBackHeader,
    ConsumeStatsHeader,
    ConsumeTimeSpanHeader,
    EndTransactionHeader,
    GroupHeader,
    NotificationHeader,
    NotificationResponseHeader,
    PollingInfoHeader,
    PollingInfoResponseHeader,
    PopLiteMessageHeader,
    PopMessageHeader,
    RecallMessageHeader,
    RecallMessageResponseHeader,
    SendMessageHeader,
    SendMessageResponseHeader,
    TopicHeader,
    UnregisterClientHeader,
    now_ms,
)
from proxy.remoting.lite import LiteSubscription, LiteSubscriptionCtlBody
from proxy.remoting.message import (
    BatchEntry,
    Prop,
    encode_batch,
    encode_properties,
)
from proxy.remoting.popinfo import (
    PopCheckpointInfo,
    batch_ack_body,
    topic_for_flag,
)

DEFAULT_TIMEOUT = 3.0

log = logging.getLogger(__name__)


# Told of every call: (request code name, response code name, seconds, broker, long polling).
CallObserver = Callable[[str, str, float, str, bool], None]


class BrokerClient:
    """Calls to the broker ``name`` at ``address`` over one remoting connection."""

    def __init__(
        self,
        name: str,
        address: str,
        client: RemotingClient | None = None,
        observer: CallObserver | None = None,
        request_hook: RequestHook | None = None,
        server_handler: ServerHandler | None = None,
        on_connect: Callable[[], None] | None = None,
    ) -> None:
        self.name = name
        self.address = address
        self.remoting = client or RemotingClient(
            address,
            request_hook=request_hook,
            server_handler=server_handler,
            on_connect=on_connect,
        )
        self.observer = observer
        # Cleared when the broker answers BATCH_ACK_MESSAGE with "not supported".
        self.batch_ack_supported = True

    async def close(self) -> None:
        await self.remoting.close()

    async def _call(
        self,
        code: int,
        fields: dict[str, str],
        body: bytes = b"",
        timeout: float = DEFAULT_TIMEOUT,
        long_polling: bool = False,
        on_late: Callable[[RemotingCommand], None] | None = None,
    ) -> RemotingCommand:
        return await self._invoke(
            RemotingCommand(code, fields, body), timeout, long_polling, on_late
        )

    async def _invoke(
        self,
        request: RemotingCommand,
        timeout: float = DEFAULT_TIMEOUT,
        long_polling: bool = False,
        on_late: Callable[[RemotingCommand], None] | None = None,
    ) -> RemotingCommand:
        code = request.code
        if self.observer is None:
            return await self.remoting.invoke(request, timeout, on_late)
        start = time.perf_counter()
        outcome = "error"
        try:
            response = await self.remoting.invoke(request, timeout, on_late)
            outcome = code_name(response.code, ResponseCode)
            return response
        except RemotingError as exc:
            outcome = "timeout" if isinstance(exc, RemotingTimeoutError) else "unreachable"
            raise
        finally:
            self.observer(
                code_name(code, RequestCode),
                outcome,
                time.perf_counter() - start,
                self.name,
                long_polling,
            )

    @staticmethod
    def _check(response: RemotingCommand, request: str, *ok: int) -> RemotingCommand:
        if response.code not in (ResponseCode.SUCCESS, *ok):
            raise BrokerError(response.code, response.remark, request)
        return response

    # -- produce --------------------------------------------------------------------------

    async def send(
        self,
        topic: str,
        body: bytes,
        *,
        tag: str | None = None,
        keys: list[str] | None = None,
        properties: dict[str, str] | None = None,
        queue_id: int = -1,
        producer_group: str = "PROXY_PRODUCER",
        sys_flag: int = 0,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> SendResult:
        """Send one message; ``sys_flag`` TRANSACTION_PREPARED_TYPE (with the TRAN_MSG and
        PGROUP properties) makes it a half message."""
        props = dict(properties or {})
        if tag:
            props[Prop.TAGS] = tag
        if keys:
            props[Prop.KEYS] = " ".join(keys)
        header = SendMessageHeader(
            producer_group,
            topic,
            queue_id=queue_id,
            sys_flag=sys_flag,
            born_timestamp=now_ms(),
            properties=encode_properties(props),
        )
        response = self._check(
            await self._call(RequestCode.SEND_MESSAGE_V2, header.encode_v2(), body, timeout),
            "send",
        )
        with readable(self.name, "send"):
            return self._send_result(response)

    async def send_batch(
        self,
        topic: str,
        entries: list[BatchEntry],
        *,
        queue_id: int = -1,
        producer_group: str = "PROXY_PRODUCER",
        timeout: float = DEFAULT_TIMEOUT,
    ) -> SendResult:
        """Send several messages in one request; they land in one queue, consecutively."""
        header = SendMessageHeader(
            producer_group, topic, queue_id=queue_id, born_timestamp=now_ms(), batch=True
        )
        response = self._check(
            await self._call(
                RequestCode.SEND_BATCH_MESSAGE, header.encode_v2(), encode_batch(entries), timeout
            ),
            "send batch",
        )
        with readable(self.name, "send batch"):
            return self._send_result(response)

    @staticmethod
    def _send_result(response: RemotingCommand) -> SendResult:
        h = SendMessageResponseHeader.decode(response.ext_fields)
        if not (0 <= h.queue_id < 2**31 and 0 <= h.queue_offset < 2**63):
            raise ValueError(f"queue {h.queue_id} offset {h.queue_offset} out of range")
        return SendResult(
            msg_id=h.transaction_id,
            offset_msg_id=h.msg_id,
            queue_id=h.queue_id,
            queue_offset=h.queue_offset,
            recall_handle=h.recall_handle,
        )

    async def end_transaction(self, header: EndTransactionHeader) -> None:
        """Commit or roll back a half message. One-way, as RocketMQ's clients and proxy send
        it: the broker answers nothing, and a lost one is settled by its next check."""
        await self.remoting.invoke_oneway(
            RemotingCommand(RequestCode.END_TRANSACTION, header.encode())
        )

    async def recall(
        self, producer_group: str, topic: str, handle: str, timeout: float = DEFAULT_TIMEOUT
    ) -> str:
        """Take back a timed message before its time; the message id the broker recalled."""
        header = RecallMessageHeader(producer_group, topic, handle)
        response = self._check(
            await self._call(RequestCode.RECALL_MESSAGE, header.encode(), timeout=timeout),
            "recall",
        )
        with readable(self.name, "recall"):
            return RecallMessageResponseHeader.decode(response.ext_fields).msg_id

    async def heartbeat(
        self, client_id: str, producer_groups: list[str], timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        """HEART_BEAT naming the producer groups this connection serves: the broker sends a
        group's CHECK_TRANSACTION_STATE to a connection that named it last."""
        body = json.dumps(
            {
                "clientID": client_id,
                "producerDataSet": [{"groupName": g} for g in producer_groups],
                "consumerDataSet": [],
            }
        ).encode()
        await self.heartbeat_for(body, LanguageCode.PYTHON, CURRENT_VERSION, timeout)

    async def heartbeat_for(
        self, body: bytes, language: int, version: int, timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        """HEART_BEAT with a client's HeartbeatData ``body``, in the client's ``language``
        and ``version`` (what the broker lists the client with)."""
        request = RemotingCommand(RequestCode.HEART_BEAT, {}, body)
        request.language, request.version = language, version
        self._check(await self._invoke(request, timeout), "heartbeat")

    async def unregister_client(
        self,
        client_id: str,
        *,
        producer_group: str | None = None,
        consumer_group: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        """UNREGISTER_CLIENT: the broker forgets this connection's client of the group."""
        header = UnregisterClientHeader(client_id, producer_group, consumer_group)
        self._check(
            await self._call(RequestCode.UNREGISTER_CLIENT, header.encode(), timeout=timeout),
            "unregister client",
        )

    # -- consume --------------------------------------------------------------------------

    async def pop(
        self,
        group: str,
        topic: str,
        *,
        queue_id: int = -1,
        max_nums: int = 32,
        invisible_ms: int = 30_000,
        poll_ms: int = 0,
        expression: str = "*",
        expression_type: ExpressionType = ExpressionType.TAG,
        init_mode: int = INIT_MODE_MAX,
        order: bool = False,
        attempt_id: str | None = None,
        timeout: float | None = None,
        on_late: Callable[[PopResult], None] | None = None,
    ) -> PopResult:
        """Pop; with ``poll_ms`` the broker holds the request until a message or the time.

        ``order``: an orderly pop (FIFO groups): the broker hands out a queue's messages
        only while no earlier one of it is in flight, and a pop that repeats the
        ``attempt_id`` of the one in flight gets the same messages again.

        ``on_late`` gets the result of a pop that answers after ``timeout``, so that messages
        it holds can be handed back rather than left invisible.
        """
        header = PopMessageHeader(
            group,
            topic,
            queue_id,
            max_nums,
            invisible_ms,
            poll_time=poll_ms,
            born_time=now_ms(),
            init_mode=init_mode,
            exp_type=expression_type.value,
            exp=expression,
            order=order,
            attempt_id=attempt_id,
        )
        return await self._pop_call(
            RequestCode.POP_MESSAGE,
            header.encode(),
            lambda response: pop_result(response, topic, self.name),
            "pop",
            poll_ms,
            timeout,
            on_late,
        )

    async def _pop_call(
        self,
        code: int,
        header: dict[str, str],
        decode: Callable[[RemotingCommand], PopResult],
        what: str,
        poll_ms: int,
        timeout: float | None,
        on_late: Callable[[PopResult], None] | None,
    ) -> PopResult:
        """Send a pop of either kind (``code``) and decode its answer; one that comes after
        ``timeout`` goes, decoded, to ``on_late`` (its messages are the caller's to hand
        back), one the broker answers with nothing is an empty result."""
        if timeout is None:
            timeout = DEFAULT_TIMEOUT + poll_ms / 1000
        late = None
        if on_late is not None:

            def late(response: RemotingCommand) -> None:
                if response.code != ResponseCode.SUCCESS:
                    return
                try:
                    with readable(self.name, f"late {what}"):
                        result = decode(response)
                except RemotingError as exc:  # unreadable (BrokerResponseError) or unusable
                    # Its messages (if any) come back after their invisible time.
                    log.warning("%s", exc)
                    return
                on_late(result)

        response = await self._call(
            code, header, timeout=timeout, long_polling=poll_ms > 0, on_late=late
        )
        self._check(
            response,
            what,
            ResponseCode.POLLING_TIMEOUT,
            ResponseCode.PULL_NOT_FOUND,
            ResponseCode.POLLING_FULL,
        )
        with readable(self.name, what):
            return decode(response)

    async def pop_lite(
        self,
        client_id: str,
        group: str,
        topic: str,
        *,
        max_nums: int = 32,
        invisible_ms: int = 30_000,
        poll_ms: int = 0,
        attempt_id: str | None = None,
        timeout: float | None = None,
        on_late: Callable[[PopResult], None] | None = None,
    ) -> PopResult:
        """POP_LITE_MESSAGE: what the broker queued for ``client_id``'s lite subscriptions
        of the parent ``topic``; with ``poll_ms`` the broker parks the request under the
        client id until one of its lite topics gets a message. Each lite topic is popped
        orderly (one batch in flight per lite topic). ``on_late`` as for ``pop``."""
        header = PopLiteMessageHeader(
            client_id,
            group,
            topic,
            max_nums,
            invisible_ms,
            poll_time=poll_ms,
            born_time=now_ms(),
            attempt_id=attempt_id,
        )
        return await self._pop_call(
            RequestCode.POP_LITE_MESSAGE,
            header.encode(),
            lambda response: pop_lite_result(response, topic, self.name),
            "lite pop",
            poll_ms,
            timeout,
            on_late,
        )

    async def lite_subscription_ctl(
        self, subscriptions: list[LiteSubscription], timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        """LITE_SUBSCRIPTION_CTL: add, drop or replace clients' lite topics on this broker.
        The broker remembers this connection for its NOTIFY_UNSUBSCRIBE_LITE to the client."""
        body = LiteSubscriptionCtlBody(tuple(subscriptions)).encode()
        self._check(
            await self._call(RequestCode.LITE_SUBSCRIPTION_CTL, {}, body, timeout=timeout),
            "lite subscription",
        )

    async def ack(
        self,
        group: str,
        topic: str,
        extra_info: str,
        timeout: float = DEFAULT_TIMEOUT,
        *,
        lite_topic: str | None = None,
    ) -> None:
        """Ack the message whose POP_CK is ``extra_info``; ``topic`` is the one popped.
        ``lite_topic``: a lite message's lite topic (``topic`` is its parent)."""
        await self._ack(
            group, topic, PopCheckpointInfo.parse(extra_info), extra_info, timeout, lite_topic
        )

    async def _ack(
        self,
        group: str,
        topic: str,
        info: PopCheckpointInfo,
        extra_info: str,
        timeout: float,
        lite_topic: str | None = None,
    ) -> None:
        header = AckMessageHeader(
            group, topic_for_flag(info.retry, group, topic), info.queue_id, extra_info,
            info.queue_offset, lite_topic=lite_topic,
        )  # fmt: skip
        self._check(
            await self._call(RequestCode.ACK_MESSAGE, header.encode(), timeout=timeout), "ack"
        )

    async def ack_all(
        self,
        group: str,
        topic: str,
        checkpoints: list[PopCheckpointInfo],
        timeout: float = DEFAULT_TIMEOUT,
    ) -> list[RemotingError | None]:
        """Ack several messages popped from this broker; per message, None or its error.

        Several go in one BATCH_ACK_MESSAGE (RocketMQ 5.1+): one request instead of one per
        message, for the proxy and for the broker. A broker that does not know the code gets
        one ACK_MESSAGE per message from then on. A batch shares one answer, so every message
        in it gets the same error.
        """
        if len(checkpoints) > 1 and self.batch_ack_supported:
            try:
                response = await self._call(
                    RequestCode.BATCH_ACK_MESSAGE,
                    {},
                    batch_ack_body(self.name, group, topic, checkpoints),
                    timeout=timeout,
                )
                self._check(response, "batch ack")
                return [None] * len(checkpoints)
            except BrokerError as exc:
                if exc.code != ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
                    return [exc] * len(checkpoints)
                self.batch_ack_supported = False
            except RemotingError as exc:
                return [exc] * len(checkpoints)
        outcomes = await asyncio.gather(
            *(self._ack(group, topic, ck, ck.encode(), timeout) for ck in checkpoints),
            return_exceptions=True,
        )
        for outcome in outcomes:
            if isinstance(outcome, BaseException) and not isinstance(outcome, RemotingError):
                raise outcome
        return [outcome if isinstance(outcome, RemotingError) else None for outcome in outcomes]

    async def change_invisible_time(
        self,
        group: str,
        topic: str,
        extra_info: str,
        invisible_ms: int,
        timeout: float = DEFAULT_TIMEOUT,
        *,
        lite_topic: str | None = None,
        suspend: bool = False,
    ) -> str:
        """Make the message invisible for ``invisible_ms`` from now; return its new POP_CK.
        ``lite_topic``: a lite message's lite topic (``topic`` is its parent); ``suspend``:
        the lite client's suspend flag, passed on."""
        info = PopCheckpointInfo.parse(extra_info)
        header = ChangeInvisibleTimeHeader(
            group,
            topic_for_flag(info.retry, group, topic),
            info.queue_id,
            extra_info,
            info.queue_offset,
            invisible_time=invisible_ms,
            lite_topic=lite_topic,
            suspend=True if suspend else None,
        )
        response = self._check(
            await self._call(
                RequestCode.CHANGE_MESSAGE_INVISIBLETIME, header.encode(), timeout=timeout
            ),
            "change invisible time",
        )
        with readable(self.name, "change invisible time"):
            answer = ChangeInvisibleTimeResponseHeader.decode(response.ext_fields)
        return PopCheckpointInfo(
            info.queue_offset,
            answer.pop_time,
            answer.invisible_time,
            answer.revive_qid,
            info.retry,
            info.broker_name,
            info.queue_id,
            info.queue_offset,
        ).encode()

    async def notification(
        self,
        group: str,
        topic: str,
        *,
        queue_id: int = -1,
        poll_ms: int = 0,
        order: bool = False,
        timeout: float | None = None,
    ) -> NotificationResult:
        """Ask whether ``group`` has a message; the broker holds the probe up to ``poll_ms``.
        ``order``: only queues no orderly pop holds count (FIFO groups)."""
        header = NotificationHeader(
            group, topic, queue_id, poll_time=poll_ms, born_time=now_ms(), order=order
        )
        if timeout is None:
            timeout = DEFAULT_TIMEOUT + poll_ms / 1000
        response = self._check(
            await self._call(
                RequestCode.NOTIFICATION, header.encode(), timeout=timeout, long_polling=poll_ms > 0
            ),
            "notification",
        )
        with readable(self.name, "notification"):
            answer = NotificationResponseHeader.decode(response.ext_fields)
        return NotificationResult(has_msg=answer.has_msg, polling_full=answer.polling_full)

    async def consume_stats(
        self, group: str, topic: str, timeout: float = DEFAULT_TIMEOUT
    ) -> dict[str, Any]:
        """GET_CONSUME_STATS: the group's offsets on ``topic``'s queues of this broker
        (a ConsumeStats, whose offset table fastjson keys by MessageQueue objects)."""
        header = ConsumeStatsHeader(group, topic).encode()
        return await self._fastjson(RequestCode.GET_CONSUME_STATS, header, "consume stats", timeout)

    async def consume_time_span(
        self, group: str, topic: str, timeout: float = DEFAULT_TIMEOUT
    ) -> dict[str, Any]:
        """QUERY_CONSUME_TIME_SPAN: per queue of ``topic`` on this broker, the store times
        around the group's offset (a QueryConsumeTimeSpanBody)."""
        header = ConsumeTimeSpanHeader(topic, group).encode()
        code = RequestCode.QUERY_CONSUME_TIME_SPAN
        return await self._fastjson(code, header, "consume time span", timeout)

    async def _fastjson(
        self, code: int, fields: dict[str, str], what: str, timeout: float
    ) -> dict[str, Any]:
        """An admin request whose answer is an object as fastjson writes it."""
        response = self._check(await self._call(code, fields, timeout=timeout), what)
        with readable(self.name, what):
            answer = fastjson.loads(response.body)
            if not isinstance(answer, dict):
                raise ValueError(f"{what}: not an object")
            return answer

    async def group_config(self, group: str, timeout: float = DEFAULT_TIMEOUT) -> dict[str, Any]:
        """The group's SubscriptionGroupConfig (GET_SUBSCRIPTIONGROUP_CONFIG) as JSON."""
        response = self._check(
            await self._call(
                RequestCode.GET_SUBSCRIPTIONGROUP_CONFIG,
                GroupHeader(group).encode(),
                timeout=timeout,
            ),
            "group config",
        )
        return json_object(response, f"group config of {group}")

    async def topic_config(self, topic: str, timeout: float = DEFAULT_TIMEOUT) -> dict[str, Any]:
        """The topic's TopicConfig (GET_TOPIC_CONFIG) as JSON: its queues, perm, attributes."""
        response = self._check(
            await self._call(
                RequestCode.GET_TOPIC_CONFIG, TopicHeader(topic).encode(), timeout=timeout
            ),
            "topic config",
        )
        return json_object(response, f"topic config of {topic}")

    async def polling_info(
        self, group: str, topic: str, queue_id: int = -1, timeout: float = DEFAULT_TIMEOUT
    ) -> int:
        """How many pops are parked on the broker for (topic, group, queue)."""
        header = PollingInfoHeader(group, topic, queue_id)
        response = self._check(
            await self._call(RequestCode.POLLING_INFO, header.encode(), timeout=timeout),
            "polling info",
        )
        with readable(self.name, "polling info"):
            return PollingInfoResponseHeader.decode(response.ext_fields).polling_num

    async def send_to_dead_letter(
        self,
        group: str,
        commit_log_offset: int,
        msg_id: str,
        topic: str,
        max_reconsume_times: int,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        """Move the message at ``commit_log_offset`` to ``%DLQ%<group>``
        (CONSUMER_SEND_MSG_BACK with delay level -1)."""
        header = ConsumerSendMsgBackHeader(
            commit_log_offset,
            group,
            delay_level=-1,
            origin_msg_id=msg_id,
            origin_topic=topic,
            max_reconsume_times=max_reconsume_times,
        )
        self._check(
            await self._call(RequestCode.CONSUMER_SEND_MSG_BACK, header.encode(), timeout=timeout),
            "send to dead-letter queue",
        )
