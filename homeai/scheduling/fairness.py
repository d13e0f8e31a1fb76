"""Token-aware fairness inside a class: the Virtual Token Counter (VTC).

After Sheng et al., "Fairness in Serving Large Language Models" (OSDI 2024). Each user has a counter
of the service it received, in weighted tokens: input tokens x w_in plus output tokens x w_out,
divided by the user's weight. The next request admitted is the head request of the backlogged user
with the lowest counter. A user back from idle (its queue goes from empty to non-empty while none of
its requests runs) is lifted to the lowest counter among the backlogged users, so that idle time is not
banked as credit against them. A user whose requests still run is busy, not idle: its counter lags its
service only because output is charged as it is generated, and lifting it would take away the share its
weight gives it (weight 2 against 1 used to come out at 1:1 for a user who queued while decoding). The
paper proves that two continuously backlogged users then differ in received service by at most 2U,
U being the largest cost one admission can add (w_in x max input + w_out x max output in the batch).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from homeai.policy.schema import Policy

IDLE_COUNTERS_KEPT = 256  # counters of idle users kept before those at the floor are dropped (``forget_idle``)


class VirtualTokenCounter:
    """Per-user virtual token counters for one class (not thread-safe: the scheduler loop owns it)."""

    def __init__(
        self,
        w_in: float = 1.0,
        w_out: float = 2.0,
        weights: Mapping[str, float] | None = None,
        default_weight: float = 1.0,
    ) -> None:
        self._counters: dict[str, float] = {}
        self._last_left = 0.0
        self.prune_above = IDLE_COUNTERS_KEPT  # the number of counters past which ``forget_idle`` is due
        self.set_weights(w_in, w_out, weights, default_weight)

    @classmethod
    def from_policy(cls, policy: Policy, class_name: str) -> VirtualTokenCounter:
        vtc = cls()
        vtc.apply_policy(policy, class_name)
        return vtc

    def apply_policy(self, policy: Policy, class_name: str) -> None:
        """Take w_in/w_out from the class and weights from the users; counters are kept."""
        fairness = policy.classes[class_name].fairness
        weights = {name: user.weight for name, user in policy.users.items()}
        self.set_weights(fairness.w_in, fairness.w_out, weights, policy.user("").weight)

    def set_weights(
        self, w_in: float, w_out: float, weights: Mapping[str, float] | None, default_weight: float = 1.0
    ) -> None:
        if w_in < 0 or w_out < 0 or default_weight <= 0:
            raise ValueError("w_in and w_out must be >= 0 and weights > 0")
        self.w_in, self.w_out = w_in, w_out
        self._weights = dict(weights or {})
        self._default_weight = default_weight
        if any(w <= 0 for w in self._weights.values()):
            raise ValueError("user weights must be > 0")

    def weight(self, user: str) -> float:
        return self._weights.get(user, self._default_weight)

    def counter(self, user: str) -> float:
        return self._counters.get(user, 0.0)

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        """Weighted tokens before dividing by a user's weight."""
        return input_tokens * self.w_in + output_tokens * self.w_out

    def charge(self, user: str, input_tokens: int = 0, output_tokens: int = 0) -> float:
        """Add service: call with a prefill chunk's tokens when it is scheduled and with each decoded
        token (or a step's worth). Returns the user's new counter."""
        value = self.counter(user) + self.cost(input_tokens, output_tokens) / self.weight(user)
        self._counters[user] = value
        return value

    def raise_to(self, user: str, value: float) -> None:
        """At least ``value``: a cluster's front door counts each user's service on every replica, and a
        replica takes it, so that a user served elsewhere waits here as if served here (one number across
        replicas, not one per replica that would double the user's share)."""
        if value > self._counters.get(user, float("-inf")):
            self._counters[user] = value

    def on_backlogged(self, user: str, backlogged_users: Iterable[str], num_running: int = 0) -> float:
        """``user``'s queue went from empty to non-empty: if it was idle (``num_running``: its requests
        running now, none), lift it to max(own, min over backlogged); a busy user keeps its counter.

        ``backlogged_users`` are the users with queued requests (``user`` itself is ignored). When no
        one else is backlogged we lift to the counter of the user that last left the backlog (see
        ``on_drained``), so a user returning from idle cannot bank credit against users whose
        requests are still running. Returns the user's counter.
        """
        if num_running > 0 and user in self._counters:
            return self._counters[user]
        others = [self.counter(u) for u in backlogged_users if u != user]
        floor = min(others) if others else self._last_left
        value = max(self.counter(user), floor)
        self._counters[user] = value
        return value

    def on_drained(self, user: str) -> None:
        """``user``'s queue went from non-empty to empty (its last request was admitted or dropped)."""
        self._last_left = self.counter(user)

    def pick(self, users_with_queued: Sequence[str]) -> str:
        """The user to serve next: lowest counter; ties go to the earlier user in the given order
        (pass them ordered by head arrival, as ClassQueue's pick callback receives them)."""
        if not users_with_queued:
            raise ValueError("no users to pick from")
        known = [self._counters[u] for u in users_with_queued if u in self._counters]
        for u in users_with_queued:  # never seen (on_backlogged not called): lift like a newcomer
            if u not in self._counters:
                self._counters[u] = min(known) if known else self._last_left
        return min(users_with_queued, key=self.counter)

    def __len__(self) -> int:
        return len(self._counters)

    def forget_idle(self, active: Iterable[str]) -> int:
        """Drop the counters of users outside ``active`` (nothing queued or running in the class) that are at
        most the floor a return from idle lifts a user to: such a user comes back at that floor whether its
        counter is kept or not. Users who got more (their service ahead of the floor) keep theirs. Without it
        the map held every name ever seen (a keyless client's per-conversation ``user``), copied for the stats
        every 50 ms. Returns how many went."""
        live = set(active)
        floor = min((self._counters[u] for u in live if u in self._counters), default=self._last_left)
        gone = [u for u, c in self._counters.items() if u not in live and c <= floor]
        for u in gone:
            del self._counters[u]
        # not due again before a quarter more has come (those left are active, or ahead of the floor)
        self.prune_above = max(IDLE_COUNTERS_KEPT, len(self._counters) + IDLE_COUNTERS_KEPT // 4)
        return len(gone)

    def snapshot(self) -> dict[str, float]:
        """Counters by user, for stats and the TUI."""
        return dict(self._counters)
