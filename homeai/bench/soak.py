"""`homeai bench soak`: every class at once against a real server, then what it leaked.

For ``minutes``, the clients of ``soak_traffic`` run (streams dropped mid-way, 429 storms), the policy
is swapped every 30 s, an indexing job re-indexes a changing folder and prompt jobs run. Then the soak
stops its clients, waits for the server to go idle and reports, as one JSON object:

    rss_growth_mb      server RSS at the end minus after the warm-up (the first quarter, at most 30 s)
    open_fds_growth    open descriptors of the server, the same two moments
    leaked_kv_blocks   KV blocks still in use once nothing runs or waits
    lost_requests      submissions the gateway metered as started minus those it metered as ended
    request_log_rows   rows in the request log, next to ``finished`` (requests metered as ended)

plus what the clients saw. The figures are measured, never judged here: tests and people judge them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine, text

from homeai.bench.soak_jobs import JobDriver
from homeai.bench.soak_traffic import Traffic
from homeai.store.db import Store

IDLE_TIMEOUT_S = 120.0
LOG_FLUSH_TIMEOUT_S = 20.0
Log = Callable[[str], None]


@dataclass(slots=True)
class SoakConfig:
    url: str
    pid: int
    database_url: str
    work_dir: Path
    minutes: float = 10.0
    swap_every_s: float = 30.0
    seed: int = 0


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    raise RuntimeError(f"no VmRSS for process {pid}")


def num_fds(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def metered_counts(metrics_text: str) -> tuple[int, dict[str, dict[str, int]]]:
    """(requests started, {class: {status: finished}}) from the Prometheus text."""
    started, finished = 0, dict[str, dict[str, int]]()
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == "homeai_requests_started_total":
                started += int(sample.value)
            elif sample.name == "homeai_requests_total":
                by_status = finished.setdefault(sample.labels["class_name"], {})
                by_status[sample.labels["status"]] = int(sample.value)
    return started, finished


def request_log_rows(database_url: str) -> int:
    engine = create_engine(Store(database_url).sync_url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT COUNT(*) FROM request_log")).scalar_one())
    finally:
        engine.dispose()


async def wait_idle(client: httpx.AsyncClient) -> dict[str, Any]:
    """The /v1/stats document once nothing runs, waits, holds a KV block or is metered as live; at the
    timeout, whatever is still held then (a leak, not a slow release)."""
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    while True:
        stats = (await client.get("/v1/stats")).json()
        busy = any(c.get("running", 0) or c.get("queued", 0) for c in stats["classes"].values())
        if (not busy and not kv_blocks_in_use(stats) and stats.get("num_live_requests", 0) == 0) \
                or time.monotonic() > deadline:
            return dict(stats)
        await asyncio.sleep(0.5)


def kv_blocks_in_use(stats: dict[str, Any]) -> int:
    return sum(round(d.get("kv_usage", 0.0) * d.get("kv_blocks", 0)) for d in stats.get("device", {}).values())


async def _run(cfg: SoakConfig, log: Log) -> dict[str, Any]:
    duration_s = cfg.minutes * 60.0
    warmup_s = min(30.0, duration_s / 4)
    stop = asyncio.Event()
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=16)
    async with httpx.AsyncClient(base_url=cfg.url, timeout=180.0, limits=limits) as client:
        traffic = Traffic(client, stop, cfg.seed)
        jobs = JobDriver(client, stop, cfg.work_dir / "docs", cfg.swap_every_s, cfg.seed)
        tasks = [asyncio.create_task(traffic.run()), asyncio.create_task(jobs.run())]
        started_s = time.monotonic()
        await asyncio.sleep(warmup_s)
        rss_start, fds_start = rss_mb(cfg.pid), num_fds(cfg.pid)
        log(f"soak: warm after {warmup_s:.0f} s (rss {rss_start:.0f} MB, {fds_start} fds); running "
            f"{duration_s - warmup_s:.0f} s more")
        await asyncio.sleep(max(0.0, duration_s - (time.monotonic() - started_s)))
        stop.set()
        log("soak: stopping clients and jobs")
        await asyncio.gather(*tasks)
        stats = await wait_idle(client)
        started, finished = metered_counts((await client.get("/metrics")).text)
    num_finished = sum(sum(s.values()) for s in finished.values())
    deadline = time.monotonic() + LOG_FLUSH_TIMEOUT_S
    while (rows := request_log_rows(cfg.database_url)) < num_finished and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
    rss_end, fds_end = rss_mb(cfg.pid), num_fds(cfg.pid)
    return {
        "minutes": cfg.minutes, "duration_s": round(time.monotonic() - started_s, 1),
        "rss_start_mb": round(rss_start, 1), "rss_end_mb": round(rss_end, 1),
        "rss_growth_mb": round(rss_end - rss_start, 1),
        "open_fds_start": fds_start, "open_fds_end": fds_end, "open_fds_growth": fds_end - fds_start,
        "leaked_kv_blocks": kv_blocks_in_use(stats),
        "submitted": started, "finished": num_finished, "lost_requests": started - num_finished,
        "live_requests_at_end": stats.get("num_live_requests", 0),
        "request_log_rows": rows,
        "finished_by_class": finished,
        "client": traffic.tally.to_dict(), "client_requests": traffic.tally.total(),
        "jobs": jobs.summary(),
    }


def run_soak(cfg: SoakConfig, log: Log = lambda _m: None) -> dict[str, Any]:
    """Run the soak against the server at ``cfg.url`` (process ``cfg.pid``); returns the report."""
    if not cfg.minutes > 0:
        raise ValueError(f"minutes must be positive, got {cfg.minutes}")
    return asyncio.run(_run(cfg, log))
