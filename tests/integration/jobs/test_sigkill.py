"""Nothing lost: kill -9 the server in the middle of indexing a few hundred files, start it again, and
the job resumes by itself; its chunks then equal those of a clean run of the same folder, none
duplicated and none missing."""

from __future__ import annotations

import random
import time
from pathlib import Path

import httpx
import pytest
from server_launcher import ServerProcess
from sqlalchemy import text

from tests.integration.jobs.conftest import add_job, database, wait_job

NUM_FILES = 240
WORDS = ("apple river mountain tax garden recipe school holiday train music doctor invoice garage bicycle "
         "window letter insurance birthday piano football").split()


def write_folder(root: Path) -> None:
    rng = random.Random(5)
    for i in range(NUM_FILES):
        sub = root / f"box{i % 6}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"note{i:03d}.txt").write_text(f"Note {i}: " + " ".join(rng.choice(WORDS) for _ in range(24)))


def chunk_rows(server: ServerProcess, collection: str) -> list[tuple[str, int, str]]:
    """(document, ordinal, text) of every chunk of the collection, duplicates included."""
    engine = database(server)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text(
                "SELECT d.path, c.ordinal, c.text FROM chunks c JOIN documents d ON c.document_id = d.id "
                "JOIN collections k ON d.collection_id = k.id WHERE k.name = :name"), {"name": collection})
            return sorted((str(p), int(o), str(t)) for p, o, t in rows)
    finally:
        engine.dispose()


def kill_mid_run(server: ServerProcess, http: httpx.Client, job_id: int, timeout_s: float = 120.0) -> int:
    """SIGKILL once some files but not all are committed; returns how many were."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        progress = http.get(f"/v1/jobs/{job_id}").json()["progress"]
        if 0 < progress["done_files"] < NUM_FILES and progress["total_files"] == NUM_FILES:
            server.kill()
            return int(progress["done_files"])
        if progress["done_files"] >= NUM_FILES:
            pytest.fail("the job finished before it could be killed")
        time.sleep(0.02)
    pytest.fail("the job did not start committing files")


def test_sigkill_mid_run_then_restart_loses_and_duplicates_nothing(jobs_server: ServerProcess, tmp_path: Path) -> None:
    root = tmp_path / "notes"
    write_folder(root)
    with httpx.Client(base_url=jobs_server.url, timeout=60) as http:
        job_id = add_job(http, kind="index", path=str(root), collection="killed")["id"]
        seen_done = kill_mid_run(jobs_server, http, job_id)
    committed = {p for p, _, _ in chunk_rows(jobs_server, "killed")}
    assert seen_done <= len(committed) < NUM_FILES

    jobs_server.start()  # the job was "running": it resumes on its own
    with httpx.Client(base_url=jobs_server.url, timeout=60) as http:
        resumed = wait_job(http, job_id)
        clean = wait_job(http, add_job(http, kind="index", path=str(root), collection="clean")["id"])
    runs = resumed["runs"]
    assert [r["state"] for r in runs[:2]] == ["done", "interrupted"]
    assert f"{NUM_FILES - len(committed)} files indexed" in runs[0]["output"]
    assert f"{len(committed)} unchanged" in runs[0]["output"]
    progress = resumed["progress"]
    assert progress["done_chunks"] == progress["total_chunks"] == clean["progress"]["total_chunks"]

    killed_rows, clean_rows = chunk_rows(jobs_server, "killed"), chunk_rows(jobs_server, "clean")
    assert len(clean_rows) >= NUM_FILES and len(set(clean_rows)) == len(clean_rows)
    assert len(set(killed_rows)) == len(killed_rows), "duplicated chunks"
    assert killed_rows == clean_rows
