"""The soak's background side: indexing, prompt jobs and policy swaps, until ``stop`` is set.

An indexing job indexes a folder of generated notes into the ``soak`` collection (which the search
clients query); when it is done, some notes change and a new run starts, so the background class is
busy all along. A prompt job runs every 20 s, and the policy is swapped between its two variants every
``swap_every_s``. At the stop, running jobs get a minute to finish and are deleted otherwise (which
cancels their requests: those must be metered as aborted, not lost).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from homeai.bench.soak_policy import soak_policy_yaml
from homeai.bench.soak_traffic import COLLECTION, sentence

NUM_NOTES = 60
CHANGED_PER_RUN = 15
PROMPT_EVERY_S = 20.0
FINISH_TIMEOUT_S = 60.0


class JobDriver:
    def __init__(self, client: httpx.AsyncClient, stop: asyncio.Event, docs: Path, swap_every_s: float,
                 seed: int = 0) -> None:
        self.client, self.stop, self.docs, self.swap_every_s = client, stop, docs, swap_every_s
        self.rng = random.Random(seed + 1)
        self.outcomes: Counter[str] = Counter()
        self._job_ids: list[int] = []

    async def run(self) -> None:
        self._write_notes(range(NUM_NOTES))
        await asyncio.gather(self._indexing(), self._prompts(), self._swaps())
        await self._finish_jobs()

    def summary(self) -> dict[str, int]:
        return dict(sorted(self.outcomes.items()))

    # ---- the three loops -------------------------------------------------------------------------
    async def _indexing(self) -> None:
        while not self.stop.is_set():
            job_id = await self._add({"kind": "index", "path": str(self.docs), "collection": COLLECTION})
            if job_id is None:
                await self._pause(5.0)
                continue
            state = await self._wait_job(job_id, until_stop=True)
            self.outcomes[f"index_{state}"] += 1
            self._write_notes(self.rng.sample(range(NUM_NOTES), CHANGED_PER_RUN))

    async def _prompts(self) -> None:
        while not await self._pause(PROMPT_EVERY_S):
            body = {"kind": "prompt", "prompt": f"Summarize: {sentence(self.rng, 12)}", "max_tokens": 8,
                    "class": "chat", "user": "digest"}
            self.outcomes["prompt_added" if await self._add(body) is not None else "prompt_refused"] += 1

    async def _swaps(self) -> None:
        variant = 0
        while not await self._pause(self.swap_every_s):
            variant += 1
            try:
                r = await self.client.put("/admin/policy", content=soak_policy_yaml(variant),
                                          headers={"Content-Type": "application/yaml"})
                self.outcomes["policy_swaps" if r.status_code == 200 else f"policy_swap_{r.status_code}"] += 1
            except httpx.HTTPError:
                self.outcomes["policy_swap_transport"] += 1

    # ---- helpers ---------------------------------------------------------------------------------
    async def _pause(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True once the soak is stopping."""
        try:
            await asyncio.wait_for(self.stop.wait(), seconds)
        except TimeoutError:
            return False
        return True

    async def _add(self, body: dict[str, Any]) -> int | None:
        try:
            r = await self.client.post("/v1/jobs", json=body)
        except httpx.HTTPError:
            return None
        if r.status_code != 201:
            self.outcomes[f"job_add_{r.status_code}"] += 1
            return None
        job_id = int(r.json()["id"])
        self._job_ids.append(job_id)
        return job_id

    async def _state(self, job_id: int) -> str:
        try:
            r = await self.client.get(f"/v1/jobs/{job_id}")
        except httpx.HTTPError:
            return "unknown"
        return str(r.json()["state"]) if r.status_code == 200 else "deleted"

    async def _wait_job(self, job_id: int, until_stop: bool) -> str:
        """The job's state once it is done or failed (or "running" when the soak stops first)."""
        while True:
            state = await self._state(job_id)
            if state in ("done", "failed", "deleted") or (until_stop and self.stop.is_set()):
                return state
            await asyncio.sleep(0.5)

    async def _finish_jobs(self) -> None:
        """Give the jobs a minute to finish, then delete what still runs; count the final states."""
        deadline = time.monotonic() + FINISH_TIMEOUT_S
        for job_id in self._job_ids:
            state = await self._state(job_id)
            while state in ("queued", "running") and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
                state = await self._state(job_id)
            if state in ("queued", "running"):
                await self.client.delete(f"/v1/jobs/{job_id}")
                self.outcomes["jobs_deleted_at_stop"] += 1
                state = "deleted"
            self.outcomes[f"jobs_{state}"] += 1

    def _write_notes(self, indices: Any) -> None:
        self.docs.mkdir(parents=True, exist_ok=True)
        for i in indices:
            body = "\n\n".join(sentence(self.rng, 30) for _ in range(4))
            (self.docs / f"note{i:03d}.txt").write_text(f"Note {i}, version {time.time_ns()}.\n\n{body}\n")
