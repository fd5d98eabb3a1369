"""Reading what a broker writes with fastjson where it is not JSON: a ``Map`` keyed by an
object (``{{"brokerName":"b","queueId":0,"topic":"T"}:{...}}``, a ``Map<MessageQueue, ...>``)
or by a number written bare (``{0:"addr"}``). Keys that are objects or arrays come back as
tuples of their (key, value) pairs or items, so that they can key a dict; everything else is
as ``json.loads`` gives it. A key written twice keeps its last value, and its last place
among the object's keys (``field``: a broker reads a field from the last key that names it).

The text may come from anyone who reaches the remoting port, before any authentication (a
heartbeat's or a queue lock's body): whatever it is, ``loads`` answers a value or raises
``FastjsonError``, never another exception (a nesting past ``MAX_DEPTH`` would otherwise
exhaust the stack with a RecursionError, an object key holding keys of two types fail
``sorted`` with a TypeError, bytes that are not UTF-8 a UnicodeDecodeError)."""

from __future__ import annotations

import json
import re
from typing import Any

_WHITESPACE = re.compile(r"[ \t\n\r]*")
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][-+]?\d+)?")
_decoder = json.JSONDecoder()
# Objects and arrays nested deeper than this are refused. What brokers and clients write
# nests four or five deep (a route's broker addresses, a heartbeat's subscriptions' tags).
MAX_DEPTH = 64


class FastjsonError(ValueError):
    """The text is not what fastjson writes."""


def loads(text: str | bytes) -> Any:
    """The value ``text`` holds; FastjsonError for anything that is not one."""
    try:
        if isinstance(text, bytes):
            text = text.decode()
        value, end = _value(text, _skip(text, 0), 0)
    except FastjsonError:
        raise
    except (ValueError, RecursionError) as exc:  # not UTF-8, a bad string, a huge number
        raise FastjsonError(f"{type(exc).__name__}: {exc}") from None
    if _skip(text, end) != len(text):
        raise FastjsonError(f"unexpected text at {end}")
    return value


def field(obj: dict[Any, Any], *names: str) -> Any:
    """The value a broker's fastjson2 reads into a field known by ``names`` (its name and
    its ``alternateNames``): of those keys present, the one written last, since each key
    read sets the field again; None when none is. ``loads`` keeps an object's keys in the
    order of their last occurrence, so a repeated key counts where it was last written."""
    found = None
    for key, value in obj.items():
        if key in names:
            found = value
    return found


def _skip(text: str, at: int) -> int:
    match = _WHITESPACE.match(text, at)
    assert match is not None  # the pattern matches the empty string
    return match.end()


def _value(text: str, at: int, depth: int) -> tuple[Any, int]:
    if at >= len(text):
        raise FastjsonError("unexpected end")
    char = text[at]
    if char in "{[":
        if depth >= MAX_DEPTH:
            raise FastjsonError(f"nested deeper than {MAX_DEPTH} at {at}")
        if char == "{":
            return _object(text, at + 1, depth + 1)
        return _array(text, at + 1, depth + 1)
    if char == '"':
        return _decoder.raw_decode(text, at)
    match = _NUMBER.match(text, at)
    if match:
        number = match.group()
        return (float(number) if any(c in number for c in ".eE") else int(number)), match.end()
    for word, value in (("true", True), ("false", False), ("null", None)):
        if text.startswith(word, at):
            return value, at + len(word)
    raise FastjsonError(f"unexpected {char!r} at {at}")


def _object(text: str, at: int, depth: int) -> tuple[dict[Any, Any], int]:
    out: dict[Any, Any] = {}
    at = _skip(text, at)
    if text.startswith("}", at):
        return out, at + 1
    while True:
        key, at = _value(text, _skip(text, at), depth)
        at = _skip(text, at)
        if not text.startswith(":", at):
            raise FastjsonError(f"':' expected at {at}")
        value, at = _value(text, _skip(text, at + 1), depth)
        key = _hashable(key)
        out.pop(key, None)  # a repeated key: its last value, in its last place (``field``)
        out[key] = value
        at = _skip(text, at)
        if text.startswith("}", at):
            return out, at + 1
        if not text.startswith(",", at):
            raise FastjsonError(f"',' or '}}' expected at {at}")
        at += 1


def _array(text: str, at: int, depth: int) -> tuple[list[Any], int]:
    out: list[Any] = []
    at = _skip(text, at)
    if text.startswith("]", at):
        return out, at + 1
    while True:
        value, at = _value(text, _skip(text, at), depth)
        out.append(value)
        at = _skip(text, at)
        if text.startswith("]", at):
            return out, at + 1
        if not text.startswith(",", at):
            raise FastjsonError(f"',' or ']' expected at {at}")
        at += 1


def _hashable(key: Any) -> Any:
    """An object or array key as a tuple, its pairs in key order: one key for one object
    whatever the order it was written in."""
    if isinstance(key, dict):
        try:
            return tuple(sorted((k, _hashable(v)) for k, v in key.items()))
        except TypeError:  # keys that do not compare: fastjson writes an object's as text
            raise FastjsonError("an object key whose own keys are of mixed types") from None
    if isinstance(key, list):
        return tuple(_hashable(v) for v in key)
    return key
