"""SQL92 message filters: RocketMQ's selector language, parsed and evaluated as a 5.5.0 broker
does for a POP_MESSAGE whose ``expType`` is ``SQL92``.

    f = Sql92Filter.parse("region IN ('eu', 'us') AND price BETWEEN 10 AND 99.5")
    f.matches({"region": "eu", "price": "12"})  # True

The language (keywords case-insensitive):

* comparisons ``=``, ``<>``, ``>``, ``>=``, ``<``, ``<=``; ``BETWEEN a AND b`` and
  ``NOT BETWEEN a AND b``; ``IN ('a', 'b')`` and ``NOT IN (...)`` (strings only);
  ``IS NULL``, ``IS NOT NULL``; ``CONTAINS``, ``STARTSWITH``, ``ENDSWITH`` and their ``NOT``
  forms (a string literal on the right);
* ``AND``, ``OR``, ``NOT``, parentheses, unary ``+`` and ``-``;
* literals: integers (``0`` or no leading zero, an optional ``L``), decimals (``1.5``, ``.5``,
  ``5.``, ``1E3``), ``'strings'`` (``''`` is a quote), ``TRUE``, ``FALSE``, ``NULL``;
* identifiers ``[A-Za-z_$][A-Za-z0-9_$]*``: message property names (user properties and
  system ones such as ``TAGS`` or ``KEYS``); ``--`` line and ``/* */`` block comments.

The broker's rules, kept here because filters behave by them (``tests/unit/test_stub_sql92.py``
pins each one):

* A property's value is a string; a property that is absent is NULL. A comparison with NULL
  is unknown (not TRUE), and a message matches only when the expression is TRUE: ``a <> 1`` does
  not match a message without ``a``. ``AND``, ``OR`` and ``NOT`` use three-valued logic.
  ``'x' = a`` with ``a`` absent is FALSE rather than unknown (the broker only treats a NULL
  *left* side as unknown), so ``'x' <> a`` matches such a message.
* A comparison of a property with a number converts the property's text to the number's
  type: a Java int for an integer literal in the int range, a long above it, a double for a
  decimal literal (so ``a > 5`` with ``a`` = ``'5.5'`` cannot convert). Text that does not
  convert makes the broker's evaluation fail, and a failed evaluation is no match: the whole
  expression, not just that comparison (``NOT (a > 5)`` does not match ``a`` = ``'x'``
  either). ``AND`` and ``OR`` stop at their left side when it decides, so ``b = 1 OR a > 5``
  matches ``b`` = ``'1'`` whatever ``a`` holds. Two properties compared by ``<`` and the like
  are both converted to doubles.
* ``CONTAINS`` and its kin are FALSE (never unknown) for an absent property, and FALSE, in
  both forms, for an empty search string.
* Refused when parsed: ``=``/``<>`` with a NULL literal (use ``IS NULL``), ``>`` and its kin
  with a string or boolean literal or a boolean operand, ``IN`` on anything but a property,
  ``BETWEEN`` with a NULL bound or with literal bounds in the wrong order, a decimal literal
  of 0 (the broker refuses decimal literals below Double.MIN_VALUE) and an integer literal
  outside the long range; and, as the broker's grammar has it, NOT binds tighter than any
  comparison (``NOT a = 'x'`` compares ``NOT a`` with ``'x'``; ``NOT (a = 'x')`` is meant).
* Whatever follows a complete expression is ignored, as the broker's parser does not ask for
  the end of the text: ``a = 1 b`` is ``a = 1`` (only the token just after it must be one).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from proxy.remoting.filter import FilterExpressionError

__all__ = ["Sql92Error", "Sql92Filter"]

Value = bool | int | float | str | None
Eval = Callable[[Mapping[str, str]], Value]

_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_DOUBLE_MIN_VALUE: Final = 5e-324  # Java's Double.MIN_VALUE: the least positive double


class Sql92Error(FilterExpressionError):
    """A SQL92 expression the broker cannot parse."""


class _Unconvertible(Exception):
    """An evaluation the broker abandons (a value that does not convert): no match."""


class _Long(int):
    """A Java long: an integer literal outside the int range. Conversions of a property's
    text follow the type of the number it is compared with."""

    __slots__ = ()


# -- Java's conversions ------------------------------------------------------------------------


def _java_integer(text: str, low: int, high: int) -> int:
    """Integer.parseInt / Long.parseLong: an optional sign, decimal digits, in range."""
    digits = text[1:] if text[:1] in ("+", "-") else text
    if not digits or not digits.isdecimal():
        raise _Unconvertible(text)
    value = int(text)
    if not low <= value <= high:
        raise _Unconvertible(text)
    return value


_JAVA_DOUBLE = re.compile(
    r"[+-]?(?:NaN|Infinity|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?[fFdD]?)", re.ASCII
)
_JAVA_HEX_DOUBLE = re.compile(
    r"[+-]?0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)[pP][+-]?\d+[fFdD]?", re.ASCII
)


def _java_double(text: str) -> float:
    """Double.valueOf: the text trimmed of control characters and spaces, then a Java
    floating-point literal (a type suffix allowed), NaN or Infinity."""
    start, end = 0, len(text)
    while start < end and text[start] <= " ":
        start += 1
    while end > start and text[end - 1] <= " ":
        end -= 1
    body = text[start:end]
    if _JAVA_DOUBLE.fullmatch(body):
        return float(body.rstrip("fFdD"))
    if _JAVA_HEX_DOUBLE.fullmatch(body):
        return float.fromhex(body.rstrip("fFdD"))
    raise _Unconvertible(text)


def _double_compare(a: float, b: float) -> int:
    """Double.compare: NaN above everything and equal to itself, -0.0 below 0.0."""
    if a < b:
        return -1
    if a > b:
        return 1
    a_nan, b_nan = a != a, b != b
    if a_nan or b_nan:
        return int(a_nan) - int(b_nan)
    sign_a, sign_b = math.copysign(1.0, a), math.copysign(1.0, b)
    return (sign_a > sign_b) - (sign_a < sign_b)


def _compare(lv: Value, rv: Value) -> int:
    """The broker's comparison of two non-NULL values: a value of one type is converted to
    the other's where the broker converts (a string to the number, boolean or type on the
    other side); values of types it does not convert compare as "less" (-1)."""
    lt, rt = type(lv), type(rv)
    if lt is not rt:
        if lt is bool:
            if rt is str:  # the broker fails here (a cast of the boolean to a string)
                raise _Unconvertible(rv)
            return -1
        if lt is int or lt is _Long:
            if rt is float:
                lv = float(lv)  # type: ignore[arg-type]
            elif rt is str:
                assert isinstance(rv, str)
                low, high = (_INT_MIN, _INT_MAX) if lt is int else (_LONG_MIN, _LONG_MAX)
                rv = _java_integer(rv, low, high)
            elif rt is not int and rt is not _Long:
                return -1
        elif lt is float:
            if rt is int or rt is _Long:
                rv = float(rv)  # type: ignore[arg-type]
            elif rt is str:
                assert isinstance(rv, str)
                rv = _java_double(rv)
            else:
                return -1
        elif lt is str:
            assert isinstance(lv, str)
            if rt is bool:
                lv = lv.lower() == "true"
            elif rt is int:
                lv = _java_integer(lv, _INT_MIN, _INT_MAX)
            elif rt is _Long:
                lv = _java_integer(lv, _LONG_MIN, _LONG_MAX)
            elif rt is float:
                lv = _java_double(lv)
            else:
                return -1
        else:
            return -1
    if isinstance(lv, float) or isinstance(rv, float):
        return _double_compare(float(lv), float(rv))  # type: ignore[arg-type]
    return (lv > rv) - (lv < rv)  # type: ignore[operator]


# -- the syntax tree ---------------------------------------------------------------------------

_CONST, _BOOL_CONST, _PROP, _BOOL, _OTHER = "const", "bool-const", "prop", "bool", "other"


@dataclass(frozen=True, slots=True)
class _Node:
    """A parsed (sub)expression: how to evaluate it, and what the parser's checks need to
    know of it (a literal and its value, a property, a boolean expression)."""

    ev: Eval
    kind: str
    value: Value = None  # a literal's value

    @property
    def constant(self) -> bool:
        return self.kind in (_CONST, _BOOL_CONST)

    @property
    def boolean(self) -> bool:
        return self.kind in (_BOOL, _BOOL_CONST)


def _constant(value: Value) -> _Node:
    kind = _BOOL_CONST if value is None or type(value) is bool else _CONST
    return _Node(lambda _props: value, kind, value)


def _property(name: str) -> _Node:
    return _Node(lambda props: props.get(name), _PROP)


def _boolean(ev: Eval) -> _Node:
    return _Node(ev, _BOOL)


def _as_boolean(node: _Node) -> _Node:
    """An operand of AND, OR or NOT, or the whole expression: a property stands for a
    boolean (which a property's text never is: FALSE, or unknown when absent)."""
    if node.boolean:
        return node
    if node.kind == _PROP:
        get = node.ev

        def cast(props: Mapping[str, str]) -> Value:
            value = get(props)
            return None if value is None else value is True

        return _boolean(cast)
    raise Sql92Error("expression will not result in a boolean value")


def _not(node: _Node) -> _Node:
    ev = node.ev

    def negation(props: Mapping[str, str]) -> Value:
        value = ev(props)
        return None if value is None else not value

    return _boolean(negation)


def _and(left: _Node, right: _Node) -> _Node:
    lev, rev = left.ev, right.ev

    def conjunction(props: Mapping[str, str]) -> Value:
        lv = lev(props)
        if lv is False:
            return False
        rv = rev(props)
        if rv is False:
            return False
        return None if lv is None or rv is None else True

    return _boolean(conjunction)


def _or(left: _Node, right: _Node) -> _Node:
    lev, rev = left.ev, right.ev

    def disjunction(props: Mapping[str, str]) -> Value:
        lv = lev(props)
        if lv is True:
            return True
        rv = rev(props)
        if rv is True:
            return True
        return None if lv is None or rv is None else False

    return _boolean(disjunction)


def _negate(node: _Node) -> _Node:
    ev = node.ev

    def minus(props: Mapping[str, str]) -> Value:
        value = ev(props)
        if type(value) is _Long:
            return _Long(-value)
        if type(value) is int or type(value) is float:
            return -value
        return None  # NULL, a string or a boolean

    return _Node(minus, _OTHER)


def _equal_unchecked(left: _Node, right: _Node) -> _Node:
    lev, rev = left.ev, right.ev

    def equal(props: Mapping[str, str]) -> Value:
        lv, rv = lev(props), rev(props)
        if lv is None:
            return True if rv is None else None
        if rv is None:
            return False
        return _compare(lv, rv) == 0

    return _boolean(equal)


def _equal(left: _Node, right: _Node) -> _Node:
    for operand in (left, right):
        if operand.constant and operand.value is None:
            raise Sql92Error("NULL cannot be compared with '=' or '<>': use IS NULL")
    if left.constant and right.constant and left.boolean and not right.boolean:
        raise Sql92Error("a boolean literal cannot be compared with another literal")
    return _equal_unchecked(left, right)


_ORDERINGS: dict[str, Callable[[int], bool]] = {
    ">": lambda c: c > 0,
    ">=": lambda c: c >= 0,
    "<": lambda c: c < 0,
    "<=": lambda c: c <= 0,
}


def _ordering(op: str, left: _Node, right: _Node) -> _Node:
    for operand in (left, right):
        if operand.boolean or (operand.constant and not _is_number(operand.value)):
            raise Sql92Error(f"only numbers can be compared with '{op}'")
    lev, rev, holds = left.ev, right.ev, _ORDERINGS[op]

    def ordered(props: Mapping[str, str]) -> Value:
        lv = lev(props)
        if lv is None:
            return None
        rv = rev(props)
        if rv is None:
            return None
        if type(lv) is str and type(rv) is str:
            lv, rv = _java_double(lv), _java_double(rv)
        return holds(_compare(lv, rv))

    return _boolean(ordered)


def _is_number(value: Value) -> bool:
    return type(value) in (int, _Long, float)


def _between(value: _Node, low: _Node, high: _Node, negated: bool) -> _Node:
    if negated:
        return _or(_ordering("<", value, low), _ordering(">", value, high))
    if low.constant and high.constant:
        if low.value is None or high.value is None:
            raise Sql92Error("the bounds of BETWEEN cannot be NULL")
        try:
            wrong_order = _compare(high.value, low.value) < 0
        except _Unconvertible:
            raise Sql92Error("the bounds of BETWEEN cannot be compared") from None
        if wrong_order:
            raise Sql92Error("the low bound of BETWEEN must not exceed the high bound")
    return _and(_ordering(">=", value, low), _ordering("<=", value, high))


def _in(left: _Node, values: list[str], negated: bool) -> _Node:
    if left.kind != _PROP:
        raise Sql92Error("IN applies to a property only")
    ev, members = left.ev, frozenset(values)

    def member(props: Mapping[str, str]) -> Value:
        value = ev(props)
        if type(value) is not str:
            return None
        return (value in members) != negated

    return _boolean(member)


_STRING_TESTS: dict[str, Callable[[str, str], bool]] = {
    "CONTAINS": lambda value, search: search in value,
    "STARTSWITH": str.startswith,
    "ENDSWITH": str.endswith,
}


def _string_test(op: str, left: _Node, search: str, negated: bool) -> _Node:
    ev, test = left.ev, _STRING_TESTS[op]

    def tested(props: Mapping[str, str]) -> Value:
        if not search:
            return False
        value = ev(props)
        if type(value) is not str:
            return False
        return test(value, search) != negated

    return _boolean(tested)


# -- tokens ------------------------------------------------------------------------------------

_KEYWORDS = frozenset(
    {"NOT", "AND", "OR", "BETWEEN", "IN", "TRUE", "FALSE", "NULL", "IS", "CONTAINS",
     "STARTSWITH", "ENDSWITH"}
)  # fmt: skip
# What the broker's lexer skips: blanks, "--" comments that end in a line break, /* */.
_SKIP = re.compile(r"(?:[ \t\n\r\f]+|--[^\n\r]*(?:\r\n|\n|\r)|/\*[^*]*\*+(?:[^/*][^*]*\*+)*/)+")
_FLOAT = re.compile(r"(?:\d+\.\d*|\.\d+)(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+", re.ASCII)
_DECIMAL = re.compile(r"0|[1-9]\d*[lL]?", re.ASCII)
_STRING = re.compile(r"'(?:''|[^'])*'")
_IDENT = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*", re.ASCII)
_OPERATOR = re.compile(r"<>|<=|>=|[=<>(),+-]")

_EOF = "<EOF>"


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # a keyword, an operator, "ID", "INT", "FLOAT", "STRING" or _EOF
    text: str
    pos: int


class _Lexer:
    """Tokens on demand: like the broker's parser, this one reads only as far as it looks,
    so text after a complete expression is never tokenized beyond what a decision needs."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.ahead: list[_Token] = []

    def peek(self, n: int = 1) -> _Token:
        while len(self.ahead) < n:
            self.ahead.append(self._scan())
        return self.ahead[n - 1]

    def take(self) -> _Token:
        token = self.peek()
        del self.ahead[0]
        return token

    def _scan(self) -> _Token:
        text = self.text
        skipped = _SKIP.match(text, self.pos)
        if skipped:
            self.pos = skipped.end()
        pos = self.pos
        if pos >= len(text):
            return _Token(_EOF, "", pos)
        kind = ""
        match = None
        number = [m for m in (_FLOAT.match(text, pos), _DECIMAL.match(text, pos)) if m]
        if number:
            match = max(number, key=lambda m: m.end())  # the longest, as the broker's lexer
            kind = "FLOAT" if match.re is _FLOAT else "INT"
        elif match := _STRING.match(text, pos):
            kind = "STRING"
        elif match := _IDENT.match(text, pos):
            upper = match.group().upper()
            kind = upper if upper in _KEYWORDS else "ID"
        elif match := _OPERATOR.match(text, pos):
            kind = match.group()
        if match is None:
            raise Sql92Error(f"unexpected character {text[pos]!r} at {pos}")
        self.pos = match.end()
        return _Token(kind, match.group(), pos)


# -- the parser --------------------------------------------------------------------------------

_ORDERING_OPS = frozenset(_ORDERINGS)
_NOT_FOLLOWERS = frozenset({"CONTAINS", "STARTSWITH", "ENDSWITH", "BETWEEN", "IN"})


class _Parser:
    """Recursive descent over the broker's grammar, loosest first: OR, AND, equality
    (``=``, ``<>``, ``IS [NOT] NULL``), comparison (the rest), unary (``+``, ``-``, ``NOT``),
    primary (literal, property, parentheses)."""

    def __init__(self, text: str) -> None:
        self.lexer = _Lexer(text)

    def _expect(self, kind: str) -> _Token:
        token = self.lexer.take()
        if token.kind != kind:
            raise self._unexpected(token, kind)
        return token

    @staticmethod
    def _unexpected(token: _Token, wanted: str = "") -> Sql92Error:
        found = "the end" if token.kind == _EOF else repr(token.text)
        want = f", expected {wanted}" if wanted else ""
        return Sql92Error(f"unexpected {found} at {token.pos}{want}")

    def selector(self) -> _Node:
        return _as_boolean(self._or())

    def _or(self) -> _Node:
        left = self._and()
        while self.lexer.peek().kind == "OR":
            self.lexer.take()
            left = _or(_as_boolean(left), _as_boolean(self._and()))
        return left

    def _and(self) -> _Node:
        left = self._equality()
        while self.lexer.peek().kind == "AND":
            self.lexer.take()
            left = _and(_as_boolean(left), _as_boolean(self._equality()))
        return left

    def _equality(self) -> _Node:
        left = self._comparison()
        while True:
            kind = self.lexer.peek().kind
            if kind == "=":
                self.lexer.take()
                left = _equal(left, self._comparison())
            elif kind == "<>":
                self.lexer.take()
                left = _not(_equal(left, self._comparison()))
            elif kind == "IS":
                self.lexer.take()
                negated = self.lexer.peek().kind == "NOT"
                if negated:
                    self.lexer.take()
                self._expect("NULL")
                is_null = _equal_unchecked(left, _constant(None))
                left = _not(is_null) if negated else is_null
            else:
                return left

    def _comparison(self) -> _Node:
        left = self._unary()
        while True:
            token = self.lexer.peek()
            kind, negated = token.kind, False
            if kind == "NOT":
                follower = self.lexer.peek(2)
                if follower.kind not in _NOT_FOLLOWERS:
                    raise self._unexpected(
                        follower, "CONTAINS, STARTSWITH, ENDSWITH, BETWEEN or IN"
                    )
                self.lexer.take()
                kind, negated = follower.kind, True
            elif kind not in _ORDERING_OPS and kind not in _NOT_FOLLOWERS:
                return left
            self.lexer.take()
            if kind in _ORDERING_OPS:
                left = _ordering(kind, left, self._unary())
            elif kind == "BETWEEN":
                low = self._unary()
                self._expect("AND")
                left = _between(left, low, self._unary(), negated)
            elif kind == "IN":
                self._expect("(")
                values = [self._string()]
                while self.lexer.peek().kind == ",":
                    self.lexer.take()
                    values.append(self._string())
                self._expect(")")
                left = _in(left, values, negated)
            else:
                left = _string_test(kind, left, self._string(), negated)

    def _unary(self) -> _Node:
        kind = self.lexer.peek().kind
        if kind == "+":
            self.lexer.take()
            return self._unary()
        if kind == "-":
            self.lexer.take()
            return _negate(self._unary())
        if kind == "NOT":
            self.lexer.take()
            return _not(_as_boolean(self._unary()))
        return self._primary()

    def _primary(self) -> _Node:
        token = self.lexer.take()
        kind = token.kind
        if kind == "(":
            inner = self._or()
            self._expect(")")
            return inner
        if kind == "ID":
            return _property(token.text)
        if kind == "STRING":
            return _constant(_unquote(token.text))
        if kind == "INT":
            return _constant(_integer_literal(token.text))
        if kind == "FLOAT":
            return _constant(_decimal_literal(token.text))
        if kind in ("TRUE", "FALSE"):
            return _constant(kind == "TRUE")
        if kind == "NULL":
            return _constant(None)
        raise self._unexpected(token, "a literal, a property or '('")

    def _string(self) -> str:
        return _unquote(self._expect("STRING").text)


def _unquote(text: str) -> str:
    return text[1:-1].replace("''", "'")


def _integer_literal(text: str) -> int:
    value = int(text.rstrip("lL"))
    if value > _LONG_MAX:
        raise Sql92Error(f"integer {text} is out of the long range")
    return value if value <= _INT_MAX else _Long(value)


def _decimal_literal(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise Sql92Error(f"{text} is greater than the largest double")
    if value < _DOUBLE_MIN_VALUE:
        raise Sql92Error(f"{text} is less than the least positive double")
    return value


# -- the filter --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sql92Filter:
    """A parsed SQL92 expression; ``matches`` evaluates it against a message's properties."""

    expression: str
    _root: Eval

    @classmethod
    def parse(cls, text: str) -> Sql92Filter:
        """Parse ``text``; raises Sql92Error (a FilterExpressionError) when the broker would
        refuse it. Parsed filters are cached, as the broker caches them."""
        return _parse(text)

    def matches(self, properties: Mapping[str, str]) -> bool:
        """Whether the expression is TRUE for a message with these properties (not FALSE,
        not unknown, and its evaluation did not fail on a value that does not convert)."""
        try:
            return self._root(properties) is True
        except _Unconvertible:
            return False


@functools.lru_cache(maxsize=256)
def _parse(text: str) -> Sql92Filter:
    return Sql92Filter(text, _Parser(text).selector().ev)
