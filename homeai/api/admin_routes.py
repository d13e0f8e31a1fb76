"""Admin endpoints: the running policy as YAML, changed atomically, with a history to roll back to.

    GET  /admin/policy                     the YAML text of the running policy
    PUT  /admin/policy                     YAML body -> validated, swapped, stored; answers the diff
    POST /admin/policy/validate            YAML body -> validated only (a dry run): the diff it would make
    GET  /admin/policy/history             applied versions, newest first (?limit=N)
    GET  /admin/policy/history/{version}   one version with its text
    POST /admin/policy/rollback            ?version=N or {"version": N}; neither: the previous version

Every route needs an admin caller (``require_admin``). Handlers receive the policy holder, the store and,
if set, the policy file's path (homeai/api/services.py): an applied policy is also written there so
that a restart (and the file watcher) keeps it. An invalid policy answers 422 with every error's
key path, message and 1-based line (null when the error has none, e.g. an empty file); nothing changes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

from litestar import Request, Response, Router, get, post, put
from litestar.params import Parameter

from homeai.api.auth import ADMIN, require_admin, resolve_caller
from homeai.api.errors import ApiError, BadRequest, NotFound, ServiceUnavailable, Unprocessable
from homeai.api.policy_apply import (
    Applied,
    StalePolicyError,
    apply_policy_text,
    check_policy_text,
    record_running_policy,
    running_text,
)
from homeai.api.services import Injected
from homeai.policy.loader import PolicyError
from homeai.policy.store import PolicyHolder
from homeai.store.db import Store

YAML_MEDIA_TYPE = "application/yaml"
MAX_VERSION = 2**31 - 1  # larger numbers cannot be stored versions (and overflow SQLite's INTEGER)


def policy_error_items(e: PolicyError) -> list[dict[str, Any]]:
    """The 422's ``errors``: ``{"path", "message", "line"}`` each (line 1-based, or None)."""
    return [{"path": path, "message": msg, "line": line} for path, msg, line in e.located()]


def policy_refused(e: PolicyError) -> Unprocessable:
    n = len(e.errors)
    message = f"invalid policy ({n} error{'s' if n != 1 else ''}); the running policy is unchanged"
    return Unprocessable(message, code="invalid_policy", errors=policy_error_items(e))


async def _yaml_text(request: Request[Any, Any, Any]) -> str | None:
    """The body as text (None: not UTF-8)."""
    try:
        return (await request.body()).decode("utf-8")
    except UnicodeDecodeError:
        return None


def _applied_body(applied: Applied, holder: PolicyHolder) -> dict[str, Any]:
    return {"changed": applied.changed, "diff": applied.diff, "version": applied.stored_version,
            "swap_version": applied.swap_version, "warning": applied.warning, "written_to": applied.written_to,
            "policy": {"classes": sorted(holder.current.classes), "users": sorted(holder.current.users)}}


@get("/policy", media_type=YAML_MEDIA_TYPE, summary="The running policy (YAML)")
async def get_policy(policy_holder: Injected[PolicyHolder]) -> Response[str]:
    """With its swap version as the ETag: a PUT that sends it back as ``If-Match`` is refused (412) when another
    change (the file, another admin) came in between, instead of silently undoing it."""
    return Response(running_text(policy_holder), media_type=YAML_MEDIA_TYPE,
                    headers={"ETag": f'"{policy_holder.version}"'})


def _based_on(request: Request[Any, Any, Any]) -> int | None:
    """The swap version ``If-Match`` names (None: none sent, or ``*``)."""
    value = request.headers.get("if-match")
    if value is None or value.strip() == "*":
        return None
    tag = value.strip().removeprefix("W/").strip('"')
    if not tag.isdigit():
        raise BadRequest("If-Match must be the ETag GET /admin/policy answered (the running policy's swap "
                         "version)", param="If-Match")
    return int(tag)


@put("/policy", summary="Validate and apply a policy (YAML body)", status_code=200,
     opt={"body": "yaml"})  # application/yaml, text/yaml, text/plain or no type (homeai/api/body_guard.py)
async def put_policy(request: Request[Any, Any, Any], policy_holder: Injected[PolicyHolder],
                     store: Injected[Store | None], policy_path: Injected[Path | None]) -> Response[Any]:
    text = await _yaml_text(request)
    if text is None:
        raise BadRequest("the policy must be UTF-8 YAML text")
    based_on = _based_on(request)
    caller = await resolve_caller(request)
    try:
        applied = await apply_policy_text(policy_holder, store, text, caller.user, note="PUT /admin/policy",
                                          source="PUT /admin/policy", persist_to=policy_path, based_on=based_on)
    except PolicyError as e:
        raise policy_refused(e) from None
    except StalePolicyError as e:
        raise ApiError(str(e), status_code=412, code="policy_changed",
                       headers={"ETag": f'"{e.running}"'}) from None
    return Response(_applied_body(applied, policy_holder), headers={"ETag": f'"{policy_holder.version}"'})


@post("/policy/validate", summary="Validate a policy without applying it (YAML body)", status_code=200,
      opt={"body": "yaml"})  # the same types as PUT; a dry run: swaps, stores and writes nothing
async def validate_policy(request: Request[Any, Any, Any], policy_holder: Injected[PolicyHolder]) -> Response[Any]:
    text = await _yaml_text(request)
    if text is None:
        raise BadRequest("the policy must be UTF-8 YAML text")
    try:
        checked = check_policy_text(policy_holder, text, source="POST /admin/policy/validate")
    except PolicyError as e:
        raise policy_refused(e) from None
    policy = checked.policy
    return Response({"valid": True, "changed": checked.changed, "diff": checked.diff,
                     "policy": {"classes": sorted(policy.classes), "users": sorted(policy.users),
                                "aliases": sorted(policy.aliases)}})


@get("/policy/history", summary="Applied policy versions, newest first")
async def policy_history(
    policy_holder: Injected[PolicyHolder], store: Injected[Store | None],
    limit: Annotated[int, Parameter(ge=1, le=1000)] = 50,
) -> Response[Any]:
    if store is None:
        raise ServiceUnavailable("no store: the policy history is unavailable")
    await record_running_policy(policy_holder, store)
    versions = await store.policy_versions.history(limit)
    current_text = running_text(policy_holder)
    current = next((v.version for v in versions if v.yaml_text == current_text), None)
    return Response({"current": current, "versions": [v.summary() for v in versions]})


@get("/policy/history/{version:int}", summary="One applied policy version with its YAML")
async def policy_version(
    store: Injected[Store | None], version: Annotated[int, Parameter(ge=1, le=MAX_VERSION)],
) -> Response[Any]:
    if store is None:
        raise ServiceUnavailable("no store: the policy history is unavailable")
    found = await store.policy_versions.get(version)
    if found is None:
        raise NotFound(f"no policy version {version}", param="version")
    return Response({**found.summary(), "yaml": found.yaml_text})


@post("/policy/rollback", summary="Re-apply a stored version (default: the previous one)", status_code=200)
async def rollback_policy(
    request: Request[Any, Any, Any], policy_holder: Injected[PolicyHolder], store: Injected[Store | None],
    policy_path: Injected[Path | None],
    query_version: Annotated[int | None, Parameter(query="version", ge=1, le=MAX_VERSION)] = None,
) -> Response[Any]:
    if store is None:
        raise ServiceUnavailable("no store: nothing to roll back to")
    raw = await request.body()
    try:
        body = json.loads(raw) if raw.strip() else {}
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("the body must be JSON: {\"version\": N}", param="version") from None
    version = body.get("version") if isinstance(body, dict) else None
    if version is not None and (isinstance(version, bool) or not isinstance(version, int)
                                or not 1 <= version <= MAX_VERSION):
        raise BadRequest(f"version must be an integer from 1 to {MAX_VERSION}", param="version")
    if query_version is not None and version is not None and query_version != version:
        raise BadRequest(f"the query asks for version {query_version} and the body for {version}", param="version")
    version = query_version if query_version is not None else version
    if version is None:
        await record_running_policy(policy_holder, store)
        history = await store.policy_versions.history(limit=2)
        if len(history) < 2:
            raise ApiError("there is no previous policy version", status_code=409, code="no_previous_version")
        version = history[1].version
    target = await store.policy_versions.get(version)
    if target is None:
        raise NotFound(f"no policy version {version}", param="version")
    caller = await resolve_caller(request)
    try:
        applied = await apply_policy_text(policy_holder, store, target.yaml_text, caller.user,
                                          note=f"rollback to {version}", source=f"policy version {version}",
                                          persist_to=policy_path)
    except PolicyError as e:  # stored under an older schema that no longer validates
        raise policy_refused(e) from None
    return Response({**_applied_body(applied, policy_holder), "rolled_back_to": version})


admin_router = Router(
    path="/admin",
    route_handlers=[get_policy, put_policy, validate_policy, policy_history, policy_version, rollback_policy],
    guards=[require_admin],
    opt={"auth": ADMIN},  # the app's authenticate guard refuses a non-admin before it looks at the body
    tags=["admin"],
)
