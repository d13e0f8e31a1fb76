"""`homeai bench calibrate`: fit the simulator's cost model on the real runtime of this machine.

Times LLM steps of known shape (decodes of 1..32 sequences, prefill chunks of 64..512 tokens) and
embedding batches, then fits the linear cost model by least squares. The profile is written to the cache
dir (``calibration.json``): the server's step planner starts from it instead of a generic default.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from homeai.core.types import SamplingParams
from homeai.scheduling.step_budget import CALIBRATION_FILE
from homeai.sim.cost_model import CostModel


def add_calibrate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, help="write the profile JSON here (default: calibration.json in the cache "
                   "dir, where the server seeds its step cost model from; the online fit takes over)")
    p.add_argument("--device")
    p.add_argument("--repeats", type=int, default=3)


def _time_llm(engine, num_seqs: int, prompt_len: int, decode_steps: int) -> list[tuple[int, int, int, float]]:

    sched, rows = engine.scheduler, []
    for i in range(num_seqs):
        seq = engine.make_sequence([100 + i] * prompt_len, SamplingParams(temperature=0, max_tokens=decode_steps + 1,
                                                                          ignore_eos=True))
        sched.add(seq)
    while sched.has_work():
        plan = sched.schedule()
        ctx = sum(c.start + c.num_tokens for c in plan.chunks)
        t0 = time.perf_counter()
        out = engine.runner.execute(plan, sched.seqs)
        rows.append((plan.num_tokens, len(plan.chunks), ctx, time.perf_counter() - t0))
        sched.update(plan, out)
    return rows


def run_calibrate(args: argparse.Namespace) -> int:
    from homeai.engine.builder import EngineConfig, build_llm_engine
    from homeai.repository.cache import default_cache_dir
    from homeai.repository.entries import get_entry
    from homeai.repository.pull import pull
    from homeai.runtime.device import choose_device
    from homeai.runtime.embedder import Embedder

    cache = default_cache_dir()
    engine = build_llm_engine(pull(get_entry("smollm2-135m-instruct"), cache),
                              EngineConfig(device=args.device, max_num_batched_tokens=512))
    rows = []
    for _ in range(args.repeats):
        for n, p in ((1, 64), (8, 64), (32, 32), (2, 512)):
            rows += _time_llm(engine, n, p, 8)
    a = np.array([[1.0, t, s, c] for t, s, c, _ in rows])
    y = np.array([r[3] for r in rows])
    coef = np.clip(np.linalg.lstsq(a, y, rcond=None)[0], 0, None)
    emb = Embedder.load(pull(get_entry("all-minilm-l6-v2"), cache), choose_device(args.device))
    erows = []
    for _ in range(args.repeats):
        for n in (1, 8, 32):
            ids = [[101] + [2000] * 62 + [102]] * n
            t0 = time.perf_counter()
            emb.embed(token_ids=ids)
            erows.append((64 * n, time.perf_counter() - t0))
    ea = np.array([[1.0, t] for t, _ in erows])
    ecoef = np.clip(np.linalg.lstsq(ea, np.array([d for _, d in erows]), rcond=None)[0], 0, None)
    model = CostModel(f"calibrated-{engine.runner.device}", float(coef[0]), float(coef[1]), float(coef[2]),
                      float(coef[3]), float(ecoef[0]), float(ecoef[1]))
    model.save(args.out or cache / CALIBRATION_FILE)
    print(json.dumps(asdict(model), indent=2))
    return 0
