"""``min_share`` as a rate: a bucket that refills smoothly while its class is backlogged.

A background class with ``min_share`` is owed that fraction of the device while it has work, and no
more: the bucket refills at the share's rate (device seconds per second for the batcher, tokens per
step for the LLM planner), is capped at a small ``capacity`` so that a class that starts late (or was
kept out for a while) never "repays a debt" in a burst, and starts empty, so a cold start is not
starvation. Everything the class is served is charged, whether it ran on its share or on idle capacity,
so a class already getting more than its share never forces its way in; idle-capacity service never
drives the credit below zero (that would bank a debt against the class), a forced take may overdraw by
at most what it took.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class ShareBucket:
    """Credit (in the caller's unit) a background class may claim against more important work."""

    share: float
    capacity: float
    credit: float = 0.0

    def refill(self, amount: float, backlogged: bool) -> None:
        """Add ``share * amount`` (``amount``: elapsed seconds, or this step's token budget) while the
        class has work; an idle class earns nothing, so it cannot bank credit while away."""
        if backlogged and self.share > 0:
            self.credit = min(self.capacity, self.credit + self.share * amount)

    def set_capacity(self, capacity: float) -> None:
        self.capacity = capacity
        self.credit = min(self.credit, capacity)

    @property
    def owed(self) -> bool:
        """True while the class has credit to claim (it got less than its share lately)."""
        return self.share > 0 and self.credit > 0

    def charge(self, amount: float, forced: bool) -> None:
        """The class was served ``amount``: on its share (``forced``), or on idle capacity."""
        self.credit -= amount
        if not forced:
            self.credit = max(self.credit, 0.0)


class ShareLedger:
    """The min_share credit of every background class in one unit: a ``ShareBucket`` per class that
    refills at its share of ``amount`` while it has work and holds at most ``burst`` full units' worth.
    The batcher keeps one in device seconds (unit: a second), the LLM planner one in tokens (unit: a
    full step's tokens), so min_share means the same rate in both."""

    def __init__(self, burst: float) -> None:
        self.burst = burst
        self._buckets: dict[str, ShareBucket] = {}

    def refill(self, name: str, share: float, amount: float, unit: float, backlogged: bool) -> bool:
        """Refill ``name``'s credit by ``share * amount`` (capped at ``burst * share * unit``) if it is
        backlogged; True while it is owed credit. A class without a share holds none."""
        if share <= 0:
            self._buckets.pop(name, None)
            return False
        bucket = self._buckets.setdefault(name, ShareBucket(share, 0.0))
        bucket.share = share
        bucket.set_capacity(self.burst * share * unit)
        bucket.refill(amount, backlogged)
        return bucket.owed

    def credit(self, name: str) -> float:
        bucket = self._buckets.get(name)
        return bucket.credit if bucket is not None else 0.0

    def charge(self, name: str, amount: float, forced: bool) -> None:
        """``name`` was served ``amount``: on its share (``forced``), or on idle capacity."""
        bucket = self._buckets.get(name)
        if bucket is not None:
            bucket.charge(amount, forced)

    def forget(self, name: str) -> None:
        """Drop ``name``'s bucket (a model that left the device: a later one of that name starts afresh)."""
        self._buckets.pop(name, None)
