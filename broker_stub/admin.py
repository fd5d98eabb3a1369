"""The admin family of a broker's request handlers: topics, groups, broker configuration and
statistics (what mqadmin and the name server's clients ask)."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence

import orjson

from broker_stub.groups import GroupConfig
from broker_stub.handlers import RequestError
from broker_stub.parts import BAD, OK, Handlers
from broker_stub.topics import alter_attributes, topic_name_error
from proxy.remoting.codes import ResponseCode
from proxy.remoting.command import RemotingCommand
from proxy.remoting.connection import RemotingConnection
from proxy.remoting.headers import CreateTopicHeader, GroupHeader, TopicHeader, now_ms
from proxy.remoting.message import MessageExt

log = logging.getLogger(__name__)


class AdminHandlers(Handlers):
    """Topic and group creation and configuration, broker configuration and statistics, and
    the requests a client sends on start-up that need only an OK: what mqadmin and the route
    look-ups send."""

    # -- start-up ------------------------------------------------------------------------------

    def ok(self, cmd: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        return cmd.make_response(OK)

    # -- topics and groups ---------------------------------------------------------------------

    def create_topic(self, cmd: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        h = CreateTopicHeader.decode(cmd.ext_fields)
        topic = h.topic
        error = topic_name_error(topic)
        if error:
            raise RequestError(BAD, error)
        nums = self.config.default_queue_nums if h.read_queue_nums is None else h.read_queue_nums
        write_nums = nums if h.write_queue_nums is None else h.write_queue_nums
        for n in (nums, write_nums):
            if not 1 <= n <= 1024:
                raise RequestError(BAD, f"queue count {n} outside 1..1024")
        current = self.topics.get(topic)
        try:
            attributes = alter_attributes(current.attributes if current else {}, h.attributes)
        except ValueError as exc:
            raise RequestError(BAD, str(exc)) from None
        self.topics.create(topic, nums, h.perm, write_nums, attributes)
        return cmd.make_response(OK)

    def create_group(self, cmd: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: body = SubscriptionGroupConfig JSON."""
        try:
            body = orjson.loads(cmd.body)
            name = str(body["groupName"])
        except (orjson.JSONDecodeError, TypeError, KeyError, ValueError, AttributeError):
            raise RequestError(BAD, "the body is not a SubscriptionGroupConfig") from None
        current = self.groups.find(name)
        try:
            config = GroupConfig.from_json(
                body, self.config.max_reconsume_times, current.attributes if current else None
            )
        except (TypeError, KeyError, AttributeError):
            raise RequestError(BAD, "the body is not a SubscriptionGroupConfig") from None
        except ValueError as exc:
            # A RocketMQ broker lets AttributeUtil's exception reach the remoting layer.
            # (Its remark goes on with the Java stack frame, which the stub has not.)
            raise RequestError(
                ResponseCode.SYSTEM_ERROR, f"java.lang.RuntimeException: {exc}"
            ) from None
        self._group(config.name)
        self.groups.put(config)
        return cmd.make_response(OK)

    def group_config(self, cmd: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        """GET_SUBSCRIPTIONGROUP_CONFIG: the group's SubscriptionGroupConfig JSON; a group
        never configured gets the defaults, as a broker with autoCreateSubscriptionGroup."""
        group = GroupHeader.decode(cmd.ext_fields).group
        self._group(group)
        config = self.groups.get(group)
        return cmd.make_response(OK, body=orjson.dumps(config.to_json()))

    def topic_config(self, cmd: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        """GET_TOPIC_CONFIG (admin tools read it before the stats): TopicConfig JSON."""
        config = self._topic(TopicHeader.decode(cmd.ext_fields).topic)
        return cmd.make_response(OK, body=orjson.dumps(config.to_json()))

    def all_topic_config(self, cmd: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        body = {
            "dataVersion": {
                "counter": self.topics.version,
                "stateVersion": 0,
                "timestamp": now_ms(),
            },
            "topicConfigTable": {t.name: t.to_json() for t in self.topics.all()},
        }
        return cmd.make_response(OK, body=orjson.dumps(body))

    # -- broker --------------------------------------------------------------------------------

    def update_broker_config(
        self, cmd: RemotingCommand, conn: RemotingConnection
    ) -> RemotingCommand:
        """UPDATE_BROKER_CONFIG: a properties body (``key=value`` lines). The stub acts on
        ``maxLiteSubscriptionCount``, ``maxLmqConsumeQueueNum`` and ``enableLmqQuota``; like
        a RocketMQ broker, which sets whatever field matches, it takes other keys without
        complaint (and ignores them)."""
        text = cmd.body.decode("utf-8", "replace") if cmd.body else ""
        for line in text.splitlines():
            key, sep, value = (part.strip() for part in line.partition("="))
            if not sep:
                continue
            if key == "enableLmqQuota":
                self.config.lmq_quota = value.lower() == "true"
            elif key in ("maxLiteSubscriptionCount", "maxLmqConsumeQueueNum"):
                try:
                    number = int(value)
                except ValueError:
                    raise RequestError(ResponseCode.SYSTEM_ERROR, f"bad {line!r}") from None
                if key == "maxLiteSubscriptionCount":
                    self.lite.max_subscriptions = number
                else:
                    self.config.max_lmq_queues = number
        return cmd.make_response(OK)

    def runtime_info(self, cmd: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        """GET_BROKER_RUNTIME_INFO: a KVTable of the figures ``mqadmin clusterList`` prints
        (the stub measures none of the rates: zeros)."""
        earliest = min(
            (m.store_timestamp for m in self._first_messages() if m is not None),
            default=0,
        )
        table = {
            "brokerVersionDesc": "V5_3_3",
            "brokerVersion": "479",
            "brokerActive": "true",
            "bootTimestamp": str(self.started_ms),
            "putTps": "0.0 0.0 0.0",
            "getTransferredTps": "0.0 0.0 0.0",
            "sendThreadPoolQueueSize": "0",
            "pullThreadPoolQueueSize": "0",
            "ackThreadPoolQueueSize": "0",
            "sendThreadPoolQueueHeadWaitTimeMills": "0",
            "pullThreadPoolQueueHeadWaitTimeMills": "0",
            "ackThreadPoolQueueHeadWaitTimeMills": "0",
            "pageCacheLockTimeMills": "0",
            "earliestMessageTimeStamp": str(earliest),
            "commitLogDiskRatio": "0.0",
            "msgPutTotalYesterdayMorning": "0",
            "msgPutTotalTodayMorning": "0",
            "msgPutTotalTodayNow": str(self.store.commit_log_count),
            "msgGetTotalYesterdayMorning": "0",
            "msgGetTotalTodayMorning": "0",
            "msgGetTotalTodayNow": "0",
            "timerReadBehind": "0",
            "timerOffsetBehind": "0",
            "timerCongestNum": "0",
            "timerEnqueueTps": "0.0",
            "timerDequeueTps": "0.0",
        }
        return cmd.make_response(OK, body=orjson.dumps({"table": table}))

    def _first_messages(self) -> Iterator[MessageExt | None]:
        for config in self.topics.all():
            for qid in range(config.read_queue_nums):
                if self.store.max_offset(config.name, qid) > 0:
                    yield self.store.message(
                        config.name, qid, self.store.min_offset(config.name, qid)
                    )

    def topic_stats(self, cmd: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        """GET_TOPIC_STATS_INFO: min and max offset and last store time of each queue
        (TopicStatsTable, keyed by MessageQueue as fastjson writes it)."""
        topic = TopicHeader.decode(cmd.ext_fields).topic
        config = self._topic(topic)
        entries = []
        for qid in range(config.write_queue_nums):
            low, high = self.store.min_offset(topic, qid), self.store.max_offset(topic, qid)
            last = self.store.message(topic, qid, high - 1) if high > low else None
            entries.append(
                (
                    {"brokerName": self.config.name, "queueId": qid, "topic": topic},
                    {
                        "lastUpdateTimestamp": last.store_timestamp if last else 0,
                        "maxOffset": high,
                        "minOffset": low,
                    },
                )
            )
        body = b'{"offsetTable":' + _fastjson_map(entries) + b',"topicPutTps":0.0}'
        return cmd.make_response(OK, body=body)


def consume_stats_body(broker: str, topic: str, queues: Sequence[tuple[int, int, int]]) -> bytes:
    """A ConsumeStats: per queue (id, broker offset, group offset), keyed by MessageQueue
    as fastjson writes it."""
    entries = [
        (
            {"brokerName": broker, "queueId": qid, "topic": topic},
            {"brokerOffset": high, "consumerOffset": mine, "lastTimestamp": 0,
             "pullOffset": mine},
        )
        for qid, high, mine in queues
    ]  # fmt: skip
    return b'{"consumeTps":0.0,"offsetTable":' + _fastjson_map(entries) + b"}"


def _fastjson_map(entries: Sequence[tuple[Mapping[str, object], Mapping[str, object]]]) -> bytes:
    """A JSON-like map with object keys, as fastjson writes a ``Map<MessageQueue, ...>``:
    ``{{"brokerName":..,"queueId":0,"topic":..}:{...}}``. Not valid JSON, but what a Java
    admin client parses (and what a RocketMQ broker sends)."""
    parts = [orjson.dumps(key, option=orjson.OPT_SORT_KEYS) + b":" + orjson.dumps(
        value, option=orjson.OPT_SORT_KEYS) for key, value in entries]  # fmt: skip
    return b"{" + b",".join(parts) + b"}"
