"""SyncLiteSubscription (RocketMQ 5.5 lite topics): validate and translate a lite consumer's
change to its set of lite topics; the lite processor applies it on the brokers.

As in the Apache proxy 5.5: the lite topic names of an add are checked (blank, longer than
``max_lite_topic_size`` bytes, characters other than letters, digits, ``-`` and ``_``:
ILLEGAL_LITE_TOPIC); the offset option travels only with PARTIAL_ADD; the client id is the
request's ``x-mq-client-id``, the key the brokers keep the subscription under.
"""

from __future__ import annotations

from proxy.api import validation as check
from proxy.api.context import Context
from proxy.api.errors import ApiError, Code, lite_subscription_error, ok, route_error
from proxy.api.v2 import definition_pb2 as pb
from proxy.api.v2 import service_pb2 as api
from proxy.brokers import TopicNotFound
from proxy.processor.lite import LiteProcessor, LiteSubscriptionFailure
from proxy.remoting.client import RemotingError
from proxy.remoting.lite import LiteAction, LiteSubscription, OffsetOption, OffsetType

_ACTIONS = {
    pb.LiteSubscriptionAction.PARTIAL_ADD: LiteAction.PARTIAL_ADD,
    pb.LiteSubscriptionAction.PARTIAL_REMOVE: LiteAction.PARTIAL_REMOVE,
    pb.LiteSubscriptionAction.COMPLETE_ADD: LiteAction.COMPLETE_ADD,
    pb.LiteSubscriptionAction.COMPLETE_REMOVE: LiteAction.COMPLETE_REMOVE,
}


def offset_option(option: pb.OffsetOption) -> OffsetOption:
    """The gRPC OffsetOption as the broker reads it (policies LAST/MIN/MAX are 0/1/2 on both
    sides, ClientActivity.toOffsetPolicy)."""
    which = option.WhichOneof("offset_type")
    if which == "policy":
        return OffsetOption(OffsetType.POLICY, int(option.policy))
    if which == "offset":
        if option.offset < 0:
            raise ApiError(Code.ILLEGAL_OFFSET, "offset must not be negative")
        return OffsetOption(OffsetType.OFFSET, option.offset)
    if which == "tail_n":
        if option.tail_n < 0:
            raise ApiError(Code.ILLEGAL_OFFSET, "tail_n must not be negative")
        return OffsetOption(OffsetType.TAIL_N, option.tail_n)
    if which == "timestamp":
        return OffsetOption(OffsetType.TIMESTAMP, option.timestamp)
    raise ApiError(Code.ILLEGAL_OFFSET, "offset option sets no offset type")


class LiteActivity:
    def __init__(self, processor: LiteProcessor, max_lite_topic_size: int) -> None:
        self.processor = processor
        self.max_lite_topic_size = max_lite_topic_size

    def translate(
        self, request: api.SyncLiteSubscriptionRequest, client_id: str
    ) -> LiteSubscription:
        topic = check.validate_topic(request.topic.name)
        group = check.validate_group(request.group.name)
        action = _ACTIONS.get(request.action)
        if action is None:
            raise ApiError(Code.BAD_REQUEST, f"unknown lite subscription action {request.action}")
        names = list(dict.fromkeys(request.lite_topic_set))  # a set, in the client's order
        if action is LiteAction.PARTIAL_ADD:
            for name in names:
                check.validate_lite_topic(name, self.max_lite_topic_size)
        option = None
        if action is LiteAction.PARTIAL_ADD and request.HasField("offset_option"):
            option = offset_option(request.offset_option)
        return LiteSubscription(
            action=action,
            client_id=client_id,
            group=group,
            topic=topic,
            lite_topics=tuple(names),
            offset_option=option,
            version=request.version,
        )

    async def sync_lite_subscription(
        self, request: api.SyncLiteSubscriptionRequest, context: Context
    ) -> api.SyncLiteSubscriptionResponse:
        subscription = self.translate(request, check.require_client_id(context))
        try:
            await self.processor.sync(subscription)
        except LiteSubscriptionFailure as failure:
            raise lite_subscription_error(failure.broker, failure.error) from None
        except (TopicNotFound, RemotingError) as exc:
            raise route_error(subscription.topic, exc) from None
        return api.SyncLiteSubscriptionResponse(status=ok())
