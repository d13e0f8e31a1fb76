"""Job traffic is metered like HTTP traffic (unmetered, a job's load was invisible to stats and the
request log): a real indexing job shows up in
/v1/stats (indexing class, user ``indexer``), in the /metrics series of the indexing class and as
request-log rows, one per request the job made; a prompt job is logged as its user; and an HTTP
request is counted exactly once (the handlers no longer meter on their own).

The server is the session's jobs server, so counts are taken as differences around each action.
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import httpx
import pytest
from server_launcher import ServerProcess
from sqlalchemy import text
from waiting import wait_until

from tests.integration.jobs.conftest import add_job, database, wait_job

pytestmark = pytest.mark.slow  # the jobs server serves the real models

LOG_WAIT_S = 15.0  # the request log is written in batches off the request path


def indexing_requests(http: httpx.Client) -> dict[str, int]:
    stats = http.get("/v1/stats")
    assert stats.status_code == 200, stats.text
    return dict(stats.json()["classes"]["indexing"]["requests"])


def log_rows(server: ServerProcess, where: str, **params: str) -> int:
    engine = database(server)
    try:
        with engine.connect() as conn:
            return int(conn.execute(text(f"SELECT COUNT(*) FROM request_log WHERE {where}"), params).scalar_one())
    finally:
        engine.dispose()


def wait_log_rows(server: ServerProcess, where: str, expected: int, **params: str) -> int:
    """The row count once it reaches ``expected`` (the log is written in batches off the request path)."""
    wait_until(lambda: log_rows(server, where, **params) >= expected, LOG_WAIT_S, interval_s=0.2,
               what=lambda: f"{expected} request-log rows where {where} (now {log_rows(server, where, **params)})")
    return log_rows(server, where, **params)


def wait_log_written(http: httpx.Client, server: ServerProcess) -> None:
    """Until every request that ended before now has its request-log row: the log is one writer taking
    rows in order, so once the row of a request made now is there, so is every row queued before it."""
    marker = f"marker-{uuid.uuid4().hex[:6]}"
    emb = {"model": "all-minilm-l6-v2", "input": "marker"}
    assert http.post("/v1/embeddings", json=emb, headers={"X-HomeAI-User": marker}).status_code == 200
    wait_log_rows(server, "\"user\" = :user", 1, user=marker)


def metric(body: str, name: str, **labels: str) -> float:
    """The value of one Prometheus sample (labels in any order), 0 when absent."""
    for line in body.splitlines():
        match = re.match(rf"{name}\{{(.*)\}} (\S+)$", line)
        if match and all(f'{k}="{v}"' in match.group(1) for k, v in labels.items()):
            return float(match.group(2))
    return 0.0


def test_an_indexing_job_is_metered_in_stats_metrics_and_the_request_log(
        http: httpx.Client, jobs_server: ServerProcess, tmp_path: Path) -> None:
    root = tmp_path / "notes"
    root.mkdir()
    for i in range(12):  # HOMEAI_INDEX_BATCH_CHUNKS is 8 here: at least two indexing requests
        (root / f"note{i}.txt").write_text(f"Note {i}: the plants on the balcony need water every {i + 2} days.")
    before = indexing_requests(http)
    rows_before = log_rows(jobs_server, "class_name = 'indexing'")

    job = wait_job(http, add_job(http, kind="index", path=str(root), collection=f"notes-{uuid.uuid4().hex[:6]}")["id"])
    assert job["progress"]["done_chunks"] >= 12

    after = indexing_requests(http)
    num_ok = after.get("ok", 0) - before.get("ok", 0)
    num_all = sum(after.values()) - sum(before.values())
    assert num_ok >= 2, (before, after)
    stats = http.get("/v1/stats").json()
    assert stats["users"]["indexer"]["prompt_tokens"] > 0
    recent = [r for r in stats["recent"] if r["class_name"] == "indexing"]
    assert recent and all(r["user"] == "indexer" and r["kind"] == "embedding" for r in recent)

    event = http.get("/v1/stats/stream", params={"count": 1})  # what the TUI draws
    data = next(line[len("data:"):] for line in event.text.splitlines() if line.startswith("data:"))
    streamed = json.loads(data)
    assert streamed["classes"]["indexing"]["requests"]["ok"] == after["ok"]
    assert streamed["users"]["indexer"]["prompt_tokens"] == stats["users"]["indexer"]["prompt_tokens"]

    metrics = http.get("/metrics").text
    assert metric(metrics, "homeai_requests_total", class_name="indexing", status="ok") == after["ok"]
    assert metric(metrics, "homeai_prompt_tokens_total", class_name="indexing", user="indexer") > 0
    assert metric(metrics, "homeai_e2e_seconds_count", class_name="indexing") >= after["ok"]

    wait_log_rows(jobs_server, "class_name = 'indexing'", rows_before + num_all)
    wait_log_written(http, jobs_server)  # a duplicate row would be there by now
    assert log_rows(jobs_server, "class_name = 'indexing'") - rows_before == num_all
    assert log_rows(jobs_server, "class_name = 'indexing' AND \"user\" = 'indexer' AND kind = 'embedding' "
                                 "AND num_prompt_tokens > 0 AND status = 'ok'") >= num_ok


def test_a_prompt_job_is_logged_as_its_user(http: httpx.Client, jobs_server: ServerProcess) -> None:
    user = f"digest-{uuid.uuid4().hex[:6]}"
    wait_job(http, add_job(http, kind="prompt", prompt="Say hi.", max_tokens=4, user=user, **{"class": "chat"})["id"])
    where = "\"user\" = :user AND class_name = 'chat' AND kind = 'chat' AND status = 'ok' AND num_output_tokens > 0"
    assert wait_log_rows(jobs_server, where, 1, user=user) == 1


def test_http_requests_are_counted_once(http: httpx.Client, jobs_server: ServerProcess) -> None:
    user = f"once-{uuid.uuid4().hex[:6]}"
    headers = {"X-HomeAI-User": user}
    chat = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
    assert http.post("/v1/chat/completions", json=chat, headers=headers).status_code == 200
    with http.stream("POST", "/v1/chat/completions", json={**chat, "stream": True}, headers=headers) as r:
        assert r.status_code == 200 and "[DONE]" in r.read().decode()
    ollama = {"model": "smollm2-135m-instruct", "prompt": "Hi", "options": {"num_predict": 3}}
    assert http.post("/api/generate", json=ollama, headers=headers).status_code == 200
    emb = {"model": "all-minilm-l6-v2", "input": ["one", "two"]}
    assert http.post("/v1/embeddings", json=emb, headers=headers).status_code == 200

    recent = [r for r in http.get("/v1/stats").json()["recent"] if r["user"] == user]
    assert sorted(r["kind"] for r in recent) == ["chat", "chat", "completion", "embedding"]
    assert all(r["status"] == "ok" for r in recent)
    assert wait_log_rows(jobs_server, "\"user\" = :user", 4, user=user) == 4
    wait_log_written(http, jobs_server)  # a duplicate would have been queued before the marker
    assert log_rows(jobs_server, "\"user\" = :user", user=user) == 4
