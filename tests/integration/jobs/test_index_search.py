"""A real server indexes a small folder through its indexing class, and /v1/search finds the right
file; a changed file is re-indexed, a deleted one leaves the collection; prompt and retention jobs
run; the request log gets a row per search; `homeai jobs` talks to the server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from pdf_helpers import make_pdf
from server_launcher import ServerProcess
from sqlalchemy import text
from waiting import wait_until

from tests.integration.jobs.conftest import add_job, database, wait_job

pytestmark = pytest.mark.slow  # the jobs server serves the real models

DOCS = {
    "pets/cat.txt": "Our cat Mimi sleeps on the warm kitchen windowsill every afternoon and purrs.",
    "admin/taxes.md": "# Taxes\n\nThe income tax return for 2024 is due on April 15; keep every receipt.",
    "kitchen/recipe.html": "<html><head><style>h1{}</style></head><body><h1>Pasta</h1><p>Boil the spaghetti "
                           "for nine minutes in salted water, then add tomato sauce.</p><script>x()</script>"
                           "</body></html>",
    "car/bike.md": "The bicycle needs new brake pads and the chain must be oiled before the summer trip.",
}


def top_document(http: httpx.Client, collection: str, query: str) -> str:
    r = http.post("/v1/search", json={"collection": collection, "query": query, "k": 3})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert results and set(results[0]) == {"text", "score", "document"}
    assert results[0]["score"] >= results[-1]["score"]
    return str(results[0]["document"])


def write_docs(root: Path) -> None:
    for name, body in DOCS.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(body)
    (root / "bills").mkdir()
    (root / "bills" / "garage.pdf").write_bytes(make_pdf(["Invoice for the new garage door", "Total 450 EUR"]))


def test_index_then_search_finds_the_right_document(http: httpx.Client, tmp_path: Path,
                                                   jobs_server: ServerProcess) -> None:
    root = tmp_path / "home"
    write_docs(root)
    job = wait_job(http, add_job(http, kind="index", path=str(root), collection="home")["id"])
    progress = job["progress"]
    assert progress["done_files"] == progress["total_files"] == 5
    assert progress["done_chunks"] == progress["total_chunks"] >= 5
    assert job["runs"][0]["output"].startswith("5 files indexed")
    assert top_document(http, "home", "how long do I cook noodles") == str(root / "kitchen/recipe.html")
    assert top_document(http, "home", "when do I have to file my taxes") == str(root / "admin/taxes.md")
    assert top_document(http, "home", "how much did the garage door cost") == str(root / "bills/garage.pdf")
    assert top_document(http, "home", "where does the kitty nap") == str(root / "pets/cat.txt")

    (root / "pets/cat.txt").unlink()
    (root / "admin/taxes.md").write_text("Dentist appointment for the children next Tuesday at nine.")
    again = wait_job(http, add_job(http, kind="index", path=str(root), collection="home")["id"])
    assert again["runs"][0]["output"].startswith("1 files indexed (1 chunks), 3 unchanged, 1 removed")
    assert top_document(http, "home", "when is the dentist visit") == str(root / "admin/taxes.md")
    r = http.post("/v1/search", json={"collection": "home", "query": "where does the kitty nap", "k": 10})
    assert str(root / "pets/cat.txt") not in {hit["document"] for hit in r.json()["results"]}
    assert_search_requests_logged(jobs_server)


def assert_search_requests_logged(server: ServerProcess) -> None:
    engine = database(server)

    def logged() -> int:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT COUNT(*) FROM request_log WHERE class_name = 'embedding' "
                                         "AND status = 'ok' AND num_prompt_tokens > 0")).scalar_one())

    try:  # the request log is written in batches off the request path
        wait_until(lambda: logged() >= 6, 10.0, interval_s=0.2, what="a request-log row per search")
    finally:
        engine.dispose()


def test_prompt_and_retention_jobs(http: httpx.Client) -> None:
    prompt = wait_job(http, add_job(http, kind="prompt", prompt="Say hello to the family.", max_tokens=8,
                                    **{"class": "chat"})["id"])
    assert prompt["runs"][0]["state"] == "done" and prompt["runs"][0]["output"]
    retention = wait_job(http, add_job(http, kind="retention", days=30)["id"])
    assert retention["runs"][0]["output"].startswith("deleted 0 request-log rows older than 30 days")


def test_cli_lists_shows_pauses_and_removes(http: httpx.Client, jobs_server: ServerProcess, tmp_path: Path) -> None:
    def cli(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "homeai.cli.main", "jobs", *args, "--url", jobs_server.url],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    added = cli("add", "retention", "--days", "90", "--schedule", "0 4 * * *")
    job_id = added.split()[1].rstrip(":")
    assert "retention queued" in added
    listing = cli("list")
    assert job_id in listing and "0 4 * * *" in listing
    assert "next_run_at" in cli("show", job_id)
    assert "paused" in cli("pause", job_id)
    assert "queued" in cli("resume", job_id)
    assert "paused" in cli("pause", job_id)
    assert f"job {job_id} deleted" in cli("rm", job_id)
    assert http.get(f"/v1/jobs/{job_id}").status_code == 404
    # the next job may get the deleted one's id (SQLite reuses the highest): it must not inherit its pause
    (tmp_path / "note.txt").write_text("The bins go out on Thursday evening.")
    after = wait_job(http, add_job(http, kind="index", path=str(tmp_path), collection="after-rm")["id"], 60)
    assert after["runs"][0]["output"].startswith("1 files indexed"), after
