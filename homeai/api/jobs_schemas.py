"""Request and response bodies of the jobs and search routes (msgspec), and the checks that name the
offending field of a job request (HTTP 400)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from homeai.api.errors import BadRequest
from homeai.jobs.schedules import parse_schedule

JOB_KINDS = ("index", "prompt", "retention")
MAX_SEARCH_K = 100
MAX_SCHEDULE_CHARS = 128  # JobRow.schedule


class JobCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``kind`` index: ``path`` (a folder on the server) and ``collection``; prompt: ``prompt`` and
    optionally ``class``, ``model``, ``max_tokens``, ``collection`` (for ``{new_documents}``);
    retention: ``days``. Any kind may have a ``schedule`` (cron, "every 15m", or an ISO time)."""

    kind: str
    path: str | None = None
    collection: str | None = None
    schedule: str | None = None
    prompt: str | None = None
    class_name: str | None = msgspec.field(default=None, name="class")
    model: str | None = None
    user: str | None = None
    max_tokens: int | None = None
    days: float | None = None
    chunk_tokens: int | None = None
    overlap_tokens: int | None = None


class JobProgress(msgspec.Struct):
    done_chunks: int
    total_chunks: int
    done_files: int
    total_files: int
    phase: str | None
    chunks_per_s: float
    eta_s: float | None


class JobRunView(msgspec.Struct):
    id: int
    state: str
    started_at: str
    finished_at: str | None
    num_done: int
    output: str | None
    error: str | None


class JobView(msgspec.Struct):
    id: int
    kind: str
    state: str
    spec: dict[str, Any]
    schedule: str | None
    next_run_at: str | None
    progress: JobProgress
    error: str | None
    created_by: str
    created_at: str
    started_at: str | None
    finished_at: str | None
    runs: list[JobRunView] = msgspec.field(default_factory=list)


class JobList(msgspec.Struct):
    jobs: list[JobView]


class SearchRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    collection: str
    query: str
    k: int = 5


class SearchHit(msgspec.Struct):
    text: str
    score: float
    document: str


class SearchResponse(msgspec.Struct):
    results: list[SearchHit]


def _name(value: str | None, param: str) -> str:
    if value is None or not value.strip():
        raise BadRequest(f"{param!r} is required", param=param)
    if len(value) > 128:
        raise BadRequest(f"{param!r} is at most 128 characters", param=param)
    if any(ord(c) < 32 or ord(c) == 127 for c in value):  # a NUL was a 500 on PostgreSQL
        raise BadRequest(f"{param!r} must not contain control characters", param=param)
    return value.strip()


def _index_spec(body: JobCreate, job_roots: tuple[Path, ...]) -> dict[str, Any]:
    if not body.path or not body.path.strip():
        raise BadRequest("'path' is required: a folder on the server", param="path")
    try:
        folder = Path(body.path).expanduser()
        is_dir = folder.is_absolute() and folder.is_dir()
    except (OSError, ValueError, RuntimeError) as e:  # a NUL byte, an unknown ~user ...
        raise BadRequest(f"'path' is not a usable path: {e}", param="path") from None
    if not folder.is_absolute():
        raise BadRequest(f"'path' must be absolute, got {body.path!r}", param="path")
    if not is_dir:
        raise BadRequest(f"'path' {body.path!r} is not a folder on the server", param="path")
    folder = folder.resolve()
    if not any(folder.is_relative_to(root) for root in job_roots):
        allowed = ", ".join(map(str, job_roots)) or "none"
        raise BadRequest(f"'path' {body.path!r} is outside the folders index jobs may read ({allowed}; "
                         "set HOMEAI_JOB_ROOTS to change them)", param="path")
    spec: dict[str, Any] = {"path": str(folder), "collection": _name(body.collection, "collection")}
    if body.chunk_tokens is not None:
        if not 8 <= body.chunk_tokens <= 512:
            raise BadRequest("'chunk_tokens' must be in [8, 512]", param="chunk_tokens")
        spec["chunk_tokens"] = body.chunk_tokens
    if body.overlap_tokens is not None:
        if not 0 <= body.overlap_tokens < spec.get("chunk_tokens", 200):
            raise BadRequest("'overlap_tokens' must be at least 0 and below chunk_tokens", param="overlap_tokens")
        spec["overlap_tokens"] = body.overlap_tokens
    return spec


def _prompt_spec(body: JobCreate, llm_classes: set[str]) -> dict[str, Any]:
    if not body.prompt or not body.prompt.strip():
        raise BadRequest("'prompt' is required", param="prompt")
    spec: dict[str, Any] = {"prompt": body.prompt}
    if body.class_name is not None:
        if body.class_name not in llm_classes:
            raise BadRequest(f"'class' must be an LLM class of the policy: {sorted(llm_classes)}", param="class")
        spec["class"] = body.class_name
    if body.max_tokens is not None:
        if not 1 <= body.max_tokens <= 8192:
            raise BadRequest("'max_tokens' must be in [1, 8192]", param="max_tokens")
        spec["max_tokens"] = body.max_tokens
    for key in ("model", "user", "collection"):
        value = getattr(body, key)
        if value is not None:
            spec[key] = _name(value, key)
    return spec


def job_spec(body: JobCreate, llm_classes: set[str], job_roots: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The stored spec of a valid request; BadRequest naming the field otherwise. ``job_roots`` are the
    only folders an index job may read (Settings.job_roots: the home folder unless HOMEAI_JOB_ROOTS says
    otherwise; none, no index job; ``/``, any folder)."""
    if body.kind not in JOB_KINDS:
        raise BadRequest(f"'kind' must be one of {list(JOB_KINDS)}, got {body.kind!r}", param="kind")
    if body.schedule is not None:
        if len(body.schedule) > MAX_SCHEDULE_CHARS:  # the column's width (a 500 on PostgreSQL before)
            raise BadRequest(f"'schedule' is at most {MAX_SCHEDULE_CHARS} characters", param="schedule")
        try:
            parse_schedule(body.schedule)
        except ValueError as e:
            raise BadRequest(f"invalid 'schedule': {e}", param="schedule") from None
    if body.kind == "index":
        return _index_spec(body, job_roots)
    if body.kind == "prompt":
        return _prompt_spec(body, llm_classes)
    days = 30.0 if body.days is None else body.days
    if not 0 < days <= 36500:
        raise BadRequest("'days' must be above 0", param="days")
    return {"days": days}


def check_search(body: SearchRequest) -> None:
    _name(body.collection, "collection")
    if not body.query.strip():
        raise BadRequest("'query' must not be empty", param="query")
    if not 1 <= body.k <= MAX_SEARCH_K:
        raise BadRequest(f"'k' must be in [1, {MAX_SEARCH_K}]", param="k")
