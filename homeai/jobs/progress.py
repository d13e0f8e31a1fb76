"""Progress of a running job: done and total chunks and files, the rate of this run, and an ETA.

The counts are also in the job's row (committed with each file); the rate and ETA exist only while the
run is alive, measured from the run's own start, so a resumed job does not count work it skipped.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Progress:
    done_chunks: int = 0
    total_chunks: int = 0
    done_files: int = 0
    total_files: int = 0
    phase: str = "planning"  # planning (reading and hashing files), indexing, done
    clock: Callable[[], float] = time.monotonic
    started_s: float = field(default=0.0)
    run_chunks: int = 0  # chunks embedded by this run

    def __post_init__(self) -> None:
        self.started_s = self.clock()

    def begin_indexing(self) -> None:
        """Planning is over: the rate counts from now (reading and hashing files embeds nothing)."""
        self.phase = "indexing"
        self.started_s = self.clock()

    def add(self, num_chunks: int, num_files: int = 1) -> None:
        self.done_chunks += num_chunks
        self.done_files += num_files
        self.run_chunks += num_chunks

    def rate(self) -> float:
        """Chunks per second since this run started."""
        elapsed_s = self.clock() - self.started_s
        return self.run_chunks / elapsed_s if elapsed_s > 0 else 0.0

    def eta_s(self) -> float | None:
        remaining = self.total_chunks - self.done_chunks
        if remaining <= 0:
            return 0.0 if self.phase != "planning" else None
        rate = self.rate()
        return remaining / rate if rate > 0 else None

    def to_dict(self) -> dict[str, Any]:
        eta = self.eta_s()
        return {"done_chunks": self.done_chunks, "total_chunks": self.total_chunks,
                "done_files": self.done_files, "total_files": self.total_files, "phase": self.phase,
                "chunks_per_s": round(self.rate(), 3), "eta_s": None if eta is None else round(eta, 1)}
