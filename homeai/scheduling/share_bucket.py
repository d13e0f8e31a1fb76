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
