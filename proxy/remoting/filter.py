"""Filter expressions: their two types, and tag expressions: ``*`` (everything) or
``tagA || tagB``.

The proxy validates clients' tag expressions with it and the broker stub filters with it.
SQL92 expressions go to the brokers as they are: a broker parses and applies them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class ExpressionType(StrEnum):
    """A subscription's filter type, as the remoting headers spell it (``expType``)."""

    TAG = "TAG"
    SQL92 = "SQL92"


class FilterExpressionError(ValueError):
    """The expression cannot be parsed."""


@dataclass(frozen=True, slots=True)
class TagFilter:
    """A parsed tag expression; ``tags`` None means every message matches."""

    tags: frozenset[str] | None = None

    @classmethod
    def parse(cls, expression: str | None, expression_type: str | None = None) -> TagFilter:
        if expression_type and expression_type.upper() != ExpressionType.TAG:
            raise FilterExpressionError(f"expression type {expression_type} is not supported")
        text = (expression or "").strip()
        if text in ("", "*"):
            return cls(None)
        # Empty pieces are skipped, as RocketMQ's FilterAPI does ("a || " means "a").
        tags = [tag for tag in (piece.strip() for piece in text.split("||")) if tag]
        if not tags:
            raise FilterExpressionError(f"tag expression {expression!r} names no tag")
        if any("|" in tag for tag in tags):
            raise FilterExpressionError(f"tag expression {expression!r} has a stray '|'")
        if "*" in tags:
            return cls(None)
        return cls(frozenset(tags))

    def matches(self, tag: str | None) -> bool:
        return self.tags is None or (tag is not None and tag in self.tags)


MATCH_ALL = TagFilter(None)
