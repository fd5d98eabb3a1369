"""The official clients through the proxy: a committed, a rolled-back and an
orphaned-then-checked transaction, a timed message delivered at its time, a recalled one
never (``scenarios.transactions_timed_and_recalled``, the bounds are stated there), on
broker stubs and on the session's real RocketMQ 5.5.0, and on a proxy as production runs
it (``production_proxy``)."""

from __future__ import annotations

import pytest

from testkit.official import scenarios as scenario
from testkit.official.harness import LANGS
from tests.interop.conftest import PRODUCTION, langs_of, targets

pytestmark = [pytest.mark.interop, pytest.mark.timeout(240)]


@pytest.mark.parametrize("target", [*targets(("notify",)), PRODUCTION], indirect=True)
def test_transactions_timed_and_recalled(target, proxy, new_topic, run_client):
    scenario.for_each_client(
        langs_of(target, LANGS),
        scenario.transactions_timed_and_recalled,
        run_client,
        proxy,
        topic=new_topic,
        target=target,
    )
