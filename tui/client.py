"""The gateway's HTTP API as the TUI needs it: one httpx AsyncClient, typed errors, a self-healing stats feed.

Every screen goes through ``GatewayClient``, so a test can hand the app a stand-in (a subclass that
replays recorded stats) and the screens never know the difference. Answers are decoded into the typed
documents of ``tui.documents``; one that does not fit is an error, never a guess.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx

from tui.documents import (
    JobList,
    JobView,
    PolicyApplied,
    PolicyCheck,
    PolicyErrorItem,
    PolicyHistory,
    StatsDoc,
    convert,
    decode,
)

T = TypeVar("T")

STATS_STALL_S = 10.0  # the server sends about twice a second; this long without an event is a dead feed
MAX_RETRY_S = 5.0


@dataclass(frozen=True, slots=True)
class Connection:
    """The stats feed's state, shown on every screen (``retry_in_s`` > 0 while waiting to reconnect)."""

    connected: bool
    detail: str = ""
    retry_in_s: float = 0.0


class ApiError(Exception):
    """A non-2xx answer: the status, the server's message and, for a policy's 422, each error's key path,
    message and line."""

    def __init__(self, status: int, message: str, errors: list[PolicyErrorItem] | None = None) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message
        self.errors = errors or []


class Unreachable(ApiError):
    """The server did not answer at all (refused, reset, timed out)."""

    def __init__(self, message: str) -> None:
        super().__init__(0, message)


class BadAnswer(ApiError):
    """A 2xx answer that is not the document the API promises (a different server, or a different version)."""


class JobsUnavailable(ApiError):
    """The server has no jobs API (404/405 on /v1/jobs): the Jobs screen says so instead of failing."""


@dataclass(slots=True)
class SseParser:
    """Incremental server-sent-events parser: feed lines, get (event, data) at each blank line."""

    event: str = "message"
    data: list[str] = field(default_factory=list)

    def feed(self, line: str) -> tuple[str, str] | None:
        if line == "":
            if not self.data:
                self.event = "message"
                return None
            out = (self.event, "\n".join(self.data))
            self.event, self.data = "message", []
            return out
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            self.event = value
        elif name == "data":
            self.data.append(value)
        return None


def error_from(response: httpx.Response) -> ApiError:
    """Read the server's error body: ``{"error": {"message", "errors"}}`` or Litestar's ``{"detail"}``."""
    try:
        body = response.json()
    except ValueError:
        return ApiError(response.status_code, response.text.strip() or response.reason_phrase)
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            message = err.get("message") or err.get("detail") or response.reason_phrase
            return ApiError(response.status_code, str(message), _error_items(err.get("errors")))
        if isinstance(err, str):
            return ApiError(response.status_code, err)
    return ApiError(response.status_code, response.reason_phrase)


def read(response: httpx.Response, kind: type[T]) -> T:
    """The answer's body as ``kind``; BadAnswer (an ApiError) when it does not fit."""
    try:
        return decode(response.content, kind)
    except ValueError as e:
        raise BadAnswer(response.status_code, f"unexpected answer from {response.request.url.path}: {e}") from e


def _error_items(errors: Any) -> list[PolicyErrorItem] | None:
    """A policy 422's ``errors`` (None when the body has none, or something else under that name)."""
    if not isinstance(errors, list):
        return None
    try:
        return convert(errors, list[PolicyErrorItem])
    except ValueError:
        return None


class GatewayClient:
    """The API calls the TUI makes; ``key`` goes out as ``Authorization: Bearer KEY``."""

    def __init__(self, base_url: str = "http://127.0.0.1:8000", key: str | None = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.http = httpx.AsyncClient(base_url=self.base_url, headers=headers, transport=transport,
                                      timeout=httpx.Timeout(10.0, read=STATS_STALL_S))
        self.policy_etag: str | None = None  # the running policy's version when the editor loaded it

    async def aclose(self) -> None:
        await self.http.aclose()

    async def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = await self.http.request(method, path, **kwargs)
        except httpx.TransportError as e:
            raise Unreachable(f"{self.base_url} does not answer ({type(e).__name__})") from e
        if response.status_code >= 400:
            raise error_from(response)
        return response

    # ---- live statistics -------------------------------------------------------------------------
    async def stats(self) -> StatsDoc:
        return read(await self._request("GET", "/v1/stats"), StatsDoc)

    async def stats_events(self) -> AsyncIterator[StatsDoc | Connection]:
        """Stats documents from /v1/stats/stream forever, with a ``Connection`` each time the feed goes up
        or down; reconnects by itself (0.5 s, doubling to 5 s) so a server restart needs no keypress."""
        delay_s = 0.5
        while True:
            try:
                async with self.http.stream("GET", "/v1/stats/stream",
                                            headers={"Accept": "text/event-stream"}) as response:
                    if response.status_code >= 400:
                        await response.aread()
                        raise error_from(response)
                    parser, announced = SseParser(), False
                    async for line in response.aiter_lines():
                        item = parser.feed(line.rstrip("\r"))
                        if item is None or item[0] != "stats":
                            continue
                        doc = decode(item[1], StatsDoc)
                        if not announced:
                            announced, delay_s = True, 0.5
                            yield Connection(True, "live")
                        yield doc
                reason = "the server closed the stream"
            except (httpx.HTTPError, ApiError, ValueError) as e:  # a bad body too (DecodingError): the app stays
                reason = _describe(e)
            yield Connection(False, reason, delay_s)
            await asyncio.sleep(delay_s)
            delay_s = min(delay_s * 2, MAX_RETRY_S)

    # ---- policy ----------------------------------------------------------------------------------
    async def get_policy(self) -> str:
        """The running policy's text; its version (the ETag) is kept for the next ``put_policy``."""
        response = await self._request("GET", "/admin/policy")
        self.policy_etag = response.headers.get("ETag")
        return response.text

    async def put_policy(self, text: str) -> PolicyApplied:
        """Validate and apply; raises ApiError (422 with ``errors`` at key paths and lines) when invalid, and
        (412) when the running policy changed since ``get_policy`` read it (a file edit, another admin): an
        apply of the older text would have silently undone that change."""
        headers = {"Content-Type": "application/yaml"}
        if self.policy_etag:
            headers["If-Match"] = self.policy_etag
        response = await self._request("PUT", "/admin/policy", content=text.encode("utf-8"), headers=headers)
        self.policy_etag = response.headers.get("ETag", self.policy_etag)
        return read(response, PolicyApplied)

    async def validate_policy(self, text: str) -> PolicyCheck | None:
        """The server's dry run (POST /admin/policy/validate): what applying would change, or ApiError (422
        with ``errors`` at key paths and lines); None when the server has no such endpoint. Never falls
        back to PUT: a validate must not change the running policy."""
        try:
            response = await self._request("POST", "/admin/policy/validate", content=text.encode("utf-8"),
                                           headers={"Content-Type": "application/yaml"})
        except ApiError as e:
            if e.status in (404, 405):
                return None
            raise
        return read(response, PolicyCheck)

    async def policy_history(self, limit: int = 50) -> PolicyHistory:
        return read(await self._request("GET", "/admin/policy/history", params={"limit": limit}), PolicyHistory)

    async def rollback(self, version: int | None = None) -> PolicyApplied:
        body = {} if version is None else {"version": version}
        return read(await self._request("POST", "/admin/policy/rollback", json=body), PolicyApplied)

    # ---- jobs ------------------------------------------------------------------------------------
    async def list_jobs(self) -> list[JobView]:
        try:
            response = await self._request("GET", "/v1/jobs")
        except ApiError as e:
            if e.status in (404, 405):
                raise JobsUnavailable(e.status, "jobs API not available on this server") from e
            raise
        return read(response, JobList).jobs

    async def add_index_job(self, path: str, collection: str | None = None) -> JobView:
        """POST /v1/jobs; the collection defaults to the folder's name (the API requires one)."""
        name = collection or os.path.basename(os.path.normpath(os.path.expanduser(path))) or "documents"
        body: dict[str, Any] = {"kind": "index", "path": path, "collection": name}
        try:
            return read(await self._request("POST", "/v1/jobs", json=body), JobView)
        except ApiError as e:
            if e.status in (404, 405):
                raise JobsUnavailable(e.status, "jobs API not available on this server") from e
            raise

    async def job_action(self, job_id: int, action: str) -> None:
        """``pause``, ``resume`` (POST /v1/jobs/{id}/ACTION) or ``cancel`` (DELETE /v1/jobs/{id})."""
        if action == "cancel":
            await self._request("DELETE", f"/v1/jobs/{job_id}")
        else:
            await self._request("POST", f"/v1/jobs/{job_id}/{action}")


def _describe(e: Exception) -> str:
    if isinstance(e, httpx.ConnectError):
        return "connection refused"
    if isinstance(e, httpx.TimeoutException):
        return "no data (timed out)"
    if isinstance(e, httpx.TransportError):
        return f"connection lost ({type(e).__name__})"
    if isinstance(e, httpx.DecodingError):
        return f"bad data from the server ({e})"
    if isinstance(e, ApiError):
        return f"HTTP {e.status}: {e.message}"
    return f"bad data from the server ({e})"
