"""Nothing lost: kill -9 the server in the middle of indexing a folder, start it again, and the job
resumes by itself; its chunks then equal those of a clean run of the same folder, none duplicated and
none missing.

The kill lands at a known place: the server runs with the indexer's test-only pause point armed
(homeai/jobs/pause_point.py), so the job commits exactly ``PAUSE_AFTER_FILES`` files, writes a marker
and blocks; the test waits for the marker rather than racing a progress poll against the job.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from server_launcher import ServerProcess
from sqlalchemy import text
from waiting import wait_until

from homeai.jobs.pause_point import PAUSE_AFTER_FILES_ENV, PAUSE_MARKER_ENV
from tests.integration.jobs.conftest import add_job, database, wait_job

pytestmark = pytest.mark.slow  # the jobs server serves the real models
NUM_FILES = 120
PAUSE_AFTER_FILES = 40
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


@pytest.fixture
def armed_server(jobs_server: ServerProcess, tmp_path: Path) -> Iterator[tuple[ServerProcess, Path]]:
    """The jobs server restarted with the pause point armed (marker in tmp), and its marker path. The
    pause point fires once per marker, so the server may run on armed; it is unarmed for its next start,
    and running again for the tests that follow even if this one failed with it killed."""
    marker = tmp_path / "paused"
    jobs_server.stop()
    jobs_server.env.update({PAUSE_AFTER_FILES_ENV: str(PAUSE_AFTER_FILES), PAUSE_MARKER_ENV: str(marker)})
    try:
        jobs_server.start()
        yield jobs_server, marker
    finally:
        marker.touch()  # a server still armed and running never pauses again
        jobs_server.env.pop(PAUSE_AFTER_FILES_ENV)
        jobs_server.env.pop(PAUSE_MARKER_ENV)
        if jobs_server.proc is None:
            jobs_server.start()


def wait_paused(http: httpx.Client, job_id: int, marker: Path, timeout_s: float = 180.0) -> None:
    """Until the job has committed PAUSE_AFTER_FILES files and blocks at the pause point."""

    def paused() -> bool:
        if marker.exists():
            return True
        job = http.get(f"/v1/jobs/{job_id}").json()
        assert job["state"] in ("queued", "running"), f"the job ended before the pause point: {job}"
        return False

    wait_until(paused, timeout_s, interval_s=0.1,
               what=lambda: f"the pause marker (job: {http.get(f'/v1/jobs/{job_id}').json()})")
    assert marker.read_text() == str(PAUSE_AFTER_FILES)


def test_sigkill_mid_run_then_restart_loses_and_duplicates_nothing(
        armed_server: tuple[ServerProcess, Path], tmp_path: Path) -> None:
    server, marker = armed_server
    root = tmp_path / "notes"
    write_folder(root)
    with httpx.Client(base_url=server.url, timeout=60) as http:
        job_id = add_job(http, kind="index", path=str(root), collection="killed")["id"]
        wait_paused(http, job_id, marker)
        job = http.get(f"/v1/jobs/{job_id}").json()
        assert job["state"] == "running" and job["progress"]["done_files"] == PAUSE_AFTER_FILES, job
    server.kill()
    committed = {p for p, _, _ in chunk_rows(server, "killed")}
    assert len(committed) == PAUSE_AFTER_FILES

    server.start()  # the job was "running": it resumes on its own (the marker exists: no second pause)
    with httpx.Client(base_url=server.url, timeout=60) as http:
        resumed = wait_job(http, job_id)
        clean = wait_job(http, add_job(http, kind="index", path=str(root), collection="clean")["id"])
    runs = resumed["runs"]
    assert [r["state"] for r in runs[:2]] == ["done", "interrupted"]
    assert runs[0]["output"].startswith(f"{NUM_FILES - PAUSE_AFTER_FILES} files indexed")
    assert f"{PAUSE_AFTER_FILES} unchanged" in runs[0]["output"]
    progress = resumed["progress"]
    assert progress["done_chunks"] == progress["total_chunks"] == clean["progress"]["total_chunks"]

    killed_rows, clean_rows = chunk_rows(server, "killed"), chunk_rows(server, "clean")
    assert len(clean_rows) >= NUM_FILES and len(set(clean_rows)) == len(clean_rows)
    assert len(set(killed_rows)) == len(killed_rows), "duplicated chunks"
    assert killed_rows == clean_rows
