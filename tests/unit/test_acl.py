"""The cluster's ACL 2.0 as a 5.5.0 broker reads and decides it (proxy/security/acl.py).
The orders are those of the broker's own comparison of entries, read from the 5.5.0 jar
and run against it (AclAuthorizationHandler); the JSON is what a broker answers."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.security.acl import (
    Acl,
    AclError,
    Action,
    ClusterUser,
    Decision,
    NameKind,
    Resource,
    ResourceType,
    UserStatus,
    UserType,
)

PUB, SUB = [Action.PUB], [Action.SUB]
TOPIC, GROUP = ResourceType.TOPIC, ResourceType.GROUP


def acl(*entries: tuple, default: tuple = ()) -> Acl:
    """An Acl from (resource, actions, decision[, ips]) tuples, through the broker's JSON."""

    def policy(kind: str, items: tuple) -> dict:
        return {
            "policyType": kind,
            "entries": [
                {"resource": r, "actions": a, "decision": d, **({"sourceIps": e[0]} if e else {})}
                for r, a, d, *e in items
            ],
        }

    body: dict[str, Any] = {"subject": "User:u", "policies": [policy("Custom", entries)]}
    if default:
        body["policies"].append(policy("Default", default))
    made = Acl.from_json(json.dumps(body).encode())
    assert made is not None
    return made


@pytest.mark.parametrize(
    ("key", "parsed", "back"),
    [
        ("*", Resource(ResourceType.ANY, NameKind.ANY), "*"),
        ("Topic:*", Resource(TOPIC, NameKind.ANY), "Topic:*"),
        ("Topic:abc*", Resource(TOPIC, NameKind.PREFIXED, "abc"), "Topic:abc*"),
        ("topic:abc", Resource(TOPIC, NameKind.LITERAL, "abc"), "Topic:abc"),
        ("Topic:a*b", Resource(TOPIC, NameKind.LITERAL, "a*b"), "Topic:a*b"),  # not a prefix
        ("Group:g", Resource(GROUP, NameKind.LITERAL, "g"), "Group:g"),
        ("Any:x", Resource(ResourceType.ANY, NameKind.ANY), "*"),
    ],
)
def test_resource_keys_parse_as_the_broker_parses_them(key, parsed, back):
    assert Resource.parse(key) == parsed
    assert parsed.key() == back


@pytest.mark.parametrize("key", ["", "Queue:x", "orders", None])
def test_a_resource_of_no_known_type_is_an_error(key):
    with pytest.raises(AclError):
        Resource.parse(key)


@pytest.mark.parametrize(
    ("entries", "name", "expected"),
    [
        # A literal name before a prefix.
        ((("Topic:abc*", ["Pub"], "Allow"), ("Topic:abc", ["Pub"], "Deny")), "abc", "Deny"),
        # A longer prefix before a shorter one.
        ((("Topic:ab*", ["Pub"], "Deny"), ("Topic:abc*", ["Pub"], "Allow")), "abcd", "Allow"),
        # A named type before everything.
        ((("*", ["Pub"], "Allow"), ("Topic:x", ["Pub"], "Deny")), "x", "Deny"),
        # A literal name before every name of its type.
        ((("Topic:*", ["Pub"], "Deny"), ("Topic:t", ["Pub"], "Allow")), "t", "Allow"),
        # A tie: Deny first.
        ((("Topic:t", ["Pub"], "Allow"), ("Topic:t", ["Pub", "Sub"], "Deny")), "t", "Deny"),
        # Nothing matches: no decision (the broker refuses).
        ((("Topic:other", ["Pub"], "Allow"),), "t", None),
        ((("Topic:t", ["Sub"], "Allow"),), "t", None),  # not the action asked
    ],
)
def test_the_most_specific_matching_entry_decides(entries, name, expected):
    decided = acl(*entries).decide(TOPIC, name, PUB, "10.0.0.1")
    assert decided == (Decision(expected) if expected else None)


def test_one_action_of_several_asked_is_enough_and_all_covers_every_action():
    """QueryRoute asks Pub and Sub at once: a Pub-only allow lets it through, and a Sub-only
    deny refuses it."""
    both = [Action.PUB, Action.SUB]
    assert acl(("Topic:t", ["Pub"], "Allow")).decide(TOPIC, "t", both, None) is Decision.ALLOW
    refused = acl(("Topic:t", ["Pub"], "Allow"), ("Topic:t", ["Sub"], "Deny"))
    assert refused.decide(TOPIC, "t", both, None) is Decision.DENY
    assert acl(("Topic:t", ["All"], "Allow")).decide(TOPIC, "t", SUB, None) is Decision.ALLOW
    assert acl(("Topic:t", [], "Allow")).decide(TOPIC, "t", SUB, None) is None


def test_the_default_policy_is_read_only_when_the_custom_one_has_no_match():
    rules = acl(("Topic:t", ["Pub"], "Allow"), default=(("Topic:*", ["Pub"], "Deny"),))
    assert rules.decide(TOPIC, "t", PUB, None) is Decision.ALLOW
    assert rules.decide(TOPIC, "other", PUB, None) is Decision.DENY
    # A more specific Default entry does not beat a matching Custom one.
    rules = acl(("*", ["Pub"], "Allow"), default=(("Topic:t", ["Pub"], "Deny"),))
    assert rules.decide(TOPIC, "t", PUB, None) is Decision.ALLOW


@pytest.mark.parametrize(
    ("ips", "client", "matched"),
    [
        (["10.0.0.0/8"], "10.1.2.3", True),
        (["10.0.0.0/8"], "192.168.1.1", False),
        (["192.168.1.7"], "192.168.1.7", True),  # an exact address
        (["192.168.1.7"], "192.168.1.8", False),
        (["2001:db8::/32"], "2001:db8::7", True),
        (["10.0.0.0/8"], None, False),  # no address known: an entry with addresses misses
    ],
)
def test_an_entry_with_source_addresses_matches_only_clients_from_them(ips, client, matched):
    rules = acl(("Topic:t", ["Pub"], "Allow", ips))
    assert (rules.decide(TOPIC, "t", PUB, client) is Decision.ALLOW) is matched


def test_a_group_entry_does_not_cover_a_topic_of_the_same_name():
    rules = acl(("Group:t", ["Sub"], "Allow"))
    assert rules.decide(TOPIC, "t", SUB, None) is None
    assert rules.decide(GROUP, "t", SUB, None) is Decision.ALLOW


def test_a_user_as_the_broker_answers_it():
    body = b'{"password":"pw","userStatus":"disable","userType":"Super","username":"root"}'
    assert ClusterUser.from_json(body) == ClusterUser(
        "root", "pw", UserType.SUPER, UserStatus.DISABLE
    )
    assert ClusterUser.from_json(b'{"username":"u","password":"p"}') == ClusterUser("u", "p")
    assert ClusterUser.from_json(None) is None  # the broker has no such user: no body
    assert Acl.from_json(b"") is None  # a user without rules


@pytest.mark.parametrize(
    "body",
    [b"[1]", b'{"username": "u"}', b"not json", b"[" * 100_000],
)
def test_a_user_body_that_cannot_be_read_is_an_error(body):
    with pytest.raises(AclError):
        ClusterUser.from_json(body)


@pytest.mark.parametrize(
    "entry",
    [
        {"resource": "Topic:t", "actions": ["Pub"], "decision": "Maybe"},
        {"resource": "Queue:t", "actions": ["Pub"], "decision": "Allow"},
        {"resource": "Topic:t", "actions": ["Pub"], "decision": "Allow", "sourceIps": [1]},
        "entry",
    ],
)
def test_an_acl_body_that_cannot_be_read_is_an_error(entry):
    body = json.dumps({"policies": [{"policyType": "Custom", "entries": [entry]}]})
    with pytest.raises(AclError):
        Acl.from_json(body.encode())
