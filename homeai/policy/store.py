"""The running policy, swapped atomically.

Readers (the API routing a request, the scheduler planning a step) take ``holder.current`` once and
use that object: a Policy is immutable, so a swap can never show anyone half of an old and half of a
new policy. The scheduler subscribes and applies the new limits from its next step; requests already
queued keep their place.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from homeai.policy.schema import Policy

log = logging.getLogger(__name__)

Listener = Callable[[Policy, int], None]


class PolicyHolder:
    """Holds the current Policy and a swap counter; tells listeners about every swap, in order."""

    def __init__(self, policy: Policy, source: str | None = None) -> None:
        self._policy = policy
        self._version = 1
        self._source = source
        self._lock = threading.RLock()
        self._listeners: list[Listener] = []

    @property
    def current(self) -> Policy:
        """The policy now in force (one reference read: no lock needed)."""
        return self._policy

    @property
    def version(self) -> int:
        """Starts at 1 and grows by one at each swap (not the file's ``version`` field)."""
        return self._version

    @property
    def source(self) -> str | None:
        """Where the current policy came from (a path), if known."""
        return self._source

    def swap(self, new_policy: Policy, source: str | None = None) -> int:
        """Make ``new_policy`` current and notify listeners; returns the new swap version.

        Listeners run under the lock so that they see swaps in version order; a failing listener is
        logged and does not undo the swap or stop the others.
        """
        if not isinstance(new_policy, Policy):
            raise TypeError(f"expected a Policy, got {type(new_policy).__name__}")
        with self._lock:
            self._policy = new_policy
            self._version += 1
            if source is not None:
                self._source = source
            version = self._version
            for listener in list(self._listeners):
                try:
                    listener(new_policy, version)
                except Exception:
                    log.exception("policy listener %r failed on version %d", listener, version)
            return version

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener(policy, version)`` after every swap; returns a function that unsubscribes."""
        with self._lock:
            self._listeners.append(listener)

        def unsubscribe() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return unsubscribe

