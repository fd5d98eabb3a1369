"""Request handling shared by the broker and the name server: the error a handler raises
instead of serving, and the dispatch that answers it as a RocketMQ server does."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

from proxy.remoting.codes import ResponseCode
from proxy.remoting.command import RemotingCommand
from proxy.remoting.connection import RemotingConnection
from proxy.remoting.headers import HeaderError

R = TypeVar("R")


class RequestError(Exception):
    """Answer the request with ``code`` and ``remark`` instead of serving it."""

    def __init__(self, code: int, remark: str) -> None:
        super().__init__(remark)
        self.code = code
        self.remark = remark


def dispatch(
    handlers: Mapping[int, Callable[[RemotingCommand, RemotingConnection], R]],
    cmd: RemotingCommand,
    conn: RemotingConnection,
) -> R | RemotingCommand:
    """Serve ``cmd`` with its code's handler. An unknown code, a ``RequestError`` and a
    header field missing or malformed (``HeaderError``, answered INVALID_PARAMETER) get
    the answer a RocketMQ server gives."""
    handler = handlers.get(cmd.code)
    if handler is None:
        return cmd.make_response(
            ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
            remark=f" request type {cmd.code} not supported",
        )
    try:
        return handler(cmd, conn)
    except RequestError as err:
        return cmd.make_response(err.code, remark=err.remark)
    except HeaderError as err:
        return cmd.make_response(
            ResponseCode.INVALID_PARAMETER, remark=f"{err} (request code {cmd.code})"
        )
