"""What every family of a broker's request handlers shares: the broker's parts (its store,
tables, services) and the checks every family makes. ``BrokerProcessor`` builds the parts
once and hands them to each family (produce.py, consume.py, admin.py, lite_handlers.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from broker_stub.config import BrokerConfig
from broker_stub.groups import GroupTable
from broker_stub.handlers import RequestError
from broker_stub.lite import LiteService
from broker_stub.lite_handlers import LiteHandlers
from broker_stub.polling import PollingTable
from broker_stub.pop import PopService
from broker_stub.store import MessageStore
from broker_stub.timers import DeliveryScheduler
from broker_stub.topics import TopicConfig, TopicTable, group_name_error, topic_name_error
from broker_stub.transactions import TransactionService
from proxy.remoting.codes import ResponseCode
from proxy.remoting.message import UniqueIdGenerator

OK = ResponseCode.SUCCESS
BAD = ResponseCode.INVALID_PARAMETER
NO_MESSAGE_REMARK = "NO_MESSAGE_IN_QUEUE"


@dataclass
class BrokerParts:
    """One broker's state, shared by its handler families."""

    config: BrokerConfig
    store: MessageStore
    topics: TopicTable
    pop: PopService
    pops: PollingTable
    notifications: PollingTable
    scheduler: DeliveryScheduler
    transactions: TransactionService
    groups: GroupTable
    lite: LiteService
    lite_polls: PollingTable
    lite_handlers: LiteHandlers
    ids: UniqueIdGenerator
    started_ms: int


class Handlers:
    """A family of request handlers: one method per request code, over the shared parts."""

    def __init__(self, parts: BrokerParts) -> None:
        self.config = parts.config
        self.store = parts.store
        self.topics = parts.topics
        self.pop = parts.pop
        self.pops = parts.pops
        self.notifications = parts.notifications
        self.scheduler = parts.scheduler
        self.loop = parts.pop.loop
        self.transactions = parts.transactions
        self.groups = parts.groups
        self.lite = parts.lite
        self.lite_polls = parts.lite_polls
        self.lite_handlers = parts.lite_handlers
        self.ids = parts.ids
        self.started_ms = parts.started_ms

    @property
    def store_host(self) -> tuple[str, int]:
        """This broker's advertised address, as stored in messages (the port is known only
        once the server has bound it)."""
        return (self.config.address.rpartition(":")[0], self.config.port)

    # -- shared checks ---------------------------------------------------------------------------

    def _topic(self, topic: str) -> TopicConfig:
        error = topic_name_error(topic)
        if error:
            raise RequestError(BAD, error)
        config = self.topics.get(topic)
        if config is None:
            raise RequestError(
                ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!"
            )
        return config

    def _read_queue(self, config: TopicConfig, queue_id: int, code: int = BAD) -> None:
        if queue_id < -1 or queue_id >= config.read_queue_nums:
            raise RequestError(
                code,
                f"queueId[{queue_id}] is illegal, topic:[{config.name}] "
                f"topicConfig.readQueueNums:[{config.read_queue_nums}] broker:[{self.config.name}]",
            )

    @staticmethod
    def _group(group: str) -> None:
        error = group_name_error(group)
        if error:
            raise RequestError(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, error)
