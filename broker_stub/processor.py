"""A broker's request handlers, by family as the proxy's activities use them:
``produce.py`` (sends, transactions, recalls), ``consume.py`` (pops, acks, invisible time,
notifications, dead letters, offsets), ``admin.py`` (topics, groups, broker configuration)
and ``lite_handlers.py`` (RocketMQ 5.5 lite topics). ``BrokerProcessor`` builds the parts
they share (``parts.py``) and maps each request code to its handler.

Handlers answer synchronously where they can; only a parked long poll returns a future.
Validation follows RocketMQ's broker: the codes and remarks a RocketMQ client expects.
"""

from __future__ import annotations

from collections.abc import Callable

from broker_stub.admin import AdminHandlers
from broker_stub.auth import AuthHandlers
from broker_stub.config import BrokerConfig
from broker_stub.consume import ConsumeHandlers
from broker_stub.groups import GroupTable
from broker_stub.handlers import dispatch
from broker_stub.lite import LiteService
from broker_stub.lite_handlers import LiteHandlers, RouteLookup
from broker_stub.parts import BrokerParts
from broker_stub.polling import PollingTable
from broker_stub.pop import PopService
from broker_stub.produce import ProduceHandlers
from broker_stub.store import MessageStore
from broker_stub.timers import DeliveryScheduler
from broker_stub.topics import TopicTable
from broker_stub.transactions import TransactionService
from proxy.remoting.codes import RequestCode
from proxy.remoting.command import RemotingCommand
from proxy.remoting.connection import RemotingConnection
from proxy.remoting.headers import now_ms
from proxy.remoting.message import UniqueIdGenerator
from proxy.remoting.server import Reply


class BrokerProcessor:
    """Serves the requests of one broker: builds its parts and dispatches each request to
    the family that handles it."""

    def __init__(
        self,
        config: BrokerConfig,
        store: MessageStore,
        topics: TopicTable,
        pop: PopService,
        pops: PollingTable,
        notifications: PollingTable,
        scheduler: DeliveryScheduler,
        transactions: TransactionService | None = None,
        route: RouteLookup | None = None,
    ) -> None:
        transactions = transactions or TransactionService(
            store,
            scheduler,
            pop.loop,
            check_interval_ms=config.transaction_check_interval_ms,
            timeout_ms=config.transaction_timeout_ms,
            check_max=config.transaction_check_max,
        )
        groups = GroupTable(config.max_reconsume_times)
        # Lite topics (RocketMQ 5.5): parked lite pops wait per client, not per queue. The
        # broker closes both (its lifecycle), hence the attributes.
        self.lite_polls = PollingTable(pop.loop, config.polling_per_key, config.polling_total)
        self.lite = LiteService(
            store, pop, groups, self.lite_polls, pop.loop,
            max_subscriptions=config.max_lite_subscriptions,
        )  # fmt: skip
        lite = LiteHandlers(config, store, topics, groups, pop, self.lite, self.lite_polls, route)
        parts = BrokerParts(
            config, store, topics, pop, pops, notifications, scheduler, transactions, groups,
            self.lite, self.lite_polls, lite,
            UniqueIdGenerator(config.address.rpartition(":")[0]), now_ms(),
        )  # fmt: skip
        produce, consume, admin = (
            ProduceHandlers(parts), ConsumeHandlers(parts), AdminHandlers(parts)
        )  # fmt: skip
        auth = AuthHandlers(config.acl_file)
        self.handlers: dict[int, Callable[[RemotingCommand, RemotingConnection], Reply]] = {
            RequestCode.SEND_MESSAGE: produce.send_message,
            RequestCode.SEND_MESSAGE_V2: produce.send_message,
            RequestCode.SEND_BATCH_MESSAGE: produce.send_message,
            RequestCode.POP_MESSAGE: consume.pop_message,
            RequestCode.ACK_MESSAGE: consume.ack_message,
            RequestCode.BATCH_ACK_MESSAGE: consume.batch_ack_message,
            RequestCode.CHANGE_MESSAGE_INVISIBLETIME: consume.change_invisible_time,
            RequestCode.NOTIFICATION: consume.notification,
            RequestCode.POLLING_INFO: consume.polling_info,
            RequestCode.CONSUMER_SEND_MSG_BACK: consume.send_back,
            RequestCode.HEART_BEAT: produce.heartbeat,
            RequestCode.END_TRANSACTION: produce.end_transaction,
            RequestCode.RECALL_MESSAGE: produce.recall_message,
            RequestCode.UNREGISTER_CLIENT: admin.ok,
            RequestCode.CHECK_CLIENT_CONFIG: admin.ok,
            RequestCode.UPDATE_CONSUMER_OFFSET: admin.ok,
            RequestCode.GET_CONSUMER_LIST_BY_GROUP: consume.consumer_list,
            RequestCode.QUERY_CONSUMER_OFFSET: consume.query_consumer_offset,
            RequestCode.GET_MAX_OFFSET: consume.max_offset,
            RequestCode.GET_CONSUME_STATS: consume.consume_stats,
            RequestCode.QUERY_CONSUME_TIME_SPAN: consume.consume_time_span,
            RequestCode.GET_MIN_OFFSET: consume.min_offset,
            RequestCode.UPDATE_AND_CREATE_TOPIC: admin.create_topic,
            RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: admin.create_group,
            RequestCode.GET_ALL_TOPIC_CONFIG: admin.all_topic_config,
            RequestCode.GET_BROKER_RUNTIME_INFO: admin.runtime_info,
            RequestCode.GET_TOPIC_STATS_INFO: admin.topic_stats,
            RequestCode.GET_TOPIC_CONFIG: admin.topic_config,
            RequestCode.GET_SUBSCRIPTIONGROUP_CONFIG: admin.group_config,
            RequestCode.POP_LITE_MESSAGE: lite.pop_lite,
            RequestCode.LITE_SUBSCRIPTION_CTL: lite.subscription_ctl,
            RequestCode.GET_BROKER_LITE_INFO: lite.broker_lite_info,
            RequestCode.UPDATE_BROKER_CONFIG: admin.update_broker_config,
            RequestCode.AUTH_GET_USER: auth.get_user,
            RequestCode.AUTH_LIST_USER: auth.list_users,
            RequestCode.AUTH_GET_ACL: auth.get_acl,
            RequestCode.AUTH_LIST_ACL: auth.list_acls,
        }

    def __call__(self, cmd: RemotingCommand, conn: RemotingConnection) -> Reply:
        return dispatch(self.handlers, cmd, conn)
