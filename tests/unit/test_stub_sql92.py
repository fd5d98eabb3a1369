"""The broker stub's SQL92 filters (broker_stub/sql92.py) and its groupRetryPolicy.

The evaluator follows a RocketMQ 5.5.0 broker: about 180 expressions (these tests' kinds,
the surprising cases among them: ``'x' <> a`` matching a message without ``a``, ``a > 5``
refusing ``'5.5'``, a failed conversion failing the whole expression, ``a > 0.0`` refused,
text after a complete expression ignored) were popped from a real 5.5.0 broker and from the
stub over the same messages, and every answer agreed. Then the stub broker: a SQL92 pop
returns only the matching messages, a malformed expression is answered 23, NOTIFICATION
ignores the filter; and a group's retry policy round trip.
"""

from __future__ import annotations

import asyncio
import ipaddress

import orjson
import pytest

from broker_stub import BrokerConfig, StubCluster
from broker_stub.consume import SUBSCRIPTION_PARSE_FAILED_REMARK, pop_filter
from broker_stub.groups import (
    GroupConfig,
    retry_policy_from_json,
)
from broker_stub.handlers import RequestError
from broker_stub.sql92 import Sql92Error, Sql92Filter
from proxy.remoting.broker_client import BrokerClient
from proxy.remoting.codes import DEFAULT_RETRY_BACKOFF_MS, RequestCode, ResponseCode
from proxy.remoting.command import RemotingCommand
from proxy.remoting.filter import MATCH_ALL, FilterExpressionError, TagFilter
from proxy.remoting.headers import NotificationHeader, NotificationResponseHeader, now_ms
from proxy.remoting.message import (
    MessageExt,
    decode_messages,
    encode_message,
    record_properties,
)
from tests.support.remoting import pop_fields


def matches(expression: str, **properties: str) -> bool:
    return Sql92Filter.parse(expression).matches(properties)


# -- the evaluator ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "value", "expected"),
    [
        ("a > 5", "10", True),
        ("a > 5", "5", False),
        ("a >= 5", "5", True),
        ("a >= 5", "4", False),
        ("a < 5", "-3", True),
        ("a < 5", "5", False),
        ("a <= 5", "5", True),
        ("a <= 5", "6", False),
        ("a = 5", "5", True),
        ("a = 5", "6", False),
        ("a <> 5", "6", True),
        ("a <> 5", "5", False),
        ("a = 4", "+4", True),  # Java's integer parse takes a sign
        ("a = 3", "\u0663", True),  # ... and any Unicode decimal digit
        ("a > 5.0", "5.5", True),
        ("a = 5.5", "5.5", True),
        ("a <> 5.5", "5.50", False),
        ("a < -2.5", "-3", True),
        ("a > -1", "0", True),
        ("a = -3", "-3", True),
        ("a > -(-5)", "10", True),
        ("+a > 5", "10", True),
        ("a = 1000.0", "1e3", True),  # a double's text: exponent, hex, NaN, blanks
        ("a = 8.0", "0x1p3", True),
        ("a > 999.0", "NaN", True),  # NaN is above every double (Double.compare)
        ("a = 7.0", " 7 ", True),
        ("a = 7", " 7 ", False),  # an int's text has no blanks
        ("a = 3000000000", "3000000000", True),  # a literal past the int range is a long
        ("a > 2147483647", "3000000000", False),  # an int literal wants an int
        ("a > 2147483646L", "2147483647", True),
        ("a > 5", "5.5", False),  # an integer literal converts the text to an integer
        ("a > 5.0", "x", False),
        ("a > .5", "1", True),
        ("a > 5.", "6", True),
        ("a > 5E0", "6", True),
    ],
)
def test_numeric_comparisons_convert_the_property_to_the_literals_type(expression, value, expected):
    assert matches(expression, a=value) is expected


@pytest.mark.parametrize(
    ("expression", "matching"),
    [
        ("a BETWEEN 1 AND 10", ["1", "7", "10"]),
        ("a NOT BETWEEN 1 AND 10", ["-3", "0", "11"]),
        ("a BETWEEN -5 AND 5", ["-3", "0", "1"]),
        ("a BETWEEN 1.0 AND 10", ["1", "7", "10"]),
        ("a BETWEEN -1 AND -5", []),  # negated bounds are not checked for their order
    ],
)
def test_between(expression, matching):
    values = ["-3", "0", "1", "7", "10", "11", "x"]
    assert [v for v in values if matches(expression, a=v)] == matching
    assert not matches(expression)  # absent: unknown, whether negated or not


def test_string_equality_and_in():
    assert matches("a = 'x'", a="x")
    assert not matches("a = 'x'", a="X")
    assert matches("a <> 'x'", a="y")
    assert not matches("a <> 'x'", a="x")
    assert matches("'x' = a", a="x")
    assert matches("a IN ('x', 'abc')", a="abc")
    assert not matches("a IN ('x', 'abc')", a="ab")
    assert matches("a NOT IN ('x', 'abc')", a="ab")
    assert not matches("a NOT IN ('x', 'abc')", a="x")
    assert matches("a IN ('10')", a="10")
    assert matches("s IN ('it''s')", s="it's")
    assert matches("s = 'it''s'", s="it's")
    assert matches("a = b", a="v", b="v")


def test_a_string_compared_with_a_boolean_literal_is_read_as_one():
    assert matches("b = TRUE", b="true")
    assert matches("b = TRUE", b="tRuE")
    assert matches("b = FALSE", b="no")
    assert matches("b <> TRUE", b="false")
    assert not matches("b = 'TRUE'", b="true")


@pytest.mark.parametrize(
    ("expression", "value", "expected"),
    [
        ("s CONTAINS 'l'", "hello", True),
        ("s CONTAINS 'z'", "hello", False),
        ("s NOT CONTAINS 'z'", "hello", True),
        ("s NOT CONTAINS 'l'", "hello", False),
        ("s STARTSWITH 'he'", "hello", True),
        ("s STARTSWITH 'lo'", "hello", False),
        ("s NOT STARTSWITH 'lo'", "hello", True),
        ("s NOT STARTSWITH 'he'", "hello", False),
        ("s ENDSWITH 'lo'", "hello", True),
        ("s ENDSWITH 'he'", "hello", False),
        ("s NOT ENDSWITH 'he'", "hello", True),
        ("s NOT ENDSWITH 'lo'", "hello", False),
        ("s CONTAINS ''", "hello", False),  # an empty search string: FALSE, both ways
        ("s NOT CONTAINS ''", "hello", False),
        ("s CONTAINS 'it''s'", "so it's", True),
    ],
)
def test_contains_startswith_endswith(expression, value, expected):
    assert matches(expression, s=value) is expected


def test_null_semantics():
    assert matches("a IS NULL")
    assert not matches("a IS NULL", a="1")
    assert matches("a IS NOT NULL", a="1")
    assert not matches("a IS NOT NULL")
    # Any comparison with an absent property is unknown, and unknown is no match, negated
    # or not.
    for expression in ("a = 1", "a <> 1", "a > 1", "a = 'x'", "a <> 'x'", "a IN ('x')",
                       "a NOT IN ('x')", "a BETWEEN 1 AND 2", "a NOT BETWEEN 1 AND 2",
                       "NOT (a = 1)"):  # fmt: skip
        assert not matches(expression), expression
    assert not matches("a = b", a="v")
    # ... except where a 5.5.0 broker decides otherwise: a NULL right side of '=' is FALSE
    # (not unknown), so its '<>' is TRUE; NULL = NULL is TRUE; CONTAINS and its kin are
    # FALSE on NULL.
    assert matches("a = b")
    assert matches("'x' <> a")
    assert not matches("'x' = a")
    assert not matches("a NOT CONTAINS 'x'")
    assert matches("NOT (a CONTAINS 'x')")
    # Three-valued logic: unknown OR TRUE is TRUE, unknown AND FALSE is FALSE.
    assert matches("a = 1 OR b = 'y'", b="y")
    assert not matches("NOT (a = 1 AND b = 'y')", b="y")
    assert matches("NOT (a = 1 AND b = 'y')", b="n")
    assert matches("(a > 5) IS NULL")
    assert not matches("NULL")


def test_logic_and_parentheses():
    assert matches("a = 'x' AND b = 'y'", a="x", b="y")
    assert not matches("a = 'x' AND b = 'y'", a="x", b="n")
    assert matches("a = 'x' OR b = 'y'", a="n", b="y")
    assert not matches("a = 'x' OR b = 'y'", a="n", b="n")
    assert matches("NOT (a = 'x')", a="y")
    assert not matches("NOT (a = 'x')", a="x")
    assert matches("NOT NOT (a = 'x')", a="x")
    assert matches("a = 'x' AND (b = 'y' OR c = 'z')", a="x", c="z")
    assert not matches("(a = 'x' AND b = 'y') OR c = 'z'", a="x")
    assert matches("((a > 5) OR (b = TRUE))", b="true")
    assert matches("TRUE")
    assert not matches("FALSE")
    assert matches("TRUE = FALSE OR TRUE")
    assert matches("(a > 5) = TRUE", a="6")
    assert matches("NOT a", a="x")  # a property as a boolean: FALSE when present
    assert not matches("a", a="true")


def test_a_value_that_does_not_convert_fails_the_whole_expression():
    assert not matches("a > 5", a="x")
    assert not matches("NOT (a > 5)", a="x")  # not "NOT FALSE"
    assert not matches("a > 5 OR s = 'y'", a="x", s="y")
    # AND and OR stop at a left side that decides, before the failure on the right.
    assert matches("s = 'y' OR a > 5", a="x", s="y")
    assert not matches("s = 'n' AND a > 5", a="x", s="y")
    assert not matches("c > a", a="5", c="x")  # two properties: both read as doubles
    assert matches("c > a", a="5", c="5.5")
    assert not matches("NOT a = 'x'", a="x")  # NOT a, a boolean, against a string
    # A boolean compared with a string fails too (where a string with a boolean converts).
    assert not matches("(a = 'x') <> b", a="x", b="true")
    assert matches("(a = 'x') <> b", a="x")  # TRUE <> NULL: a NULL right side is FALSE
    # The literal's type decides on either side.
    assert not matches("1 < a", a="3000000000")
    assert matches("3000000000 < a", a="3000000001")
    assert matches("5.0 > a", a="1.5f")


def test_keywords_are_case_insensitive_and_property_names_are_not():
    assert matches("a between 1 and 10 and s is not null", a="5", s="x")
    assert matches("a Not In ('x') oR s iS nUlL", a="y")
    assert matches("s contains 'l' AND s StartsWith 'h' and s endswith 'o'", s="hello")
    assert matches("true and b = false", b="false")
    assert not matches("A > 5", a="6")
    assert matches("TAGS = 'TagA'", TAGS="TagA")
    assert not matches("tags = 'TagA'", TAGS="TagA")
    assert matches("$x IS NULL AND _y_1 = '2'", _y_1="2")


def test_comments_and_text_after_a_complete_expression():
    assert matches("/* c */ a = 10", a="10")
    assert matches("a = 10 -- comment\n", a="10")
    # As the broker's parser: what follows a complete expression is not asked for.
    assert matches("a = 10 b = 2", a="10")
    assert matches("a = 10 )", a="10")
    assert matches("a = 10 -- a comment without its line break", a="10")
    assert matches("a = 10 x 'unterminated", a="10")
    # "--" without a line break is no comment but two minus signs: a double negation
    # (of a string: NULL, and NULL = NULL is TRUE).
    assert matches("a = --b")
    assert not matches("a = --b", a="1", b="1")


@pytest.mark.parametrize(
    "expression",
    [
        "",
        "   ",
        "a >",
        "a = ",
        "(a = 1",
        "a = 'unterminated",
        "a = 10 'unterminated",  # the token just after the expression is read
        "a = 10 NOT",
        "a NOT 5",
        "a IS 5",
        "a IS NOT 5",
        "a IN ()",
        "a IN ('x',)",
        "a IN ('x' 'y')",
        "a IN (1)",
        "a BETWEEN 1",
        "a BETWEEN 1 OR 2",
        "a BETWEEN 10 AND 1",
        "a BETWEEN 1 AND NULL",
        "a = NULL",
        "a <> NULL",
        "a > 'x'",
        "a > TRUE",
        "TRUE = 1",
        "NOT a > 1",  # NOT binds tighter than a comparison: (NOT a) > 1
        "NOT a IN ('x')",
        "'a' IN ('a')",
        "a CONTAINS 1",
        "1",
        "'x'",
        "-a",
        "a.b = 1",
        "a != 1",
        "a == 1",
        "a > 0.0",  # decimals below Double.MIN_VALUE are refused
        "a > 1e400",
        "a > 9223372036854775808",
        "a > -9223372036854775808",
        "AND a = 1",
        "a = 1 AND",
        "()",
        "NOT",
        "a = é",
    ],
)
def test_syntax_errors_are_refused_when_parsed(expression):
    with pytest.raises(Sql92Error):
        Sql92Filter.parse(expression)


def test_a_syntax_error_is_a_filter_expression_error():
    assert issubclass(Sql92Error, FilterExpressionError)


def test_parsed_filters_are_cached():
    assert Sql92Filter.parse("a = 'cached'") is Sql92Filter.parse("a = 'cached'")
    assert Sql92Filter.parse("a = 'cached'").expression == "a = 'cached'"


# -- reading properties from a stored record --------------------------------------------------


@pytest.mark.parametrize(
    ("topic", "born", "store"),
    [
        ("T", ("127.0.0.1", 1), ("10.0.0.2", 10911)),
        ("T" * 200, ("::1", 7), ("127.0.0.1", 10911)),  # MAGIC_V2: a two-byte topic length
        ("T", ("127.0.0.1", 1), (str(ipaddress.IPv6Address("fe80::1")), 10911)),
    ],
)
def test_record_properties_reads_what_decoding_the_whole_message_reads(topic, born, store):
    props = {"TAGS": "TagA", "a": "1", "UNIQ_KEY": "u", "s": "é\u0663"}
    msg = MessageExt(topic=topic, body=b"\x01\x02body" * 50, properties=props,
                     born_host=born, store_host=store)  # fmt: skip
    record = encode_message(msg)

    assert record_properties(record) == decode_messages(record)[0].properties == props


def test_record_properties_of_a_message_without_properties():
    assert record_properties(encode_message(MessageExt(topic="T", body=b""))) == {}


# -- the pop's filter --------------------------------------------------------------------------


def test_pop_filter_by_type():
    assert isinstance(pop_filter("a > 1", "SQL92"), Sql92Filter)
    assert pop_filter("TagA || TagB", "TAG") == TagFilter(frozenset({"TagA", "TagB"}))
    assert pop_filter("TagA", None) == TagFilter(frozenset({"TagA"}))
    assert pop_filter("*", "TAG") == MATCH_ALL
    # No expression takes everything, whatever the type: a 5.5.0 broker checks the
    # expression for emptiness before it looks at the type.
    assert pop_filter("", "SQL92") is MATCH_ALL
    assert pop_filter(None, "SQL92") is MATCH_ALL


@pytest.mark.parametrize(("expression", "kind"), [("a >", "SQL92"), ("   ", "SQL92")])
def test_pop_filter_refuses_a_malformed_sql92_expression_as_a_broker(expression, kind):
    with pytest.raises(RequestError) as caught:
        pop_filter(expression, kind)

    assert caught.value.code == 23  # SUBSCRIPTION_PARSE_FAILED
    assert caught.value.remark == "parse the consumer's subscription failed"
    assert caught.value.remark == SUBSCRIPTION_PARSE_FAILED_REMARK


def test_pop_filter_refuses_an_unknown_type():
    with pytest.raises(RequestError) as caught:
        pop_filter("a > 1", "sql92")  # a broker's type names are case-sensitive
    assert caught.value.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED


# -- on a stub broker --------------------------------------------------------------------------

TOPIC = "SqlTopic"


@pytest.fixture
async def client():
    template = BrokerConfig(topics=[TOPIC], retry_first_probability=0.0)
    async with StubCluster(1, template=template) as cluster:
        broker = cluster.brokers[0]
        client = BrokerClient(broker.name, broker.address)
        try:
            yield client
        finally:
            await client.close()


async def sql_pop(client: BrokerClient, group: str, expression: str, **over) -> RemotingCommand:
    fields = pop_fields(group, TOPIC, queueId="0", expType="SQL92", exp=expression, **over)
    return await client.remoting.invoke(RemotingCommand(RequestCode.POP_MESSAGE, fields), 10.0)


def bodies(response: RemotingCommand) -> list[bytes]:
    return [m.body for m in decode_messages(response.body or b"")]


async def send_all(client: BrokerClient) -> None:
    sends = [
        (b"cheap-eu", "TagA", {"price": "5", "region": "eu"}),
        (b"dear-eu", "TagB", {"price": "120", "region": "eu"}),
        (b"dear-us", "TagA", {"price": "99.5", "region": "us"}),
        (b"no-price", "TagA", {"region": "eu"}),
        (b"bad-price", "TagB", {"price": "n/a", "region": "us"}),
    ]
    for body, tag, props in sends:
        await client.send(TOPIC, body, tag=tag, properties=props, queue_id=0)


async def test_a_sql92_pop_returns_only_the_matching_messages(client):
    await send_all(client)

    answer = await sql_pop(client, "G1", "region = 'eu' AND price > 10.0")
    assert answer.code == ResponseCode.SUCCESS
    assert bodies(answer) == [b"dear-eu"]

    answer = await sql_pop(client, "G2", "TAGS = 'TagA' AND (price < 100 OR price IS NULL)")
    assert bodies(answer) == [b"cheap-eu", b"no-price"]  # 99.5 is no int: no match

    answer = await sql_pop(client, "G3", "region IN ('us') AND NOT (price BETWEEN 0.5 AND 50.5)")
    assert bodies(answer) == [b"dear-us"]

    # The messages the filter skipped are consumed for the group, as on a broker.
    again = await sql_pop(client, "G1", "TRUE")
    assert again.code == ResponseCode.POLLING_TIMEOUT and bodies(again) == []

    # An empty expression takes every message, whatever its type.
    everything = await sql_pop(client, "G4", "")
    assert len(bodies(everything)) == 5


async def test_a_malformed_sql92_expression_is_answered_23(client):
    await send_all(client)
    for expression in ("region = ", "price > 'x'", "a.b = 1", "   "):
        answer = await sql_pop(client, "G", expression)
        assert answer.code == 23, expression  # SUBSCRIPTION_PARSE_FAILED
        assert answer.remark == "parse the consumer's subscription failed"
    # Nothing was consumed by the refused pops.
    assert len(bodies(await sql_pop(client, "G", "TRUE"))) == 5


async def test_a_parked_sql92_pop_wakes_for_a_matching_message_only(client):
    """A long-polling pop wakes on every arrival, pops again with its filter, and parks
    again when nothing matches."""
    parked = asyncio.ensure_future(
        sql_pop(client, "Gpark", "region = 'us'", pollTime="5000", bornTime=str(now_ms()))
    )
    await asyncio.sleep(0.1)
    await client.send(TOPIC, b"eu", properties={"region": "eu"}, queue_id=0)
    await asyncio.sleep(0.1)
    assert not parked.done()
    await client.send(TOPIC, b"us", properties={"region": "us"}, queue_id=0)

    answer = await asyncio.wait_for(parked, 5)
    assert answer.code == ResponseCode.SUCCESS and bodies(answer) == [b"us"]


async def test_notification_ignores_sql92_filters(client):
    """NOTIFICATION has no filter: it says hasMsg for a message the group's SQL92 pop
    would skip, as a 5.5.0 broker does."""
    await sql_pop(client, "Gn", "region = 'us'")  # the group now has an offset
    await client.send(TOPIC, b"eu", properties={"region": "eu"}, queue_id=0)

    header = NotificationHeader("Gn", TOPIC, 0, poll_time=0, born_time=now_ms())
    answer = await client.remoting.invoke(
        RemotingCommand(RequestCode.NOTIFICATION, header.encode()), 10.0
    )
    assert NotificationResponseHeader.decode(answer.ext_fields).has_msg
    assert bodies(await sql_pop(client, "Gn", "region = 'us'")) == []


# -- groupRetryPolicy --------------------------------------------------------------------------


async def update_group(client: BrokerClient, body: dict) -> RemotingCommand:
    request = RemotingCommand(
        RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, orjson.dumps(body)
    )
    return await client.remoting.invoke(request, 10.0)


async def group_config(client: BrokerClient, group: str) -> dict:
    request = RemotingCommand(RequestCode.GET_SUBSCRIPTIONGROUP_CONFIG, {"group": group})
    answer = await client.remoting.invoke(request, 10.0)
    assert answer.code == ResponseCode.SUCCESS
    return orjson.loads(answer.body)


EXPONENTIAL = {
    "type": "EXPONENTIAL",
    "exponentialRetryPolicy": {"initial": 2000, "max": 60000, "multiplier": 3},
}
CUSTOMIZED = {"type": "CUSTOMIZED", "customizedRetryPolicy": {"next": [1000, 4000]}}


async def test_a_groups_retry_policy_round_trips(client):
    for name, policy in (("Gexp", EXPONENTIAL), ("Gcus", CUSTOMIZED)):
        body = {"groupName": name, "retryMaxTimes": 3, "groupRetryPolicy": policy}
        assert (await update_group(client, body)).code == ResponseCode.SUCCESS

        config = await group_config(client, name)
        assert config["groupRetryPolicy"] == policy
        assert config["retryMaxTimes"] == 3

    # A group that never set one (or was set again without one) answers the default: the
    # type alone, as a 5.5.0 broker (its delays are then DEFAULT_RETRY_BACKOFF_MS).
    assert (await group_config(client, "Gnever"))["groupRetryPolicy"] == {"type": "CUSTOMIZED"}
    await update_group(client, {"groupName": "Gexp", "retryMaxTimes": 3})
    assert (await group_config(client, "Gexp"))["groupRetryPolicy"] == {"type": "CUSTOMIZED"}


async def test_a_malformed_retry_policy_is_refused(client):
    body = {"groupName": "Gbad", "groupRetryPolicy": {"exponentialRetryPolicy": [1]}}
    assert (await update_group(client, body)).code == ResponseCode.INVALID_PARAMETER


@pytest.mark.parametrize(
    ("given", "kept"),
    [
        # What a 5.5.0 broker answered for each (its GroupRetryPolicy class fills defaults).
        (None, None),
        ({}, {"type": "CUSTOMIZED"}),
        ({"customizedRetryPolicy": {"next": [5]}},
         {"type": "CUSTOMIZED", "customizedRetryPolicy": {"next": [5]}}),
        ({"type": "EXPONENTIAL", "exponentialRetryPolicy": {"initial": 2000}},
         {"type": "EXPONENTIAL",
          "exponentialRetryPolicy": {"initial": 2000, "max": 7_200_000, "multiplier": 2}}),
        ({"type": "EXPONENTIAL",
          "exponentialRetryPolicy": {"initial": "2000", "max": 5, "multiplier": 1.5}},
         {"type": "EXPONENTIAL",
          "exponentialRetryPolicy": {"initial": 2000, "max": 5, "multiplier": 1}}),
        ({"type": "exponential"}, {"type": "EXPONENTIAL"}),
        ({"type": "NOPE"}, {}),
        ({"type": "CUSTOMIZED", "foo": 1, "customizedRetryPolicy": {"next": [1], "bar": 2}},
         {"type": "CUSTOMIZED", "customizedRetryPolicy": {"next": [1]}}),
        ({"type": "CUSTOMIZED", "customizedRetryPolicy": {}},
         {"type": "CUSTOMIZED",
          "customizedRetryPolicy": {"next": list(DEFAULT_RETRY_BACKOFF_MS)}}),
    ],
)  # fmt: skip
def test_retry_policy_is_kept_as_a_broker_keeps_it(given, kept):
    assert retry_policy_from_json(given) == kept
    body = {"groupName": "G", "groupRetryPolicy": given}
    answer = GroupConfig.from_json(body, 16).to_json()
    assert answer.get("groupRetryPolicy") == kept


def test_the_default_customized_delays_are_5_5_0s():
    assert list(DEFAULT_RETRY_BACKOFF_MS) == [
        1000, 5000, 10000, 30000, 60000, 120000, 180000, 240000, 300000, 360000, 420000,
        480000, 540000, 600000, 1200000, 1800000, 3600000, 7200000,
    ]  # fmt: skip
    assert GroupConfig("G").to_json()["groupRetryPolicy"] == {"type": "CUSTOMIZED"}
