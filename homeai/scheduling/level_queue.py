"""The storage under a class queue: one priority level's requests, in arrival order, overall and per user.

A level keeps two lines: unexpired requests, and behind them requests whose DELAY timeout passed
(Triton moves those behind every unexpired request). Removal is lazy: cancel, take and the DELAY move
only mark the item; the mutators pop stale entries off the heads they touched, and a level is compacted
once dead entries outnumber live ones. That keeps cancel O(1) while fairness can still take any user's
head request. Queries (``head``, ``users_by_head``, ``oldest_arrival_s``, iteration) never mutate: they
skip stale entries, so reading the queue can never race with or disturb the one thread that owns it.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

QUEUED, DELAYED, GONE = 0, 1, 2
_gens = itertools.count(1)


@dataclass(slots=True)
class QueuedItem:
    """A request waiting in a class queue. ``cost`` is what fairness and budgets count (prompt tokens)."""

    request_id: str
    user: str
    priority_level: int | None = None  # None or 0: the class's default_priority_level
    arrival_s: float = 0.0  # set by push
    deadline_s: float | None = None  # set by push from the level's timeout; None: no timeout
    timeout_override_us: int | None = None
    cancelled: bool = False
    cost: int = 1
    payload: Any = None
    requeued: bool = False  # taken once and put back (a preempted sequence, which may have streamed already)
    state: int = field(default=GONE, repr=False)
    seq: int = field(default=0, repr=False)  # push order
    gen: int = field(default=0, repr=False)  # which deque entries are current


_Entry = tuple[int, QueuedItem]  # (gen, item): current while item.gen == gen and it is not GONE


class LevelQueue:
    """One priority level of a class queue (see the module docstring)."""

    __slots__ = ("main", "delayed", "user_main", "user_delayed", "user_live", "num_live")

    def __init__(self) -> None:
        self.main: deque[_Entry] = deque()
        self.delayed: deque[_Entry] = deque()
        self.user_main: dict[str, deque[_Entry]] = {}
        self.user_delayed: dict[str, deque[_Entry]] = {}
        self.user_live: dict[str, int] = {}
        self.num_live = 0

    def add(self, item: QueuedItem, front: bool = False) -> None:
        """Append (or put at the head: a request taken out but not run) as an unexpired request."""
        item.state, item.gen = QUEUED, next(_gens)
        for dq in (self.main, self.user_main.setdefault(item.user, deque())):
            dq.appendleft((item.gen, item)) if front else dq.append((item.gen, item))
        self.user_live[item.user] = self.user_live.get(item.user, 0) + 1
        self.num_live += 1

    def delay(self, item: QueuedItem) -> None:
        """Move a queued request behind every unexpired one (Triton's DELAY timeout action)."""
        item.state, item.gen = DELAYED, next(_gens)
        self.delayed.append((item.gen, item))
        self.user_delayed.setdefault(item.user, deque()).append((item.gen, item))
        self._trim(item.user)

    def remove(self, item: QueuedItem) -> None:
        """Mark a queued request gone (its entries are dropped lazily)."""
        item.state = GONE
        self.num_live -= 1
        left = self.user_live[item.user] - 1
        if left:
            self.user_live[item.user] = left
        else:
            del self.user_live[item.user]
        self._trim(item.user)

    def _trim(self, user: str) -> None:
        """Pop stale entries off the heads a removal or a move may have uncovered (mutators only)."""
        for dq in (self.main, self.delayed, self.user_main.get(user), self.user_delayed.get(user)):
            while dq and not self.is_current(dq[0]):
                dq.popleft()
        for by_user in (self.user_main, self.user_delayed):
            if user in by_user and not by_user[user]:
                del by_user[user]

    @staticmethod
    def is_current(entry: _Entry) -> bool:
        """True while the entry still stands for its queued item (pure: no side effects)."""
        gen, item = entry
        return item.gen == gen and item.state != GONE

    def head(self, user: str | None = None) -> QueuedItem | None:
        """The first request (of ``user``, if given): unexpired before delayed, by arrival."""
        if user is None:
            return self._line_head(self.main) or self._line_head(self.delayed)
        return self._line_head(self.user_main.get(user)) or self._line_head(self.user_delayed.get(user))

    def users_by_head(self, unexpired_first: bool = False) -> list[str]:
        """Users with requests here, ordered by their head request (unexpired heads first). With
        ``unexpired_first``, only the users with an unexpired request when there are any: a DELAYed
        request goes behind every unexpired one of its level, whoever's it is."""
        heads = []
        for user in list(self.user_live):
            item = self.head(user)
            if item is not None:
                heads.append((item.state, item.seq, user))
        if unexpired_first and any(state == QUEUED for state, _, _ in heads):
            heads = [h for h in heads if h[0] == QUEUED]
        return [user for _, _, user in sorted(heads)]

    def user_lines(self, delayed: bool) -> dict[str, Iterator[QueuedItem]]:
        """Each user's current requests in one line (unexpired or delayed), in arrival order, read lazily
        (a query: a batch of a few takes a few from each line, however long the lines are; the level must
        not change while they are read)."""
        by_user = self.user_delayed if delayed else self.user_main
        return {user: (entry[1] for entry in dq if self.is_current(entry)) for user, dq in by_user.items()}

    def oldest_arrival_s(self) -> float | None:
        """Earliest arrival among the live requests (the heads of the two lines)."""
        arrivals = [h.arrival_s for dq in (self.main, self.delayed) if (h := self._line_head(dq))]
        return min(arrivals) if arrivals else None

    def _line_head(self, dq: deque[_Entry] | None) -> QueuedItem | None:
        """The first current entry's item, skipping stale ones without popping them (a query)."""
        for entry in dq or ():
            if self.is_current(entry):
                return entry[1]
        return None

    def in_order(self) -> Iterator[QueuedItem]:
        """The current requests in service order, read lazily (a query: the level must not change while it
        is read; ``iter()`` reads a copy, for callers that remove requests as they go)."""
        for dq in (self.main, self.delayed):
            yield from (entry[1] for entry in dq if self.is_current(entry))

    def __iter__(self) -> Iterator[QueuedItem]:
        for dq in (self.main, self.delayed):
            for entry in list(dq):
                if self.is_current(entry):
                    yield entry[1]

    def maybe_compact(self) -> None:
        """Rebuild the deques once dead entries outnumber live ones (bounded memory)."""
        if len(self.main) + len(self.delayed) <= 2 * self.num_live + 64:
            return
        self.main = deque(e for e in self.main if e[0] == e[1].gen and e[1].state != GONE)
        self.delayed = deque(e for e in self.delayed if e[0] == e[1].gen and e[1].state != GONE)
        self.user_main, self.user_delayed = {}, {}
        for dq, by_user in ((self.main, self.user_main), (self.delayed, self.user_delayed)):
            for entry in dq:
                by_user.setdefault(entry[1].user, deque()).append(entry)
