"""The error a broker answers instead of serving a request."""

from __future__ import annotations


class RequestError(Exception):
    """Answer the request with ``code`` and ``remark`` instead of serving it."""

    def __init__(self, code: int, remark: str) -> None:
        super().__init__(remark)
        self.code = code
        self.remark = remark
