"""Tag filter expressions: ``*`` (everything) or ``tagA || tagB``.

The proxy validates clients' expressions with it and the broker stub filters with it.
"""

from __future__ import annotations

from dataclasses import dataclass

EXPRESSION_TYPE_TAG = "TAG"
EXPRESSION_TYPE_SQL92 = "SQL92"


class FilterExpressionError(ValueError):
    """The expression cannot be parsed."""


@dataclass(frozen=True, slots=True)
class TagFilter:
    """A parsed tag expression; ``tags`` None means every message matches."""

    tags: frozenset[str] | None = None

    @classmethod
    def parse(cls, expression: str | None, expression_type: str | None = None) -> TagFilter:
        if expression_type and expression_type.upper() != EXPRESSION_TYPE_TAG:
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
