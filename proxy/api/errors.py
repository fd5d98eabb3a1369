"""Status codes of the gRPC API, the error that carries one to the client, and the one
place where broker-side failures become the codes the RocketMQ 5 clients expect."""

from __future__ import annotations

from proxy.api.v2 import definition_pb2 as pb
from proxy.brokers import TopicNotFound
from proxy.processor.consumer import UnknownBroker
from proxy.remoting.answers import BrokerError, refuses_filter
from proxy.remoting.client import RemotingError
from proxy.remoting.codes import ResponseCode
from proxy.security.guard import DenialKind, Denied

Code = pb.Code

# The Apache proxy words an error raised past its request checks (by its processor) with
# the exception's Java class first; clients see that text, so this proxy words those alike.
PROCESSOR_ERROR = "org.apache.rocketmq.proxy.common.ProxyException: "


class ApiError(Exception):
    """Answer the request with ``code`` and ``message`` (a RocketMQ v2 status)."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def status(self) -> pb.Status:
        return pb.Status(code=self.code, message=self.message)


def ok(message: str = "OK") -> pb.Status:
    return pb.Status(code=Code.OK, message=message)


def code_name(code: int) -> str:
    try:
        return pb.Code.Name(code).lower()
    except ValueError:
        return str(code)


def route_error(topic: str, exc: Exception) -> ApiError:
    """A topic whose route could not be had."""
    if isinstance(exc, TopicNotFound):
        return ApiError(Code.TOPIC_NOT_FOUND, f"topic {topic!r} not found")
    return ApiError(Code.INTERNAL_SERVER_ERROR, f"no route for {topic!r}: {exc}")


def receive_error(topic: str, exc: Exception) -> ApiError:
    """A poll that failed: a filter the broker could not parse is the broker's answer, as
    the Apache proxy passes it on (no code of its own maps it); else the topic's route."""
    if refuses_filter(exc):
        return ApiError(Code.INTERNAL_SERVER_ERROR, exc.remark or "")
    return route_error(topic, exc)


def denied_error(denied: Denied) -> ApiError:
    """A request the guard refused: bad or missing credentials are UNAUTHORIZED (the
    clients raise UnauthorizedException), a resource the user may not use is FORBIDDEN
    (ForbiddenException)."""
    if denied.kind is DenialKind.UNAUTHENTICATED:
        return ApiError(Code.UNAUTHORIZED, denied.message)
    return ApiError(Code.FORBIDDEN, denied.message)


_SEND_CODES: dict[int, Code] = {
    ResponseCode.TOPIC_NOT_EXIST: Code.TOPIC_NOT_FOUND,
    ResponseCode.LMQ_QUOTA_EXCEEDED: Code.LITE_TOPIC_QUOTA_EXCEEDED,
    ResponseCode.MESSAGE_ILLEGAL: Code.BAD_REQUEST,
    ResponseCode.INVALID_PARAMETER: Code.BAD_REQUEST,
    ResponseCode.NO_PERMISSION: Code.FORBIDDEN,
    ResponseCode.SYSTEM_BUSY: Code.TOO_MANY_REQUESTS,
}

# A handle the broker refuses is invalid for the client, whatever the broker's reason.
_ACK_CODES: dict[int, Code] = {
    ResponseCode.NO_MESSAGE: Code.INVALID_RECEIPT_HANDLE,
    ResponseCode.MESSAGE_ILLEGAL: Code.INVALID_RECEIPT_HANDLE,
    ResponseCode.INVALID_PARAMETER: Code.INVALID_RECEIPT_HANDLE,
    ResponseCode.TOPIC_NOT_EXIST: Code.TOPIC_NOT_FOUND,
}


def send_error(broker: str, error: RemotingError | None) -> ApiError:
    """A send no broker took: the last broker's refusal, or a timeout."""
    if error is None:
        return ApiError(Code.INTERNAL_SERVER_ERROR, "no broker could take it")
    if isinstance(error, BrokerError):
        return ApiError(
            _SEND_CODES.get(error.code, Code.INTERNAL_SERVER_ERROR), f"{broker}: {error.remark}"
        )
    return ApiError(Code.PROXY_TIMEOUT, f"{broker}: {error}")


def ack_error(broker: str, error: RemotingError) -> ApiError:
    """A failed ack, invisible-time change or dead-letter forward: a refused handle is
    invalid; a broker that does not answer is a timeout."""
    if isinstance(error, UnknownBroker):
        return ApiError(Code.INVALID_RECEIPT_HANDLE, str(error))
    if isinstance(error, BrokerError):
        return ApiError(
            _ACK_CODES.get(error.code, Code.INTERNAL_SERVER_ERROR), f"{broker}: {error.remark}"
        )
    return ApiError(Code.PROXY_TIMEOUT, f"{broker}: {error}")


def dead_letter_error(broker: str, error: RemotingError) -> ApiError:
    """A forward to the dead-letter queue that failed: the broker's error is the proxy's
    (the client's handle was good), a broker that does not answer is a timeout."""
    if isinstance(error, UnknownBroker):
        return ApiError(Code.INVALID_RECEIPT_HANDLE, str(error))
    if isinstance(error, BrokerError):
        return ApiError(Code.INTERNAL_SERVER_ERROR, f"{broker}: {error.remark}")
    return ApiError(Code.PROXY_TIMEOUT, f"{broker}: {error}")


def recall_error(broker: str, error: RemotingError) -> ApiError:
    """A recall the broker refused: an unknown, delivered or already recalled message is
    the client's handle going stale (the Apache proxy passes the broker's answer on)."""
    if isinstance(error, BrokerError):
        if error.code == ResponseCode.TOPIC_NOT_EXIST:
            return ApiError(Code.TOPIC_NOT_FOUND, f"{broker}: {error.remark}")
        if error.code == ResponseCode.NO_PERMISSION:  # recallMessageEnable=false
            return ApiError(Code.FORBIDDEN, f"{broker}: {error.remark}")
        if error.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
            return ApiError(Code.NOT_IMPLEMENTED, f"{broker} cannot recall (RocketMQ < 5.3.2)")
        return ApiError(Code.BAD_REQUEST, f"{broker}: {error.remark}")
    return ApiError(Code.PROXY_TIMEOUT, f"{broker}: {error}")


def lite_subscription_error(broker: str, error: RemotingError) -> ApiError:
    """A LITE_SUBSCRIPTION_CTL a broker refused or did not answer: over the broker's quota
    is the code the lite consumers raise LiteSubscriptionQuotaExceededException for (as the
    Apache proxy maps it); a group that may not consume is forbidden."""
    if isinstance(error, BrokerError):
        if error.code == ResponseCode.LITE_SUBSCRIPTION_QUOTA_EXCEEDED:
            return ApiError(Code.LITE_SUBSCRIPTION_QUOTA_EXCEEDED, f"{broker}: {error.remark}")
        if error.code == ResponseCode.LMQ_QUOTA_EXCEEDED:
            return ApiError(Code.LITE_TOPIC_QUOTA_EXCEEDED, f"{broker}: {error.remark}")
        if error.code == ResponseCode.TOPIC_NOT_EXIST:
            return ApiError(Code.TOPIC_NOT_FOUND, f"{broker}: {error.remark}")
        if error.code in (ResponseCode.ILLEGAL_OPERATION, ResponseCode.NO_PERMISSION):
            return ApiError(Code.FORBIDDEN, f"{broker}: {error.remark}")
        if error.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
            return ApiError(Code.NOT_IMPLEMENTED, f"{broker} has no lite topics (RocketMQ < 5.5)")
        return ApiError(Code.INTERNAL_SERVER_ERROR, f"{broker}: {error.remark}")
    return ApiError(Code.PROXY_TIMEOUT, f"{broker}: {error}")
