"""One workload class's queue, with Triton's dynamic-batcher and queue-policy semantics.

Requests wait in priority levels (1 is served first), in arrival order within a level. Each level has
its own ModelQueuePolicy: a size limit (a full level rejects at once), a timeout, and the timeout
action: REJECT (the request is handed back for the caller to fail) or DELAY (it moves behind every
unexpired request of its level, and stays). Two ways out:

- ``form_batch`` for embedding classes: Triton's dynamic batcher (preferred sizes, delay window);
- ``peek_for_admission`` and ``take`` for LLM classes: one request at a time for the step planner, from the
  user a fairness callback picks among the users of the highest non-empty level, behind the class
  delay window.

``preserve_ordering``: a batch comes out in queue order and its responses are delivered in that
order; each of our responses is its own stream, so it only affects the order of batch outputs.

Not thread-safe: one thread (the device loop) owns it; others post to that thread's inbox. Methods
that read like queries (``next_ready_at``, ``next_expiry_at``, ``len``, iteration) never mutate, and
timeouts are applied only by ``expire``, ``form_batch`` and admission, whose callers receive every
request they reject: a request is always queued, handed out, or reported, never silently dropped.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Iterator, Sequence

from homeai.policy.schema import ClassPolicy, QueuePolicy
from homeai.scheduling.fairness import VirtualTokenCounter
from homeai.scheduling.level_queue import GONE, QUEUED, LevelQueue, QueuedItem

__all__ = ["ClassQueue", "QueueFullError", "QueuedItem", "effective_timeout_us"]

_EPS_S = 1e-9  # float slack: waking at exactly ``next_ready_at`` counts as ready
PickUser = Callable[[list[str]], str]


def _deadline_current(entry: tuple[float, int, int, QueuedItem]) -> bool:
    """A deadline entry still applies: its item is queued (not delayed or gone) in the same place."""
    return entry[3].state == QUEUED and entry[3].gen == entry[2]


MAX_RETRY_AFTER_S = 60.0


class QueueFullError(Exception):
    """The request's priority level is full: reject at once (HTTP 429 with Retry-After)."""

    def __init__(self, retry_after_s: float, class_name: str = "", level: int = 1) -> None:
        self.retry_after_s = retry_after_s
        self.class_name = class_name
        self.level = level
        super().__init__(f"class {class_name!r} level {level} queue is full; retry in {retry_after_s:.1f}s")


def effective_timeout_us(qp: QueuePolicy, override_us: int | None) -> int:
    """A request's queue timeout: it may shorten the level's (if allowed), never lengthen it. 0 = none."""
    default = qp.default_timeout_microseconds
    if override_us is None or override_us <= 0 or not qp.allow_timeout_override:
        return default
    return override_us if default == 0 else min(default, override_us)


class ClassQueue:
    """The queue of one workload class (see the module docstring for the semantics)."""

    def __init__(self, name: str, policy: ClassPolicy, fairness: VirtualTokenCounter | None = None) -> None:
        self.name = name
        # Embedding classes: batches form in VTC order across users (LLM classes pick per admission).
        self.fairness = fairness
        self._levels: dict[int, LevelQueue] = {}
        self._by_id: dict[str, QueuedItem] = {}
        self._deadlines: list[tuple[float, int, int, QueuedItem]] = []  # (deadline, tie, gen, item)
        self._rejected: list[QueuedItem] = []
        self._pushed_out: list[tuple[QueuedItem, QueueFullError]] = []
        self._departures: deque[float] = deque(maxlen=32)
        self._seq = itertools.count(1)
        self._released_until_s = float("-inf")
        self.set_policy(policy)

    @property
    def policy(self) -> ClassPolicy:
        return self._policy

    def set_policy(self, policy: ClassPolicy) -> None:
        """Apply a new class policy: queued requests keep their place and deadlines; limits, delay
        and batch sizes apply from now. Levels beyond a reduced ``priority_levels`` drain last."""
        self._policy = policy
        for no in range(1, policy.priority_levels + 1):
            self._levels.setdefault(no, LevelQueue())
        self._levels = dict(sorted(self._levels.items()))

    def push(self, item: QueuedItem, now: float, num_free_slots: int = 0) -> None:
        """Queue ``item`` at ``now`` (stamps arrival and deadline); a full level raises QueueFullError.

        ``num_free_slots``: requests of this class that could start running at the next step. They are
        queued until then, but they are not waiting for a slot, so they do not count against
        ``max_queue_size`` (8 running + 16 queued allowed: a burst of 40 admits 24, however few of them
        the device thread has moved to running yet). The slots go to the class's levels in order: a
        level's allowance is what the requests queued at the levels before it leave.

        Applies no timeouts: a request it timed out would leave the queue with nobody told, and its
        caller would wait forever. Call ``expire(now)`` first so that timed-out requests make room and
        get answered."""
        if item.request_id in self._by_id:
            raise ValueError(f"request {item.request_id!r} is already queued in {self.name!r}")
        no = self._resolve_level(item.priority_level)
        qp = self._policy.queue_policy(no)
        ahead = sum(level.num_live for n, level in self._levels.items() if n < no)
        if qp.max_queue_size and self._levels[no].num_live >= qp.max_queue_size + max(0, num_free_slots - ahead):
            self._push_out(item.user, no, now)  # or QueueFullError
        item.priority_level, item.arrival_s, item.seq = no, now, next(self._seq)
        timeout_us = effective_timeout_us(qp, item.timeout_override_us)
        item.deadline_s = now + timeout_us / 1e6 if timeout_us else None
        if self.fairness is not None and self.num_queued_for(item.user) == 0:
            self.fairness.on_backlogged(item.user, self.users_queued())
        self._insert(item, front=False)

    def _push_out(self, user: str, no: int, now: float) -> None:
        """Make room at a full level for ``user`` by rejecting the newest request of the user who holds the
        most there, when that is at least two more than ``user`` holds (so a turn never goes back and forth);
        else QueueFullError. One key kept a class's queue full (8 streams running, 16 queued) and every other
        household member got 429 at once: VTC decided only who was taken next. The pushed-out request gets
        the 429 (``take_pushed_out``)."""
        level = self._levels[no]
        error = QueueFullError(self.retry_after_s(now, no), self.name, no)
        heaviest = max(level.user_live, key=lambda u: level.user_live[u], default=None)
        if heaviest is None or heaviest == user or level.user_live[heaviest] < level.user_live.get(user, 0) + 2:
            raise error
        # never one put back after it ran (preempted): it may have streamed, and a 429 mid-answer is no refusal
        candidates = [it for it in level.in_order() if it.user == heaviest and not it.requeued]
        if not candidates:
            raise error
        newest = max(candidates, key=lambda it: it.seq)
        self._drop(newest)
        self._pushed_out.append((newest, error))

    def take_pushed_out(self) -> list[tuple[QueuedItem, QueueFullError]]:
        """Requests pushed out of a full level for another user's (each once; the caller fails them: 429)."""
        out, self._pushed_out = self._pushed_out, []
        return out

    def requeue_front(self, item: QueuedItem) -> None:
        """Put back a request that was taken but could not run: head of its level, same deadline."""
        if item.request_id in self._by_id:
            raise ValueError(f"request {item.request_id!r} is already queued in {self.name!r}")
        item.requeued = True
        self._insert(item, front=True)

    def _insert(self, item: QueuedItem, front: bool) -> None:
        self._levels.setdefault(item.priority_level or 1, LevelQueue()).add(item, front)
        self._by_id[item.request_id] = item
        if item.deadline_s is not None:
            heapq.heappush(self._deadlines, (item.deadline_s, next(self._seq), item.gen, item))

    def _resolve_level(self, level: int | None) -> int:
        if level is None or level == 0:
            return self._policy.default_priority_level
        if level < 0:
            raise ValueError(f"priority level must be >= 1, got {level}")
        return min(level, self._policy.priority_levels)  # beyond the last level: the lowest

    def cancel(self, request_id: str) -> QueuedItem | None:
        """Drop a queued request so it never comes out; returns it (None if not queued here)."""
        item = self._by_id.get(request_id)
        if item is None:
            return None
        item.cancelled = True
        self._drop(item)
        return item

    def expire(self, now: float) -> list[QueuedItem]:
        """Apply timeouts. Returns the REJECTed requests (the caller fails them), including any found
        by other calls since; DELAYed ones move behind every unexpired request of their level."""
        self._expire(now)
        out, self._rejected = self._rejected, []
        return out

    def _expire(self, now: float) -> None:
        heap = self._deadlines
        while heap and heap[0][0] <= now + _EPS_S:
            _, _, gen, item = heapq.heappop(heap)
            level = self._levels[item.priority_level or 1]
            if item.state != QUEUED or not level.is_current((gen, item)):
                continue
            if self._policy.queue_policy(item.priority_level or 1).timeout_action == "REJECT":
                self._drop(item)
                self._rejected.append(item)
            else:  # DELAY: behind every unexpired request; it never times out again
                item.deadline_s = None
                level.delay(item)

    def take(self, item: QueuedItem, now: float) -> None:
        """Remove a request that ``peek_for_admission`` returned (it is about to run)."""
        if self._by_id.get(item.request_id) is not item or item.state == GONE:
            raise ValueError(f"request {item.request_id!r} is not queued in {self.name!r}")
        self._drop(item)
        self._departures.append(now)
        self._released_until_s = max(self._released_until_s, now)  # all queued by now may join this step

    def _drop(self, item: QueuedItem) -> None:
        level = self._levels[item.priority_level or 1]
        level.remove(item)
        self._forget(item)
        level.maybe_compact()
        heap = self._deadlines
        while heap and not _deadline_current(heap[0]):  # keep the top current: next_expiry_at only peeks
            heapq.heappop(heap)

    def _forget(self, item: QueuedItem) -> None:
        self._by_id.pop(item.request_id, None)

    # ---- embedding classes: Triton's dynamic batcher ----------------------------------------
    def form_batch(self, now: float, max_size: int | None = None, force: bool = False,
                   max_cost: int | None = None) -> list[QueuedItem] | None:
        """A batch from the head (level 1 first, arrival order within a level), or None if not ready.

        The largest preferred size that can be formed goes at once (max_batch_size when none are
        preferred); otherwise the batch waits until its oldest request has waited
        max_queue_delay_microseconds, then goes as it is. ``max_size`` caps it (e.g. a budget), and so
        does ``max_cost``: the inputs' ``cost`` (tokens) together, at least one input; a batch that
        reaches a cap is full and goes at once. ``force`` sends what is there before the window closes
        (a background class owed its share); timeouts still apply at ``now``, never at the window's end.
        """
        self._expire(now)
        cap, cands = self._capped_candidates(max_size, max_cost)
        size = self._fire_size(cands, cap, now) or (len(cands) if force else 0)
        if not size:
            return None
        batch = cands[:size]
        for item in batch:
            self._drop(item)
            self._departures.append(now)
        if self.fairness is not None:
            for item in batch:
                self.fairness.charge(item.user, item.cost, 0)
            queued = self.users_queued()
            for user in {item.user for item in batch} - queued:
                self.fairness.on_drained(user)
            if len(self.fairness) > self.fairness.prune_above:  # an embedding input never runs on after its
                self.fairness.forget_idle(queued)  # batch: the queued users are the active ones
        return batch

    def _cap(self, max_size: int | None) -> int:
        mbs = self._policy.max_batch_size
        return mbs if max_size is None else max(1, min(max_size, mbs))

    def _capped_candidates(self, max_size: int | None, max_cost: int | None) -> tuple[int, list[QueuedItem]]:
        """The batch's size cap and its candidates, both within ``max_cost`` (at least one input)."""
        cap = self._cap(max_size)
        cands = self._candidates(cap)
        if max_cost is not None:
            total, fits = 0, 0
            for item in cands:
                total += item.cost
                if fits and total > max_cost:
                    break
                fits += 1
            if fits < len(cands):
                cap, cands = fits, cands[:fits]
        return cap, cands

    def _candidates(self, cap: int) -> list[QueuedItem]:
        """The next batch's inputs: queue order, or with ``fairness`` set, counter order across users
        (level by level, unexpired before delayed), each pick charging the user's counter as it goes
        so that one user's flood cannot push another's single query back by whole batches."""
        fair = self.fairness
        if fair is None:
            return list(itertools.islice(itertools.chain.from_iterable(
                level.in_order() for level in self._levels.values()), cap))
        out: list[QueuedItem] = []
        counters: dict[str, float] = {}
        for level in self._levels.values():
            for delayed in (False, True):
                if len(out) >= cap:
                    return out
                lines = level.user_lines(delayed)
                heads: dict[str, QueuedItem] = {}  # each user's next request in this line
                for user, line in lines.items():
                    if (first := next(line, None)) is not None:
                        heads[user] = first
                        if user not in counters:
                            counters[user] = fair.counter(user)
                while len(out) < cap and heads:
                    user = min(heads, key=lambda u: (counters[u], heads[u].seq))
                    item = heads[user]
                    out.append(item)
                    counters[user] += fair.cost(item.cost, 0) / fair.weight(user)
                    if (following := next(lines[user], None)) is None:
                        del heads[user]
                    else:
                        heads[user] = following
        return out

    def _fire_size(self, cands: Sequence[QueuedItem], cap: int, now: float) -> int:
        """Triton: the largest preferred size that can be formed goes at once (all up to the cap when
        none is preferred); once the oldest has waited the delay window, everything pending goes, up
        to the cap, never trimmed to a preferred size."""
        n = len(cands)
        if n == 0:
            return 0
        oldest = min(item.arrival_s for item in cands)
        if now + _EPS_S >= oldest + self._policy.max_queue_delay_s:
            return n
        fits = [p for p in self._policy.preferred_batch_size if p <= n]
        if fits:
            return max(fits)
        return n if n >= cap else 0

    def next_ready_at(self, now: float, max_size: int | None = None, max_cost: int | None = None) -> float | None:
        """When ``form_batch`` (embedding) or admission (LLM) would go: ``now`` if ready, else the end
        of the delay window; None when empty. Timeouts are separate: see ``next_expiry_at``."""
        delay_s = self._policy.max_queue_delay_s
        if self._policy.kind == "llm":
            oldest = self._oldest_arrival_s()
            if oldest is None:
                return None
            return now if self._window_open(now) else oldest + delay_s
        cap, cands = self._capped_candidates(max_size, max_cost)
        if not cands:
            return None
        if self._fire_size(cands, cap, now):
            return now
        return min(item.arrival_s for item in cands) + delay_s

    def next_expiry_at(self) -> float | None:
        """The earliest deadline still pending (a REJECT must be answered on time), or None. A query:
        it never pops the heap (the device thread's mutators keep its top current)."""
        heap = self._deadlines
        if heap and _deadline_current(heap[0]):
            return heap[0][0]
        return min((e[0] for e in heap if _deadline_current(e)), default=None)

    # ---- LLM classes: admission to the running batch ----------------------------------------
    def peek_for_admission(self, now: float, pick_user: PickUser | None = None) -> QueuedItem | None:
        """The next request to admit, left in place (``take`` it once it has room), or None.

        Highest non-empty priority level first; in it, the head request of the user ``pick_user``
        chooses among that level's users (ordered by their head's arrival), or the level's head.
        None while the class delay window holds new prefills. A query: it applies no timeouts (the
        owner calls ``expire`` first) and opens no window (``take`` does).
        """
        if not self._window_open(now):
            return None
        for level in self._levels.values():
            if pick_user is None:
                item = level.head()
            else:
                users = level.users_by_head(unexpired_first=True)
                if not users:
                    continue
                user = pick_user(users)
                if user not in level.user_live:
                    raise ValueError(f"pick_user chose {user!r}, not one of {users}")
                item = level.head(user)
            if item is not None:
                return item
        return None

    def _window_open(self, now: float) -> bool:
        """Hold new prefills until max_batch_size are queued or the oldest has waited the delay; once
        open, everything queued by then is released, so that they share one step."""
        oldest = self._oldest_arrival_s()
        if oldest is None:
            return False
        if self._policy.max_queue_delay_microseconds == 0 or len(self) >= self._policy.max_batch_size:
            return True
        return oldest <= self._released_until_s or now + _EPS_S >= oldest + self._policy.max_queue_delay_s

    def _oldest_arrival_s(self) -> float | None:
        arrivals = [a for lv in self._levels.values() if (a := lv.oldest_arrival_s()) is not None]
        return min(arrivals) if arrivals else None

    def oldest_arrival_s(self) -> float | None:
        """When the longest-waiting queued request arrived (None: the queue is empty). A query."""
        return self._oldest_arrival_s()

    # ---- inspection ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return sum(level.num_live for level in self._levels.values())

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._by_id

    def __iter__(self) -> Iterator[QueuedItem]:
        """Queued requests in service order: level 1 first; unexpired, then delayed, by arrival."""
        for level in list(self._levels.values()):
            yield from level

    def depth_by_level(self) -> dict[int, int]:
        return {no: level.num_live for no, level in self._levels.items()}

    def users_queued(self) -> set[str]:
        return {user for level in self._levels.values() for user in level.user_live}

    def num_queued_for(self, user: str) -> int:
        return sum(level.user_live.get(user, 0) for level in self._levels.values())

    def retry_after_s(self, now: float, level: int = 1) -> float:
        """A Retry-After estimate: requests ahead times the recent time between departures, at least 1 s
        and never more than the level's queue timeout (or 60 s): a client told to wait longer than a
        queued request may wait would be sent away for nothing (voice times out after 10 s, and its
        429s once said 60). Only departures inside that horizon count, so a quiet hour before a burst
        does not read as a slow queue."""
        timeout_us = self._policy.queue_policy(level).default_timeout_microseconds
        horizon_s = min(MAX_RETRY_AFTER_S, timeout_us / 1e6) if timeout_us else MAX_RETRY_AFTER_S
        ahead = sum(lv.num_live for no, lv in self._levels.items() if no <= level) + 1
        recent = [t for t in self._departures if now - t <= horizon_s]
        if len(recent) >= 2 and recent[-1] > recent[0]:
            estimate = ahead * (recent[-1] - recent[0]) / (len(recent) - 1)
        else:
            estimate = self._policy.max_queue_delay_s
        return min(horizon_s, max(1.0, estimate))
