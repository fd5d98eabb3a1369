"""Empty pops after hasMsg, remembered across polls of one subscription.

A real broker's NOTIFICATION ignores the subscription's tag filter, so with a filter that
drops most messages a broker says hasMsg for messages the poll's pop then does not get.
``notify.py`` pauses before probing such a broker again, longer after each miss; this
remembers the misses so that a client polling again and again does not start each poll
with no pause.
"""

from __future__ import annotations

MissKey = tuple[str, str, str, str]  # broker, group, topic, filter expression


class MissMemory:
    """How many pops in a row found nothing on a broker right after it said hasMsg, per
    (broker, group, topic, expression), less one per pop that found messages, forgotten
    ``forget_s`` after the last miss.

    A poll's back-off (``notify.MISS_BACKOFF_S``) starts from here, so a client polling
    again and again through filtered traffic does not start each poll at no pause.
    """

    def __init__(self, forget_s: float = 2.0, max_keys: int = 100_000) -> None:
        self.forget_s = forget_s
        self.max_keys = max_keys
        self._streaks: dict[MissKey, tuple[int, float]] = {}

    def streak(self, key: MissKey, now: float) -> int:
        entry = self._streaks.get(key)
        if entry is None or now - entry[1] > self.forget_s:
            return 0
        return entry[0]

    def miss(self, key: MissKey, now: float) -> int:
        """Count one more miss; the streak including it."""
        streak = self.streak(key, now) + 1
        if key not in self._streaks and len(self._streaks) >= self.max_keys:
            self._forget(now)
        self._streaks[key] = (streak, now)
        return streak

    def hit(self, key: MissKey, now: float) -> None:
        """A pop found messages: one miss fewer. Not a reset: with a filter that drops
        nine messages in ten, nine misses come for each hit and the streak still grows;
        consumers racing for unfiltered messages miss about as often as they hit and keep
        it near zero."""
        streak = self.streak(key, now) - 1
        if streak <= 0:
            self._streaks.pop(key, None)
        else:
            self._streaks[key] = (streak, self._streaks[key][1])

    def __len__(self) -> int:
        return len(self._streaks)

    def _forget(self, now: float) -> None:
        old = [k for k, (_, t) in self._streaks.items() if now - t > self.forget_s]
        for key in old or list(self._streaks)[: len(self._streaks) // 10 + 1]:
            del self._streaks[key]
