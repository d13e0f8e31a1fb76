"""Background jobs and semantic search.

    POST   /v1/jobs               {"kind": "index", "path": FOLDER, "collection": NAME, "schedule": ...},
                                  prompt and retention kinds (fields in jobs_schemas.JobCreate) -> 201
    GET    /v1/jobs               every job with its progress
    GET    /v1/jobs/{id}          one job: progress (done/total chunks, rate, ETA), state, recent runs
    DELETE /v1/jobs/{id}          stop and forget a job (its collection stays)
    POST   /v1/jobs/{id}/pause    stop at the next batch boundary and hold the schedule
    POST   /v1/jobs/{id}/resume   continue (skips what is committed)
    POST   /v1/search             {"collection", "query", "k"} -> {"results": [{"text", "score", "document"}]}

Jobs read folders on the server, so they need an admin caller (any caller on loopback without keys),
and an index job's folder must lie inside one of Settings.job_roots (HOMEAI_JOB_ROOTS; unset, the home folder);
search needs a caller who may search the collection (its owner, a listed reader, an admin: see
collections_routes). The query is embedded in the interactive embedding class.
"""

from __future__ import annotations

from typing import Any

from litestar import Request, Router, delete, get, post
from litestar.params import FromPath, JSONBody

from homeai.api.auth import ADMIN, require_admin, resolve_caller
from homeai.api.collections_routes import searchable
from homeai.api.embedding_admission import run_embedding
from homeai.api.errors import BadRequest, NotFound, ServiceUnavailable
from homeai.api.jobs_schemas import (
    JobCreate,
    JobList,
    JobProgress,
    JobRunView,
    JobView,
    SearchHit,
    SearchRequest,
    SearchResponse,
    check_search,
    job_spec,
)
from homeai.api.routing import request_context, route_request
from homeai.api.services import Injected, Services, started_gateway
from homeai.api.settings import Settings
from homeai.gateway.gateway import Gateway
from homeai.jobs.manager import JobManager
from homeai.policy.store import PolicyHolder
from homeai.store.jobs import JobInfo

SEARCH_CLASS = "embedding"
MAX_JOB_ID = 2**31 - 1  # larger ids cannot exist (and overflow the database's INTEGER)


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


async def job_view(manager: JobManager, job: JobInfo, num_runs: int = 0) -> JobView:
    runs = await manager.store.jobs.runs(job.id, limit=num_runs) if num_runs else []
    return JobView(
        id=job.id, kind=job.kind, state=job.state, spec=job.spec, schedule=job.schedule,
        next_run_at=await manager.next_run_at(job.id), progress=JobProgress(**manager.progress(job)), error=job.error,
        created_by=job.created_by, created_at=job.created_at.isoformat(), started_at=_iso(job.started_at),
        finished_at=_iso(job.finished_at),
        runs=[JobRunView(r.id, r.state, r.started_at.isoformat(), _iso(r.finished_at), r.num_done, r.output,
                         r.error) for r in runs])


async def _job(manager: JobManager, job_id: int) -> JobInfo:
    job = await manager.store.jobs.get(job_id) if 0 < job_id <= MAX_JOB_ID else None
    if job is None:
        raise NotFound(f"no job with id {job_id}", param="id")
    return job


@post("/jobs", status_code=201, summary="Create a job (index a folder, run a prompt, prune the log)")
async def create_job(request: Request[Any, Any, Any], data: JSONBody[JobCreate], jobs: Injected[JobManager],
                     policy_holder: Injected[PolicyHolder], settings: Injected[Settings]) -> JobView:
    policy = policy_holder.current
    spec = job_spec(data, {name for name, c in policy.classes.items() if c.kind == "llm"}, settings.job_roots)
    caller = await resolve_caller(request)
    if data.kind == "index":  # the collection belongs to whoever asked for it first (see collections_routes)
        await jobs.store.collections.ensure(spec["collection"], owner=caller.user)
    job = await jobs.add(data.kind, spec, data.schedule, caller.user)
    return await job_view(jobs, await _job(jobs, job.id))


@get("/jobs", summary="Every job with its state and progress")
async def list_jobs(jobs: Injected[JobManager]) -> JobList:
    return JobList([await job_view(jobs, job) for job in await jobs.store.jobs.all()])


@get("/jobs/{job_id:int}", summary="One job: progress (done/total chunks, rate, ETA), state, recent runs")
async def show_job(jobs: Injected[JobManager], job_id: FromPath[int]) -> JobView:
    return await job_view(jobs, await _job(jobs, job_id), num_runs=5)


@delete("/jobs/{job_id:int}", status_code=200, summary="Stop and delete a job (its collection stays)")
async def delete_job(jobs: Injected[JobManager], job_id: FromPath[int]) -> dict[str, Any]:
    await _job(jobs, job_id)
    await jobs.delete(job_id)
    return {"id": job_id, "deleted": True}


@post("/jobs/{job_id:int}/pause", status_code=200, summary="Pause a job at the next batch boundary")
async def pause_job(jobs: Injected[JobManager], job_id: FromPath[int]) -> JobView:
    job = await _job(jobs, job_id)
    if not await jobs.pause(job_id):
        raise BadRequest(f"job {job_id} is {job.state} and has no schedule: nothing to pause", param="id")
    return await job_view(jobs, await _job(jobs, job_id))


@post("/jobs/{job_id:int}/resume", status_code=200, summary="Resume a paused job")
async def resume_job(jobs: Injected[JobManager], job_id: FromPath[int]) -> JobView:
    job = await _job(jobs, job_id)
    if not await jobs.resume(job_id):
        raise BadRequest(f"job {job_id} is {job.state}, not paused", param="id")
    return await job_view(jobs, await _job(jobs, job_id))


def _search_class(gateway: Gateway, asked: str | None) -> str | None:
    classes = gateway.policy.classes
    if asked is not None and asked in classes and classes[asked].kind == "embedding":
        return asked
    return SEARCH_CLASS if SEARCH_CLASS in classes else None


@post("/search", status_code=200, summary="Top-k chunks of a collection for a text query")
async def search(request: Request[Any, Any, Any], data: JSONBody[SearchRequest],
                 services: Injected[Services]) -> SearchResponse:
    # read here, in this order: a 503 for the engine still starting only once the caller may search the collection
    check_search(data)
    index = services.search
    if index is None:
        raise ServiceUnavailable("search is not available (no store, or still starting)")
    collection_id = (await searchable(request, services.store, data.collection.strip())).id  # 404 unless it may
    gateway = started_gateway(services)
    ctx = await request_context(request)
    ctx.class_name = _search_class(gateway, ctx.class_name or ctx.key_class)
    route = route_request(gateway, None, ctx, "embedding")
    result = await run_embedding(request, gateway, route, [data.query], ctx)
    try:
        hits = await index.search(collection_id, result.vectors[0], data.k, route.model)
    except ValueError as e:
        raise BadRequest(str(e), param="collection") from None
    return SearchResponse([SearchHit(h.text, h.score, h.document) for h in hits])


jobs_router = Router(path="/v1", route_handlers=[
    # opt: the app's authenticate guard refuses a non-admin before it looks at the body
    Router(path="/", route_handlers=[create_job, list_jobs, show_job, delete_job, pause_job, resume_job],
           guards=[require_admin], opt={"auth": ADMIN}),
    search,
], tags=["jobs"])
