"""Typed access to a request's custom header, with the errors a broker answers."""

from __future__ import annotations

from proxy.remoting.codes import ResponseCode
from proxy.remoting.command import RemotingCommand

_REQUIRED = object()


class RequestError(Exception):
    """Answer the request with ``code`` and ``remark`` instead of serving it."""

    def __init__(self, code: int, remark: str) -> None:
        super().__init__(remark)
        self.code = code
        self.remark = remark


class Fields:
    """A request's extFields. A missing required field or a malformed number raises
    ``RequestError(INVALID_PARAMETER)`` naming the field."""

    __slots__ = ("_code", "_fields")

    def __init__(self, cmd: RemotingCommand, aliases: dict[str, str] | None = None) -> None:
        fields = cmd.ext_fields or {}
        if aliases:
            fields = {aliases.get(key, key): value for key, value in fields.items()}
        self._fields = fields
        self._code = cmd.code

    def str(self, name: str, default=_REQUIRED) -> str:
        value = self._fields.get(name)
        if value is None or value == "":
            if default is _REQUIRED:
                raise RequestError(
                    ResponseCode.INVALID_PARAMETER,
                    f"the custom field <{name}> is null (request code {self._code})",
                )
            return default
        return value

    def int(self, name: str, default=_REQUIRED) -> int:
        value = self.str(name, None if default is not _REQUIRED else _REQUIRED)
        if value is None:
            return default
        try:
            return int(value)
        except ValueError:
            raise RequestError(
                ResponseCode.INVALID_PARAMETER,
                f"the custom field <{name}> is not a number: {value!r}",
            ) from None

    def bool(self, name: str, default: bool = False) -> bool:
        value = self._fields.get(name)
        return default if value is None else value.lower() == "true"
