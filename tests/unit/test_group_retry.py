"""A consumer group's retry policy, read from its SubscriptionGroupConfig and answered in
its clients' settings as the Apache proxy 5.5.0 answers it."""

from __future__ import annotations

from proxy.api.convert import duration
from proxy.api.settings import answer_settings, backoff_policy
from proxy.api.v2 import definition_pb2 as pb
from proxy.groups import BackoffKind, GroupConfig, RetryPolicy
from proxy.remoting.codes import DEFAULT_RETRY_BACKOFF_MS


def test_a_group_without_a_policy_gets_rocketmqs_defaults():
    retry = GroupConfig.from_json({"groupName": "G"}).retry
    assert retry == RetryPolicy(max_attempts=17)
    policy = backoff_policy(retry)
    assert policy.max_attempts == 17
    assert [d.ToMilliseconds() for d in policy.customized_backoff.next] == list(
        DEFAULT_RETRY_BACKOFF_MS
    )
    assert DEFAULT_RETRY_BACKOFF_MS[0] == 1000 and DEFAULT_RETRY_BACKOFF_MS[-1] == 7_200_000


def test_retry_max_times_and_an_exponential_policy():
    config = {
        "retryMaxTimes": 3,
        "groupRetryPolicy": {
            "type": "EXPONENTIAL",
            "exponentialRetryPolicy": {"initial": 2000, "max": 60000, "multiplier": 3},
            "customizedRetryPolicy": {"next": [1000]},
        },
    }
    retry = GroupConfig.from_json(config).retry
    assert (retry.max_attempts, retry.kind) == (4, BackoffKind.EXPONENTIAL)
    policy = backoff_policy(retry)
    assert policy.WhichOneof("strategy") == "exponential_backoff"
    backoff = policy.exponential_backoff
    assert (backoff.initial, backoff.max, backoff.multiplier) == (
        duration(2000),
        duration(60000),
        3.0,
    )


def test_a_customized_policy_and_unreadable_fields():
    retry = GroupConfig.from_json(
        {"retryMaxTimes": "x", "groupRetryPolicy": {"customizedRetryPolicy": {"next": [10, 20]}}}
    ).retry
    assert (retry.max_attempts, retry.next_ms) == (17, (10, 20))
    assert GroupConfig.from_json({"retryMaxTimes": 0}).retry.max_attempts == 1


def test_settings_carry_the_groups_policy_and_publishers_keep_theirs():
    consumer = pb.Settings(
        client_type=pb.ClientType.SIMPLE_CONSUMER,
        subscription=pb.Subscription(group=pb.Resource(name="G")),
    )
    retry = RetryPolicy(max_attempts=2)
    answer = answer_settings(consumer, max_body_bytes=1, max_polling_ms=30_000, retry=retry)
    assert answer.backoff_policy == backoff_policy(retry)
    producer = pb.Settings(client_type=pb.ClientType.PRODUCER, publishing=pb.Publishing())
    answer = answer_settings(producer, max_body_bytes=1, max_polling_ms=30_000, retry=retry)
    assert answer.backoff_policy.max_attempts == 3  # a producer's own send retries
