"""Raw remoting requests for tests that speak to a broker below BrokerClient."""

from __future__ import annotations

from proxy.remoting.headers import now_ms


def pop_fields(group: str, topic: str, **over: object) -> dict[str, str]:
    """The header fields of a POP_MESSAGE that takes up to 32 messages at once, without
    parking; ``over`` replaces or adds fields (any value, sent as its text)."""
    fields = {
        "consumerGroup": group,
        "topic": topic,
        "queueId": "-1",
        "maxMsgNums": "32",
        "invisibleTime": "30000",
        "pollTime": "0",
        "bornTime": str(now_ms()),
        "initMode": "1",
        "expType": "TAG",
        "exp": "*",
        "order": "false",
    }
    fields.update({k: str(v) for k, v in over.items()})
    return fields
