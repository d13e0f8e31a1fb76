"""Schemathesis over the served OpenAPI schema: whatever it sends, the server never answers 5xx.

The shared server takes everything but the admin and job routes and the endless stats stream: requests
come from user "fuzz", whose default class answers with one token, and the coverage phase is off there
(every valid generation request runs the model on a slow CPU). The admin and job routes, which change
the policy and read folders, go to a sandbox server of their own: its data directory and policy file
are in tmp, and HOMEAI_JOB_ROOTS lets a generated job read only a small folder in tmp, never the
machine's disks. The schema it fuzzes is told what the free-text job and policy fields mean, so that
generated jobs and policies are often valid and run; after the fuzzing (file order), a last test checks
that they did, that the sandbox held, and that the server logged no traceback.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from server_launcher import ServerProcess, running_server

from homeai.api.settings import JOB_ROOTS_ENV
from tests.integration.api.conftest import POLICY

pytestmark = pytest.mark.slow
NO_COVERAGE = {"phases": {"coverage": {"enabled": False}}}
HEADERS = {"X-HomeAI-User": "fuzz"}
SETTINGS = settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="session")
def api_schema(server_url: str) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(f"{server_url}/schema/openapi.json",
                                         config=schemathesis.Config.from_dict(NO_COVERAGE))


@pytest.fixture(scope="module")
def sandbox(pulled_models: dict[str, Path], homeai_cache_dir: Path,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server of its own for the routes that change things; everything it may touch is in tmp."""
    base = tmp_path_factory.mktemp("fuzz-sandbox")
    job_root = base / "job-root"
    (job_root / "notes").mkdir(parents=True)
    (job_root / "notes" / "boiler.txt").write_text("The boiler is serviced every March by the same plumber.")
    policy = Path(shutil.copyfile(POLICY, base / "policy.yaml"))  # PUT /admin/policy rewrites this copy
    with running_server(base / "data", homeai_cache_dir, policy=policy, env={JOB_ROOTS_ENV: str(job_root)}) as server:
        yield server


@pytest.fixture(scope="module")
def sandbox_schema(sandbox: ServerProcess) -> schemathesis.BaseSchema:
    raw = httpx.get(f"{sandbox.url}/schema/openapi.json", timeout=30).json()
    return schemathesis.openapi.from_dict(told_what_fields_mean(raw, Path(sandbox.env[JOB_ROOTS_ENV])))


def policy_texts() -> list[str]:
    """Policy bodies to send: valid, edited, invalid, pathological."""
    valid = POLICY.read_text()
    return [valid, valid.replace("max_output_tokens: 8", "max_output_tokens: 4", 1),
            valid.replace("kind: llm", "kind: lmm", 1), valid.replace("priority: 0", "priority: -1", 1),
            "", "null", "[]", "classes: {}", "version: [1", "version: 1\nclasses: " + "[" * 1000 + "]" * 1000,
            "version: 1\nclasses:\n  x: &a {kind: llm}\n  y: *a\n", "\ufeff\x00\ud7ff"]


def one_of(*values: Any) -> dict[str, Any]:
    return {"enum": list(values)}


def job_shapes(job_root: Path) -> list[dict[str, Any]]:
    """A body shape per job kind, with real and wrong values (folders inside, above and outside the job
    root; numbers around their limits), so that many generated jobs are valid and run. (Integers may
    arrive as 3.0, which the server refuses: the fewer numbers a shape has, the more of it gets through.)"""
    schedule = one_of("every 15m", "0 3 * * *", "2099-01-01T00:00:00", "whenever")

    def shape(kind: str, required: list[str], **properties: dict[str, Any]) -> dict[str, Any]:
        return {"type": "object", "required": ["kind", *required], "additionalProperties": False,
                "properties": {"kind": {"const": kind}, "schedule": schedule, **properties}}

    return [
        shape("index", ["path", "collection"],
              path=one_of(str(job_root), str(job_root / "notes"), str(job_root / ".."), "/", "/etc", "notes"),
              collection=one_of("notes", "home")),
        shape("prompt", ["prompt"], prompt={"type": "string", "maxLength": 40},
              max_tokens={"type": "integer", "minimum": -1, "maximum": 9},
              model=one_of("smollm2-135m-instruct", "all-minilm-l6-v2", "gpt-9"),
              user=one_of("kids", "fuzz", ""), collection=one_of("notes", "nowhere"), **{"class": one_of(
                  "chat", "voice", "embedding", "nope")}),
        shape("retention", [], days={"type": "number", "minimum": -1, "maximum": 40000}),
    ]


def told_what_fields_mean(raw: dict[str, Any], job_root: Path) -> dict[str, Any]:
    """The served schema, told what its free-text fields mean, so that generated requests get past the
    first check and reach what runs behind it: a job body is one of the shapes of ``job_shapes`` or has
    an unknown kind; PUT /admin/policy, whose YAML body the schema does not describe, gets valid,
    edited, invalid and pathological policies. (Enums, not anyOf with a plain string: the generator folds
    that into the string and never picks the enum.)"""
    schemas = raw["components"]["schemas"]
    # (no free-form branch: the generator would fold the shapes into it; unit tests cover field errors)
    unknown_kind = {"type": "object", "required": ["kind"], "additionalProperties": False,
                    "properties": {"kind": one_of("backup", "", "INDEX")}}
    schemas["JobCreate"] = {"anyOf": [*job_shapes(job_root), unknown_kind]}
    raw["paths"]["/admin/policy"]["put"]["requestBody"] = {
        "required": True, "content": {"text/plain": {"schema": one_of(*policy_texts())}}}
    return raw


schema = schemathesis.pytest.from_fixture("api_schema").exclude(path_regex=r"^/(admin|v1/stats/stream|v1/jobs)")
admin_and_jobs = schemathesis.pytest.from_fixture("sandbox_schema").include(path_regex=r"^/(admin|v1/jobs)")


@schema.parametrize()
@SETTINGS
def test_no_server_errors(case: schemathesis.Case) -> None:
    case.call_and_validate(headers=HEADERS, checks=[not_a_server_error], timeout=60)


@admin_and_jobs.parametrize()
@settings(SETTINGS, max_examples=60)
def test_admin_and_job_routes_no_server_errors(case: schemathesis.Case, sandbox: ServerProcess) -> None:
    case.call_and_validate(base_url=sandbox.url, headers=HEADERS, checks=[not_a_server_error], timeout=60)


def test_the_sandbox_held(sandbox: ServerProcess) -> None:
    """Whatever the fuzzing created, no index job reads outside the job root, and the server still runs."""
    root = Path(sandbox.env[JOB_ROOTS_ENV]).resolve()
    jobs = httpx.get(f"{sandbox.url}/v1/jobs", headers=HEADERS, timeout=30).json()["jobs"]
    paths = [Path(job["spec"]["path"]) for job in jobs if job["kind"] == "index"]
    assert all(path.is_relative_to(root) for path in paths), paths
    kinds = {job["kind"] for job in jobs}
    assert kinds >= {"index", "prompt", "retention"}, f"the fuzzing (run it first) made valid jobs only of {kinds}"
    assert httpx.get(f"{sandbox.url}/readyz", timeout=30).status_code == 200
    assert "Traceback" not in sandbox.log_path.read_text(errors="replace"), sandbox.log()
