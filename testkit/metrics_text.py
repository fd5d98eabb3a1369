"""Reading Prometheus text, for the tests and the benchmarks alike: one parser, three views."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.parser import text_string_to_metric_families


def every_sample(text: str | bytes) -> Iterator[tuple[str, dict[str, str], float]]:
    """Every sample in ``text``: its name, its labels and its value."""
    if isinstance(text, bytes):
        text = text.decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            yield s.name, s.labels, s.value


def samples(text: str | bytes, name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample called ``name`` in ``text``: its labels and its value."""
    return [(labels, value) for n, labels, value in every_sample(text) if n == name]


def total(text: str | bytes, name: str, **labels: str) -> float:
    """The sum of the samples called ``name`` whose labels include ``labels``."""
    return sum(
        v for lbl, v in samples(text, name) if all(lbl.get(k) == x for k, x in labels.items())
    )
