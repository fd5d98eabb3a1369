"""Status codes of the gRPC API and the error that carries one to the client."""

from __future__ import annotations

from proxy.api.v2 import definition_pb2 as pb

Code = pb.Code


class ApiError(Exception):
    """Answer the request with ``code`` and ``message`` (a RocketMQ v2 status)."""

    def __init__(self, code: int, message: str) -> None:
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
