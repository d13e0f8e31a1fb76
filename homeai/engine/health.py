"""How the device loop is doing: failures by cause, and whether it keeps failing.

A failed LLM step or embedding batch ends only its own requests (see ``LLMEngine.step`` and
``EmbedService.run``); this record is how a supervisor still notices: ``/readyz`` says not ready while
the engine fails over and over, and ``/metrics`` counts failures by part and cause. Written by the
device thread only; other threads read plain ints and strings (a snapshot may be one failure behind).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

FAILING_AFTER = 3  # this many failures in a row, with no success between: the engine is failing
FAILING_FOR_S = 60.0  # ...and the last one this recent (an engine that failed, then went idle, recovers)


class EngineHealth:
    """Failure counts by (part, cause) and the current run of failures without a success."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.errors: Counter[tuple[str, str]] = Counter()  # (part, exception type) -> count
        self.consecutive_failures = 0
        self.last_error: str | None = None
        self.last_error_s: float | None = None

    def failed(self, part: str, exc: BaseException) -> None:
        """Record a failure of ``part`` ("llm_step", "embed_batch", "loop")."""
        self.errors[(part, type(exc).__name__)] += 1
        self.consecutive_failures += 1
        self.last_error = f"{part}: {type(exc).__name__}: {exc}"
        self.last_error_s = self._clock()

    def succeeded(self) -> None:
        self.consecutive_failures = 0

    @property
    def failing(self) -> bool:
        """True while the last ``FAILING_AFTER`` attempts failed and the last one is recent."""
        return (self.consecutive_failures >= FAILING_AFTER and self.last_error_s is not None
                and self._clock() - self.last_error_s <= FAILING_FOR_S)

    def error_list(self) -> list[dict[str, str | int]]:
        return [{"part": part, "cause": cause, "count": n} for (part, cause), n in sorted(self.errors.items())]
