"""The lite requests of a broker (RocketMQ 5.5): LITE_SUBSCRIPTION_CTL, POP_LITE_MESSAGE, and
the lite forms of ACK_MESSAGE and CHANGE_MESSAGE_INVISIBLETIME (a ``liteTopic`` in the
header). Codes, remarks and checks follow LiteSubscriptionCtlProcessor,
PopLiteMessageProcessor, AckMessageProcessor.ackLite and
ChangeInvisibleTimeProcessor.processChangeInvisibleTimeForLite; the state is ``LiteService``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import orjson

from broker_stub.config import BrokerConfig
from broker_stub.groups import GroupTable
from broker_stub.handlers import RequestError
from broker_stub.lite import POLL_GROUP, LiteQuotaExceeded, LiteRefused, LiteService
from broker_stub.polling import PollingTable, Waiter
from broker_stub.pop import POP_ORDER_REVIVE_QUEUE, PopService
from broker_stub.store import MessageStore
from broker_stub.topics import PERM_READ, TopicTable
from proxy.remoting.codes import ResponseCode
from proxy.remoting.command import RemotingCommand
from proxy.remoting.connection import RemotingConnection
from proxy.remoting.headers import (
    AckMessageHeader,
    ChangeInvisibleTimeHeader,
    ChangeInvisibleTimeResponseHeader,
    PopLiteMessageHeader,
    PopLiteMessageResponseHeader,
    now_ms,
)
from proxy.remoting.lite import (
    LiteAction,
    LiteSubscription,
    LiteSubscriptionCtlBody,
    lite_owner,
    lmq_name,
    split_lmq_name,
)
from proxy.remoting.popinfo import PopCheckpointInfo
from proxy.remoting.server import Reply

log = logging.getLogger(__name__)

OK = ResponseCode.SUCCESS
LITE = "LITE"  # the message.type of a lite parent topic
BAD = ResponseCode.INVALID_PARAMETER
ILLEGAL = ResponseCode.ILLEGAL_OPERATION
# The parent topic's route queueDatas from the name server, or None when it has none.
RouteLookup = Callable[[str], Awaitable[Sequence[dict[str, Any]] | None]]
NOT_FOUND_REMARK = "NO_MESSAGE_IN_QUEUE"
# The remark a broker's response keeps when its processor sets only the code.
UNSET_REMARK = "not set any response code"
QUOTA_EXCEPTION = "org.apache.rocketmq.broker.lite.LiteQuotaException"
STATE_EXCEPTION = "java.lang.IllegalStateException"
ADDING = (LiteAction.PARTIAL_ADD, LiteAction.COMPLETE_ADD)


class LiteHandlers:
    """Serves the lite requests of one broker."""

    def __init__(
        self,
        config: BrokerConfig,
        store: MessageStore,
        topics: TopicTable,
        groups: GroupTable,
        pop: PopService,
        lite: LiteService,
        polls: PollingTable,
        route: RouteLookup | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.topics = topics
        self.groups = groups
        self.pop = pop
        self.lite = lite
        self.polls = polls
        self.route = route
        self.loop = pop.loop

    # -- LITE_SUBSCRIPTION_CTL ------------------------------------------------------------

    def subscription_ctl(self, cmd: RemotingCommand, conn: RemotingConnection) -> Reply:
        if not cmd.body:
            return cmd.make_response(ILLEGAL, remark="Request body is null.")
        try:
            entries = list(LiteSubscriptionCtlBody.decode(cmd.body).subscriptions)
        except ValueError as exc:  # a broker's JSON decoding throws: SYSTEM_ERROR
            return cmd.make_response(ResponseCode.SYSTEM_ERROR, remark=str(exc))
        if not entries:
            return cmd.make_response(ILLEGAL, remark="LiteSubscriptionCtlRequestBody is empty.")
        return self._apply(cmd, conn, entries)

    async def _apply(
        self, cmd: RemotingCommand, conn: RemotingConnection, entries: list[LiteSubscription]
    ) -> RemotingCommand:
        # Which broker owns a lite topic depends on the parent's route: look the routes up
        # first (a real broker asks the name server too), then change state in one go.
        owners: dict[str, Sequence[dict[str, Any]] | None] = {}
        for e in entries:
            if e.action in ADDING and e.topic and e.topic not in owners:
                owners[e.topic] = await self.route(e.topic) if self.route else None
        try:
            for e in entries:
                if not (e.client_id.strip() and e.group.strip() and e.topic.strip()):
                    log.warning("lite subscription entry without client, group or topic: %s", e)
                    continue
                self._apply_one(e, conn, owners.get(e.topic))
        except LiteQuotaExceeded as exc:
            return cmd.make_response(
                ResponseCode.LITE_SUBSCRIPTION_QUOTA_EXCEEDED, remark=f"{QUOTA_EXCEPTION}: {exc}"
            )
        except LiteRefused as exc:
            return cmd.make_response(ILLEGAL, remark=f"{STATE_EXCEPTION}: {exc}")
        return cmd.make_response(OK)

    def _apply_one(
        self,
        e: LiteSubscription,
        conn: RemotingConnection,
        queue_datas: Sequence[dict[str, Any]] | None,
    ) -> None:
        lmqs = {lmq_name(e.topic, t) for t in e.lite_topics if t}

        def active(lmq: str) -> bool:
            # Owned here by sharding (no route: everything is), or already holding messages.
            names = split_lmq_name(lmq)
            owner = lite_owner(names[1], queue_datas) if names and queue_datas else None
            return owner in (None, self.config.name) or self.lite.lmq_exists(lmq)

        action = e.action
        if action in ADDING:
            if not self.groups.get(e.group).consume_enable:
                raise LiteRefused("Consumer group is not allowed to consume.")
            self.lite.remember_channel(e.client_id, conn)
        if action is LiteAction.PARTIAL_ADD:
            self.lite.add_partial(e.client_id, e.group, e.topic, lmqs, e.offset_option, active)
        elif action is LiteAction.PARTIAL_REMOVE:
            self.lite.remove_partial(e.client_id, e.group, e.topic, lmqs)
        elif action is LiteAction.COMPLETE_ADD:
            self.lite.add_complete(e.client_id, e.group, e.topic, lmqs, active)
        else:
            self.lite.remove_complete(e.client_id)

    def broker_lite_info(self, cmd: RemotingCommand, conn: RemotingConnection) -> Reply:
        """GET_BROKER_LITE_INFO (GetBrokerLiteInfoResponseBody): the stub's counts,
        ``topicMeta`` (each LITE topic's TTL: -1, never, as the stub's lite topics) and
        ``groupMeta`` (the groups bound to each parent topic)."""
        group_meta: dict[str, list[str]] = {}
        for config in self.groups.all():
            if config.lite_bind_topic:
                group_meta.setdefault(config.lite_bind_topic, []).append(config.name)
        body = {
            "storeType": "default",
            "maxLmqNum": self.config.max_lmq_queues,
            "currentLmqNum": self.lite.lmq_count,
            "liteSubscriptionCount": self.lite.active,
            "orderInfoCount": 0,
            "cqTableSize": 0,
            "offsetTableSize": 0,
            "eventMapSize": self.lite.event_queue_count,
            "topicMeta": {t.name: -1 for t in self.topics.all() if t.message_type == LITE},
            "groupMeta": {topic: sorted(names) for topic, names in group_meta.items()},
        }
        return cmd.make_response(OK, body=orjson.dumps(body))

    # -- POP_LITE_MESSAGE -----------------------------------------------------------------

    def pop_lite(self, cmd: RemotingCommand, conn: RemotingConnection) -> Reply:
        h = PopLiteMessageHeader.decode(cmd.ext_fields)
        born_time = h.born_time or now_ms()
        host = self.config.address.rpartition(":")[0]
        if h.poll_time > 0 and now_ms() - born_time - h.poll_time > 500:
            return cmd.make_response(
                ResponseCode.POLLING_TIMEOUT,
                remark=f"the broker[{host}] pop message is timeout too much",
            )
        if h.max_msg_num > 32:
            raise RequestError(BAD, f"the broker[{host}] pop message's num is greater than 32")
        if h.max_msg_num <= 0 or h.invisible_time <= 0 or h.poll_time < 0:
            raise RequestError(BAD, "maxMsgNum and invisibleTime must be positive")
        topic = self.topics.get(h.topic)
        if topic is None:
            raise RequestError(
                ResponseCode.TOPIC_NOT_EXIST, f"topic [{h.topic}] not exist, apply first please!"
            )
        if not topic.perm & PERM_READ:
            raise RequestError(
                ResponseCode.NO_PERMISSION, f"the topic [{h.topic}] peeking message is forbidden"
            )
        if topic.message_type != LITE:
            raise RequestError(BAD, f"the topic [{h.topic}] message type not match")
        group = self.groups.get(h.consumer_group)
        if not group.consume_enable:
            raise RequestError(
                ResponseCode.NO_PERMISSION, f"subscription group no permission, {group.name}"
            )
        if group.lite_bind_topic != h.topic:
            raise RequestError(BAD, f"subscription bind topic not match, {group.name}")

        def answer() -> RemotingCommand | None:
            """The response if the pop found something, else None."""
            result = self.lite.pop(
                h.client_id, h.consumer_group, h.max_msg_num, h.invisible_time, h.attempt_id
            )
            if not result.records:
                return None
            return cmd.make_response(
                OK,
                self._header(result.pop_time, h.invisible_time, ";".join(result.order_counts)),
                b"".join(result.records),
                remark="FOUND",
            )

        def nothing(code: int) -> RemotingCommand:
            header = self._header(now_ms(), h.invisible_time, "")
            return cmd.make_response(code, header, remark=NOT_FOUND_REMARK)

        found = answer()
        if found is not None:
            return found
        if h.poll_time <= 0:
            return nothing(ResponseCode.POLLING_TIMEOUT)

        def on_wake(waiter: Waiter) -> None:
            again = answer()
            if again is not None:
                waiter.future.set_result(again)
            elif not self.polls.park(waiter):
                waiter.future.set_result(nothing(ResponseCode.POLLING_TIMEOUT))

        def on_timeout(waiter: Waiter) -> None:
            waiter.future.set_result(answer() or nothing(ResponseCode.POLLING_TIMEOUT))

        future = self.loop.create_future()
        deadline = self.loop.time() + (born_time + h.poll_time - now_ms()) / 1000
        waiter = Waiter((h.client_id, POLL_GROUP, 0), future, deadline, on_wake, on_timeout)
        if not self.polls.park(waiter):
            return nothing(ResponseCode.POLLING_FULL)
        return future

    @staticmethod
    def _header(pop_time: int, invisible_time: int, counts: str) -> dict[str, str]:
        return PopLiteMessageResponseHeader(
            pop_time=pop_time,
            invisible_time=invisible_time,
            revive_qid=POP_ORDER_REVIVE_QUEUE,
            order_count_info=counts,
        ).encode()

    # -- ack and invisible time of a lite message -------------------------------------------

    def _extra_info(self, h: AckMessageHeader) -> PopCheckpointInfo:
        try:
            return PopCheckpointInfo.parse(h.extra_info)
        except ValueError as exc:
            raise RequestError(BAD, f"bad extraInfo: {exc}") from None

    def ack(self, cmd: RemotingCommand, h: AckMessageHeader) -> RemotingCommand:
        """AckMessageProcessor.ackLite: the group bound to the topic, the offset within the
        LMQ, queue 0 and an orderly handle (revive queue 999); then an orderly ack."""
        assert h.lite_topic
        if self.groups.get(h.consumer_group).lite_bind_topic != h.topic:
            raise RequestError(BAD, "group type or bind topic not match.")
        lmq = lmq_name(h.topic, h.lite_topic)
        if h.offset > self.store.max_offset(lmq, 0):
            raise RequestError(ResponseCode.NO_MESSAGE, "ack offset illegal.")
        info = self._extra_info(h)
        if h.queue_id != 0 or info.revive_qid != POP_ORDER_REVIVE_QUEUE:
            raise RequestError(BAD, "ack queue illegal.")
        group = h.consumer_group
        if h.offset < self.pop.committed_offset(group, lmq, 0):
            return cmd.make_response(OK)
        done = self.pop.ack_orderly(group, lmq, 0, h.offset, info.pop_time)
        if done is None:
            raise RequestError(ResponseCode.MESSAGE_ILLEGAL, "ack offset illegal.")
        if done:
            self.lite.acked(group, lmq)
        return cmd.make_response(OK)

    def change_invisible_time(
        self, cmd: RemotingCommand, h: ChangeInvisibleTimeHeader
    ) -> RemotingCommand:
        """processChangeInvisibleTimeForLite: only the offset is checked (no group binding,
        queue or revive queue); ``suspend`` hands the whole pop back without counting it as
        an attempt (suspendQueue), else the one message's invisible time moves."""
        assert h.lite_topic
        lmq = lmq_name(h.topic, h.lite_topic)
        if h.offset > self.store.max_offset(lmq, 0):
            return cmd.make_response(ResponseCode.NO_MESSAGE, remark=UNSET_REMARK)
        info = self._extra_info(h)
        group = h.consumer_group
        if h.offset < self.pop.committed_offset(group, lmq, 0):
            return cmd.make_response(OK, remark=UNSET_REMARK)
        next_visible = now_ms() + h.invisible_time
        if h.suspend:
            self.pop.suspend_orderly(group, lmq, 0, info.pop_time, next_visible)
        else:
            self.pop.change_orderly(group, lmq, 0, h.offset, info.pop_time, h.invisible_time)
        self.lite.watch_block(group, lmq)
        answer = ChangeInvisibleTimeResponseHeader(
            info.pop_time, next_visible - info.pop_time, info.revive_qid
        )
        return cmd.make_response(OK, answer.encode(), remark=UNSET_REMARK)
