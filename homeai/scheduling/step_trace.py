"""A step-by-step record of what the planner predicted and what the device took, for finding where a
class's latency goes on a real server: ``HOMEAI_STEP_TRACE=FILE homeai serve`` appends one JSON line per
LLM step (its end on the scheduler's clock, the gap since the previous step ended, the predicted and the
measured duration, rows, tokens, context, and the tokens of each class). Off unless the variable is set."""

from __future__ import annotations

import json
import os
import threading
from collections import Counter
from typing import IO

from homeai.core.types import StepPlan

STEP_TRACE_ENV = "HOMEAI_STEP_TRACE"


class StepTrace:
    def __init__(self, out: IO[str]) -> None:
        self._out = out
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls) -> StepTrace | None:
        path = os.environ.get(STEP_TRACE_ENV)
        return cls(open(path, "a", buffering=1)) if path else None  # noqa: SIM115 - open for the process

    def record(self, end_s: float, gap_s: float, predicted_s: float, took_s: float, rows: int, tokens: int,
               ctx: int, plan: StepPlan, class_of: dict[int, str]) -> None:
        by_class: Counter[str] = Counter()
        for chunk in plan.chunks:
            by_class[class_of.get(chunk.seq_id, "?")] += chunk.num_tokens
        line = {"end": round(end_s, 4), "gap": round(gap_s, 4), "pred": round(predicted_s, 4),
                "took": round(took_s, 4), "rows": rows, "tokens": tokens, "ctx": ctx, "classes": by_class}
        with self._lock:
            self._out.write(json.dumps(line) + "\n")
