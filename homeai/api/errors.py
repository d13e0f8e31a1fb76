"""One exception hierarchy for the API, mapped to HTTP in one place.

Engine and scheduling errors (RequestError, QueueFullError, ...) know nothing of HTTP; ``to_api_error``
turns each into an ``ApiError`` with a status, and the app's single exception handler renders it in the
shape the caller's client library parses: OpenAI's ``{"error": {"message", "type", "param", "code"}}``
under /v1 (and everywhere else), Ollama's ``{"error": "..."}`` under /api.
"""

from __future__ import annotations

import logging
import math
import re
from typing import Any

from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException

from homeai.engine.errors import (
    ClassRetiredError,
    EmbedBatchError,
    ModelCapacityError,
    ModelLoadError,
    ModelLoadingError,
    ModelUnloadedError,
    QueueTimeoutError,
    RequestError,
    ShuttingDownError,
)
from homeai.gateway.gateway import UnknownModelError
from homeai.scheduling.class_queue import QueueFullError
from homeai.scheduling.class_scheduler import UnknownClassError

log = logging.getLogger(__name__)

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 405: "invalid_request_error", 413: "invalid_request_error",
          429: "rate_limit_error", 499: "client_closed_request", 503: "service_unavailable"}


class ApiError(Exception):
    """An error the client should see as it is: status, message, the offending field, extra headers."""

    status_code = 500

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None, status_code: int | None = None,
                 errors: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}
        self.errors = errors  # several problems at once (a policy's), each with its path and line
        if status_code is not None:
            self.status_code = status_code

    @property
    def type(self) -> str:
        return _TYPES.get(self.status_code, "server_error" if self.status_code >= 500 else "invalid_request_error")


class BadRequest(ApiError):
    status_code = 400


class NotFound(ApiError):
    status_code = 404


class Unprocessable(ApiError):
    status_code = 422


class TooManyRequests(ApiError):
    status_code = 429


class ServiceUnavailable(ApiError):
    status_code = 503


class ClientGone(ApiError):
    """The client disconnected before its answer was ready; nobody reads this response."""

    status_code = 499


def retry_after(seconds: float) -> dict[str, str]:
    return {"Retry-After": str(max(1, math.ceil(seconds)))}


def to_api_error(exc: BaseException) -> ApiError:
    """Map any exception raised while serving a request to the ApiError the client gets."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, QueueFullError):
        return TooManyRequests(str(exc), code="queue_full", headers=retry_after(exc.retry_after_s))
    if isinstance(exc, QueueTimeoutError):
        return ServiceUnavailable(str(exc), code="queue_timeout", headers=retry_after(1))
    if isinstance(exc, ClassRetiredError):  # sent again, the new policy routes it
        return ServiceUnavailable(str(exc), code="class_removed", headers=retry_after(1))
    if isinstance(exc, ModelCapacityError):  # never answered by evicting a pinned model: the client retries
        return ServiceUnavailable(str(exc), param="model", code="model_does_not_fit", headers=retry_after(30))
    if isinstance(exc, ModelUnloadedError):  # it left again while loading again: rare, and a retry loads it
        return ServiceUnavailable(str(exc), param="model", code="model_unloaded", headers=retry_after(1))
    if isinstance(exc, ShuttingDownError):
        return ServiceUnavailable(str(exc), code="shutting_down", headers=retry_after(10))
    if isinstance(exc, ModelLoadingError):
        return ServiceUnavailable(str(exc), param="model", code="model_loading", headers=retry_after(2))
    if isinstance(exc, ModelLoadError):
        return ServiceUnavailable(str(exc), param="model", code="model_load_failed", headers=retry_after(5))
    if isinstance(exc, EmbedBatchError):  # the batch failed on the device: say why, not just its type
        return ApiError(str(exc), status_code=500, code="engine_error")
    if isinstance(exc, UnknownModelError):
        return NotFound(str(exc.args[0] if exc.args else exc), param="model", code="model_not_found")
    if isinstance(exc, (RequestError, UnknownClassError)):
        return BadRequest(str(exc.args[0] if exc.args else exc))
    if isinstance(exc, PermissionError):
        return ApiError(str(exc), status_code=403)
    if isinstance(exc, RecursionError):  # a body deeper than the guard's bound reached a parser anyway
        return BadRequest("the request is nested too deeply to parse", code="json_too_deep")
    if isinstance(exc, ValidationException):
        return _validation_error(exc)
    if isinstance(exc, HTTPException) and exc.status_code == 400 and _is_malformed(str(exc.detail)):
        return BadRequest(f"malformed JSON body: {exc.detail}")
    if isinstance(exc, HTTPException):
        headers = dict(exc.headers or {})
        return ApiError(str(exc.detail), status_code=exc.status_code, headers=headers)
    log.error("unexpected error while serving a request", exc_info=exc)
    return ApiError(f"internal error: {type(exc).__name__}", status_code=500)


def _is_malformed(message: str) -> bool:
    """msgspec's words for a body that is not JSON (or not a JSON object) at all."""
    return message.startswith(("JSON is malformed", "Input data was truncated", "Expected `object`")) \
        and "at `$" not in message


def _validation_error(exc: ValidationException) -> BadRequest:
    """Name the offending field: Litestar's extra holds msgspec's message with a ``$.path``."""
    problems = [p for p in (exc.extra if isinstance(exc.extra, list) else []) if isinstance(p, dict)]
    for problem in problems:
        message = str(problem.get("message", exc.detail))
        if _is_malformed(message):
            return BadRequest(f"malformed JSON body: {message}")
        if message == "'data'":  # Litestar's KeyError text for a request without a body
            return BadRequest("a JSON request body is required")
        at = re.search(r"at `\$\.?([^`]*)`", message)
        path = at.group(1) if at else ""
        named = re.search(r"(?:missing required|unknown) field `([^`]*)`", message)
        if named:
            path = f"{path}.{named.group(1)}" if path else named.group(1)
        key = problem.get("key")
        param = path or (key if key and key != "data" else None)
        text = re.sub(r"\s*-\s*at `\$[^`]*`", "", message)
        return BadRequest(f"invalid field {param!r}: {text}" if param else text, param=param)
    return BadRequest(str(exc.detail))


def error_body(err: ApiError, path: str) -> dict[str, Any]:
    """The error in the shape the path's API family uses."""
    if path.startswith("/api/") or path == "/api":
        return {"error": err.message}
    body: dict[str, Any] = {"message": err.message, "type": err.type, "param": err.param, "code": err.code}
    if err.errors is not None:
        body["errors"] = err.errors
    return {"error": body}


def exception_handler(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    """The app's one exception handler (registered for Exception)."""
    err = to_api_error(exc)
    return Response(error_body(err, request.url.path), status_code=err.status_code, headers=err.headers)
