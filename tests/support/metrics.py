"""Reading Prometheus text the way the tests check it: one parser, two views."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def samples(text: str | bytes, name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample called ``name`` in ``text``: its labels and its value."""
    if isinstance(text, bytes):
        text = text.decode()
    return [
        (s.labels, s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    ]


def total(text: str | bytes, name: str, **labels: str) -> float:
    """The sum of the samples called ``name`` whose labels include ``labels``."""
    return sum(
        v for lbl, v in samples(text, name) if all(lbl.get(k) == x for k, x in labels.items())
    )
