"""The official Java client 5.2.0's sends that the Apache proxy 5.5.0 refuses for their size,
refused through this proxy too (issue 40): a message key or a tag longer than 16 KB, more
than 128 user properties, and keys, tag and properties together past 16 KB. The client
checks none of these itself; each fails with MESSAGE_PROPERTIES_TOO_LARGE and the Apache
proxy's words, and the same message at the limit is sent. (Every limit, through the Apache
proxy too, is tests/integration/test_request_limits.py.)
"""

from __future__ import annotations

import itertools

import pytest

from proxy.api.v2 import definition_pb2 as pb
from testkit.official.harness import run_driver
from tests.interop.conftest import DEFAULT_MODE, targets

pytestmark = [pytest.mark.interop, pytest.mark.slow]

KB16 = 16 * 1024
TOO_LARGE = pb.Code.MESSAGE_PROPERTIES_TOO_LARGE
TOTAL = "the total size of user property is too large, max is 16384"
COUNT = "too many user properties, max is 128"

# (case, produce options at the limit, the same one past it, the refusal's text)
SENDS = [
    ("a key of 16 KB", ["--keys", "k" * KB16], ["--keys", "k" * (KB16 + 1)], TOTAL),
    ("a tag of 16 KB", ["--tag", "t" * KB16], ["--tag", "t" * (KB16 + 1)], TOTAL),
    ("128 user properties", ["--user-properties", "128"], ["--user-properties", "129"], COUNT),
    (
        "keys, tag and properties of 16 KB together",
        ["--keys", "k" * 100, "--tag", "t" * 100, "--user-properties", f"16:{KB16 - 200}"],
        ["--keys", "k" * 100, "--tag", "t" * 100, "--user-properties", f"16:{KB16 - 199}"],
        TOTAL,
    ),
]
_runs = itertools.count(1)


def produce(target, tmp_path, topic: str, options: list[str]):
    """One message sent by the Java driver's producer; the finished process."""
    argv = ["produce", "--endpoint", target.proxy.grpc, "--topic", topic, "--count", "1",
            *options, "--deadline-seconds", "40"]  # fmt: skip
    return run_driver("java", argv, timeout=45, home=tmp_path / f"home-{next(_runs)}")


@pytest.mark.parametrize("target", targets((DEFAULT_MODE,)), indirect=True)
@pytest.mark.parametrize(
    ("case", "at_limit", "past_limit", "text"), SENDS, ids=[s[0] for s in SENDS]
)
def test_an_oversized_send_fails_and_one_at_the_limit_is_sent(
    target, tmp_path, case, at_limit, past_limit, text
):
    topic = target.new_topic("oversized")

    sent = produce(target, tmp_path, topic, at_limit)
    refused = produce(target, tmp_path, topic, past_limit)

    assert sent.returncode == 0, f"{case} at the limit was not sent:\n{sent.stderr[-3000:]}"
    assert '"ids"' in sent.stdout
    assert refused.returncode == 1, f"{case} past the limit was sent: {refused.stdout}"
    # The client's exception: its response code and the proxy's message.
    failure = refused.stderr.splitlines()[-1]
    assert f"response-code={TOO_LARGE}]" in failure, failure
    assert failure.endswith(text), failure
