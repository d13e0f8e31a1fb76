"""`homeai bench engine --trace household`: the household mix, shortened, on the real engine.

The same trace generator and figures as the simulator, but every request runs on the real model and
encoder through the class scheduler, the batcher and the device loop, in real time. Ours and FIFO run
one after the other in one process; each also runs without the background work (for the voice TTFT
ratio) and the background alone (for the throughput ratio).
"""

from __future__ import annotations

import asyncio
import copy
import random
import time
from pathlib import Path
from typing import Any

from homeai.core.types import SamplingParams
from homeai.engine.builder import EngineConfig, build_llm_engine
from homeai.engine.device_loop import DeviceLoop
from homeai.engine.embed_service import EmbedService
from homeai.policy.loader import load_policy
from homeai.policy.schema import Policy
from homeai.runtime.embedder import Embedder
from homeai.scheduling.batcher import Batcher
from homeai.scheduling.class_queue import QueueFullError
from homeai.scheduling.class_scheduler import ClassScheduler
from homeai.scheduling.step_budget import load_step_cost
from homeai.sim.household import class_figures, fifo_mapping, jain_chat, ours_mapping, single_queue_policy
from homeai.sim.simulator import FAKE_TOKEN, Mapping, RequestRecord, SimResult
from homeai.sim.trace import TraceRequest, household

BACKGROUND_CONCURRENCY = 2


def small_household(horizon_s: float, seed: int = 0) -> list[TraceRequest]:
    """The household trace scaled to what a 2-core CPU serves: fewer, shorter requests."""
    reqs = household(horizon_s, seed, index_chunks=4000, summaries=40)
    rng = random.Random(seed)
    out = []
    for r in reqs:
        r = copy.copy(r)
        if r.kind == "llm":
            r.prompt_tokens = max(8, r.prompt_tokens // 4)
            r.max_tokens = max(4, r.max_tokens // 4)
        if r.class_name == "chat" and rng.random() < 0.75:
            continue  # a quarter of the chat load: dad still sends 8x teen's
        if r.class_name == "indexing" and r.input_tokens:
            r.input_tokens = [n // 2 for n in r.input_tokens[:16]]
        out.append(r)
    return out


class RealReplay:
    """One policy's run: its own scheduler, batcher and device loop over shared model weights."""

    def __init__(self, policy: Policy, mapping: Mapping, llm_folder: Path, embedder: Embedder,
                 embed_model: str, calibration: Path | None = None) -> None:
        self.mapping = mapping
        # Seeded as the server seeds it (this machine's `homeai bench calibrate`), fitted online after.
        scheduler = ClassScheduler(None, policy, step_cost=load_step_cost(calibration) if calibration else None)
        self.engine = build_llm_engine(llm_folder, EngineConfig(kv_cache_mb=128), scheduler)
        self.batcher = Batcher(policy, scheduler)
        self.embed = EmbedService(self.batcher, {embed_model: embedder}, self.engine.wake)
        self.loop = DeviceLoop(llm=self.engine, batcher=self.batcher, embed=self.embed)
        self.records: list[RequestRecord] = []
        self.processed: dict[str, int] = {}

    async def _one(self, req: TraceRequest, t0: float) -> None:
        rec = RequestRecord(req)
        self.records.append(rec)
        cls, level, user = self.mapping(req)
        try:
            if req.kind == "llm":
                params = SamplingParams(temperature=0.0, max_tokens=req.max_tokens, ignore_eos=True)
                stream = self.engine.generate([FAKE_TOKEN] * req.prompt_tokens, params, class_name=cls, user=user,
                                              priority_level=level or None)
                async for delta in stream:
                    now = time.monotonic() - t0
                    rec.token_times.extend([now] * len(delta.token_ids))
                    if rec.first_s is None and delta.token_ids:
                        rec.first_s = now
                        self._count(req.class_name, req.prompt_tokens)
                    self._count(req.class_name, len(delta.token_ids))
                    if delta.error:
                        rec.rejected = delta.error
                rec.done_s = time.monotonic() - t0
            else:
                assert req.input_tokens is not None
                rows = [[101] + [2000] * (n - 2) + [102] for n in req.input_tokens]
                await self.embed.embed(cls, rows, user, priority_level=level)
                rec.first_s = rec.done_s = time.monotonic() - t0
                self._count(req.class_name, sum(req.input_tokens))
        except QueueFullError:
            rec.rejected = "queue_full"

    def _count(self, class_name: str, num_tokens: int) -> None:
        self.processed[class_name] = self.processed.get(class_name, 0) + num_tokens

    async def _background(self, reqs: list[TraceRequest], t0: float, horizon_s: float) -> None:
        pending = list(reqs)
        while pending and time.monotonic() - t0 < horizon_s:
            req = copy.copy(pending.pop(0))
            req.arrival_s = time.monotonic() - t0
            await self._one(req, t0)

    async def run(self, trace: list[TraceRequest], horizon_s: float) -> SimResult:
        self.loop.start()
        t0 = time.monotonic()
        tasks = []
        for cls in ("indexing", "summarize"):
            reqs = [r for r in trace if r.class_name == cls]
            for k in range(BACKGROUND_CONCURRENCY):
                tasks.append(asyncio.create_task(self._background(reqs[k::BACKGROUND_CONCURRENCY], t0, horizon_s)))
        for req in sorted((r for r in trace if not r.background), key=lambda r: r.arrival_s):
            await asyncio.sleep(max(0.0, req.arrival_s - (time.monotonic() - t0)))
            tasks.append(asyncio.create_task(self._one(req, t0)))
        await asyncio.sleep(max(0.0, horizon_s - (time.monotonic() - t0)))
        for task in tasks:
            task.cancel()  # whatever has not finished by the horizon is aborted (its KV freed)
        await asyncio.gather(*tasks, return_exceptions=True)
        self.loop.shutdown()
        return SimResult(self.records, horizon_s, dict(self.processed))


def run_household_engine(policy_path: Path, llm_folder: Path, embed_folder: Path, embed_model: str,
                         horizon_s: float = 30.0, log: Any = print, calibration: Path | None = None) -> dict[str, Any]:
    """Ours and FIFO, each with and without background; ``voice_ttft_p99_ratio`` is ours (mix / quiet),
    ``fifo_over_ours_voice_ttft_p99_ratio`` FIFO's ratio over ours, ``fifo_over_ours_voice_ttft_p99_s``
    FIFO's voice TTFT p99 in the mix over ours. The load average is noted: ratios count, not seconds."""
    import os

    import torch

    load_start = os.getloadavg()

    ours = load_policy(policy_path)
    embedder = Embedder.load(embed_folder, torch.device("cpu"))
    mix = small_household(horizon_s)
    quiet = [r for r in mix if not r.background]
    alone = [r for r in mix if r.background]
    report: dict[str, Any] = {}
    for name, policy, mapping in (("ours", ours, ours_mapping), ("fifo", single_queue_policy(ours, 1), fifo_mapping)):
        runs = {}
        for label, trace in (("mix", mix), ("quiet", quiet), ("alone", alone)):
            log(f"{name}: {label} ({horizon_s:.0f} s)")
            replay = RealReplay(copy.deepcopy(policy), mapping, llm_folder, embedder, embed_model, calibration)
            runs[label] = asyncio.run(replay.run(trace, horizon_s))
        figs = class_figures(runs["mix"])
        v_mix = figs.get("voice", {}).get("ttft_p99_s")
        v_quiet = class_figures(runs["quiet"]).get("voice", {}).get("ttft_p99_s")
        bg = [sum(runs[k].processed_tokens.get(c, 0) for c in ("indexing", "summarize")) for k in ("mix", "alone")]
        report[name] = {"voice_ttft_p99_ratio": v_mix / v_quiet if v_mix and v_quiet else None,
                        "voice_ttft_p99_s": v_mix, "voice_ttft_p99_quiet_s": v_quiet,
                        "background_throughput_ratio": bg[0] / bg[1] if bg[1] else None,
                        "jain_chat": jain_chat(runs["mix"]), "classes": figs}
    out = dict(report["ours"])
    ours, fifo = report["ours"], report["fifo"]
    ratio = "voice_ttft_p99_ratio"
    out.update({"fifo_over_ours_voice_ttft_p99_ratio": _over(fifo[ratio], ours[ratio]),
                "fifo_over_ours_voice_ttft_p99_s": _over(fifo["voice_ttft_p99_s"], ours["voice_ttft_p99_s"]),
                "horizon_s": horizon_s, "profile": "real engine", "threads": torch.get_num_threads(),
                "calibrated": bool(calibration and calibration.exists()),
                "load_avg_1m": [round(load_start[0], 2), round(os.getloadavg()[0], 2)],
                "baselines": {"fifo": fifo}})
    return out


def _over(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None
