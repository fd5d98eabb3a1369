"""Numeric constants of the RocketMQ remoting protocol.

Values are the ones RocketMQ's ``RequestCode``, ``ResponseCode`` and ``LanguageCode``
define (read from the RocketMQ 5.5.0 remoting jar).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import IntEnum
from types import MappingProxyType


class RequestCode(IntEnum):
    SEND_MESSAGE = 10
    PULL_MESSAGE = 11
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    UPDATE_AND_CREATE_TOPIC = 17
    GET_ALL_TOPIC_CONFIG = 21
    UPDATE_BROKER_CONFIG = 25
    GET_BROKER_RUNTIME_INFO = 28  # mqadmin clusterList
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    GET_MAX_OFFSET = 30
    GET_MIN_OFFSET = 31
    GET_EARLIEST_MSG_STORETIME = 32
    HEART_BEAT = 34
    UNREGISTER_CLIENT = 35
    CONSUMER_SEND_MSG_BACK = 36
    END_TRANSACTION = 37
    CHECK_TRANSACTION_STATE = 39
    NOTIFY_CONSUMER_IDS_CHANGED = 40  # broker -> client: rebalance now
    GET_CONSUMER_LIST_BY_GROUP = 38
    LOCK_BATCH_MQ = 41
    UNLOCK_BATCH_MQ = 42
    CHECK_CLIENT_CONFIG = 46
    REGISTER_BROKER = 103
    UNREGISTER_BROKER = 104
    GET_ROUTEINFO_BY_TOPIC = 105
    GET_BROKER_CLUSTER_INFO = 106
    UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200
    GET_TOPIC_STATS_INFO = 202  # mqadmin topicStatus
    GET_CONSUME_STATS = 208  # mqadmin consumerProgress
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206
    QUERY_CONSUME_TIME_SPAN = 303  # mqadmin consumerProgress's times; the oldest's age
    GET_CONSUMER_RUNNING_INFO = 307  # broker -> client: mqadmin consumerStatus
    CONSUME_MESSAGE_DIRECTLY = 309  # broker -> client: mqadmin consumeMessage
    RECALL_MESSAGE = 370
    # ACL 2.0's users and rules, kept by each broker (mqadmin createUser, updateAcl, ...).
    AUTH_CREATE_USER = 3001
    AUTH_UPDATE_USER = 3002
    AUTH_DELETE_USER = 3003
    AUTH_GET_USER = 3004
    AUTH_LIST_USER = 3005
    AUTH_CREATE_ACL = 3006
    AUTH_UPDATE_ACL = 3007
    AUTH_DELETE_ACL = 3008
    AUTH_GET_ACL = 3009
    AUTH_LIST_ACL = 3010
    SEND_MESSAGE_V2 = 310
    LITE_PULL_MESSAGE = 361
    SEND_BATCH_MESSAGE = 320
    QUERY_DATA_VERSION = 322
    GET_TOPIC_CONFIG = 351
    GET_SUBSCRIPTIONGROUP_CONFIG = 352
    BROKER_HEARTBEAT = 904
    POP_MESSAGE = 200050
    ACK_MESSAGE = 200051
    PEEK_MESSAGE = 200052
    CHANGE_MESSAGE_INVISIBLETIME = 200053
    NOTIFICATION = 200054
    POLLING_INFO = 200055
    # Lite topics (RocketMQ 5.5, RIP-83). Lite acks go by ACK_MESSAGE with liteTopic: the
    # 5.5.0 broker registers no processor for ACK_LITE_MESSAGE.
    POP_LITE_MESSAGE = 200070
    LITE_SUBSCRIPTION_CTL = 200071
    ACK_LITE_MESSAGE = 200072
    NOTIFY_UNSUBSCRIBE_LITE = 200073  # broker -> the connection of the client's last CTL
    GET_BROKER_LITE_INFO = 200074
    GET_PARENT_TOPIC_INFO = 200075
    GET_LITE_TOPIC_INFO = 200076
    GET_LITE_CLIENT_INFO = 200077
    GET_LITE_GROUP_INFO = 200078
    TRIGGER_LITE_DISPATCH = 200079
    BATCH_ACK_MESSAGE = 200151


class ResponseCode(IntEnum):
    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14
    VERSION_NOT_SUPPORTED = 15
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    PULL_NOT_FOUND = 19
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_PARSE_FAILED = 23
    SUBSCRIPTION_GROUP_NOT_EXIST = 26
    INVALID_PARAMETER = 29
    ILLEGAL_OPERATION = 604
    NO_MESSAGE = 208
    POLLING_FULL = 209
    POLLING_TIMEOUT = 210
    LMQ_QUOTA_EXCEEDED = 2017  # a send would create more lite queues than the broker allows
    LITE_SUBSCRIPTION_QUOTA_EXCEEDED = 2018  # LITE_SUBSCRIPTION_CTL over the broker's limit
    GO_AWAY = 1500  # a server that is going away: a 5.x remoting client reconnects, retries


class LanguageCode(IntEnum):
    JAVA = 0
    CPP = 1
    DOTNET = 2
    PYTHON = 3
    DELPHI = 4
    ERLANG = 5
    RUBY = 6
    OTHER = 7
    HTTP = 8
    GO = 9
    PHP = 10
    OMS = 11
    RUST = 12
    NODE_JS = 13


def code_name(code: int, names: type[IntEnum]) -> str:
    """Lower-case name of a code for logs and metric labels, or the number itself."""
    try:
        return names(code).name.lower()
    except ValueError:
        return str(code)


# The transaction bits of a message's sysFlag (MessageSysFlag), and the commitOrRollback
# values of END_TRANSACTION.
TRANSACTION_NOT_TYPE = 0
TRANSACTION_PREPARED_TYPE = 0x4
TRANSACTION_COMMIT_TYPE = 0x8
TRANSACTION_ROLLBACK_TYPE = 0xC

# Flag bits of a command.
FLAG_RESPONSE = 0x1
FLAG_ONEWAY = 0x2

# Serialize types, in the top byte of the header-length word.
SERIALIZE_JSON = 0
SERIALIZE_ROCKETMQ = 1

# The version ordinal we announce: V5_3_3. Java clients treat it as the broker version.
CURRENT_VERSION = 479

# Netty's default frame limit on both sides of a RocketMQ connection.
DEFAULT_MAX_FRAME = 16 * 1024 * 1024

# RocketMQ's delay levels 1..18 in seconds: the DELAY property's levels, and the retry
# back-off a consumer is told to use.
DELAY_LEVELS_S = (
    1,
    5,
    10,
    30,
    60,
    120,
    180,
    240,
    300,
    360,
    420,
    480,
    540,
    600,
    1200,
    1800,
    3600,
    7200,
)

# A consumer group's retry back-off when its groupRetryPolicy sets none (RocketMQ 5.5.0's
# CustomizedRetryPolicy and ExponentialRetryPolicy defaults): the delay levels, or 5 s
# growing twofold up to 2 h.
DEFAULT_RETRY_BACKOFF_MS = tuple(s * 1000 for s in DELAY_LEVELS_S)
DEFAULT_EXPONENTIAL_BACKOFF: Mapping[str, int] = MappingProxyType(
    {"initial": 5_000, "max": 7_200_000, "multiplier": 2}
)
