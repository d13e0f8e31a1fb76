"""One VTC counter per user and class across the cluster.

Each replica's class scheduler orders its queues by its own VTC counters, which only see the service given
there: a user with requests on two replicas would get their weight's share on each, twice what the policy
says when both are busy. The front door sees every token of every replica, so it keeps the one number, the
service each user received anywhere (the same weighted tokens: prompt x w_in + output x w_out, over the
user's weight), and every replica raises its counters to it at each load poll (``VirtualTokenCounter.
raise_to``): a user served elsewhere waits on this replica as if served here.
"""

from __future__ import annotations

import threading

from homeai.policy.schema import Policy
from homeai.scheduling.fairness import VirtualTokenCounter


class SharedCounters:
    """Thread-safe: charged from the event loop, read by the membership thread."""

    def __init__(self, policy: Policy) -> None:
        self._lock = threading.Lock()
        self._vtc: dict[str, VirtualTokenCounter] = {}
        self.apply_policy(policy)

    def apply_policy(self, policy: Policy) -> None:
        with self._lock:
            for name, cp in policy.classes.items():
                if cp.kind != "llm":
                    continue
                vtc = self._vtc.get(name) or VirtualTokenCounter()
                vtc.apply_policy(policy, name)
                self._vtc[name] = vtc
            for name in [n for n in self._vtc if n not in policy.classes]:
                del self._vtc[name]

    def charge(self, class_name: str, user: str, input_tokens: int = 0, output_tokens: int = 0) -> None:
        with self._lock:
            vtc = self._vtc.get(class_name)
            if vtc is not None:
                vtc.charge(user, input_tokens, output_tokens)

    def snapshot(self) -> dict[str, dict[str, float]]:
        """class -> user -> service, what each replica takes."""
        with self._lock:
            return {name: vtc.snapshot() for name, vtc in self._vtc.items()}
