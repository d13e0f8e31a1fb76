"""What a request body must be before a handler sees it: the media type its route reads, nested at most
``MAX_JSON_DEPTH`` levels, and, for a typed JSON body, of exactly the types its schema names.

- **Media type.** Every route that reads a body reads JSON (``application/json``, with an optional
  ``charset=utf-8``), except ``PUT /admin/policy`` (``opt={"body": "yaml"}``: a YAML type, text/plain or
  none). Anything else, a form or a text/plain body above all (what a web page can send without asking),
  is a 415 naming the type, before the body is read. A body-less request needs no type.
- **Depth.** See ``homeai.api.json_depth``.
- **Strict types.** Litestar converts a body to its Struct leniently (``"10"`` becomes 10, ``"true"``
  True); OpenAI refuses those, and so do we: the body is first decoded strictly against the handler's
  ``data`` type, and a mismatch is a 400 naming the field. Malformed JSON is left to Litestar's own error.

``check_body`` runs in the app-wide ``authenticate`` guard, after the caller is known (a stranger gets 401
whatever the body) and before Litestar parses anything.
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request
from litestar.connection import ASGIConnection
from litestar.exceptions import ValidationException
from litestar.handlers.base import BaseRouteHandler

from homeai.api.errors import ApiError
from homeai.api.json_depth import check_json_depth

JSON, YAML = "json", "yaml"  # values of a route's opt["body"] (default JSON)
JSON_TYPES = frozenset({"application/json"})
YAML_TYPES = frozenset({"application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml", "text/plain"})
UTF8 = frozenset({"utf-8", "utf8"})
BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class UnsupportedMediaType(ApiError):
    status_code = 415


def parse_media_type(header: str) -> tuple[str, dict[str, str]]:
    """``application/json; charset=UTF-8`` -> ("application/json", {"charset": "utf-8"})."""
    kind, *params = header.split(";")
    parsed = {}
    for param in params:
        key, _, value = param.partition("=")
        parsed[key.strip().lower()] = value.strip().strip('"').lower()
    return kind.strip().lower(), parsed


def has_body(connection: ASGIConnection[Any, Any, Any, Any]) -> bool:
    length = connection.headers.get("content-length")
    return "transfer-encoding" in connection.headers or (length is not None and length.strip() not in ("", "0"))


def check_media_type(connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler) -> None:
    """415 unless the body (if any) is of a type the route reads."""
    reads = handler.opt.get("body", JSON)
    accepted = YAML_TYPES if reads == YAML else JSON_TYPES
    wanted = "application/yaml" if reads == YAML else "application/json"
    header = connection.headers.get("content-type")
    if header is None:
        if reads == JSON and has_body(connection):
            raise UnsupportedMediaType(f"the body has no Content-Type; send it as {wanted}",
                                       code="unsupported_media_type")
        return
    kind, params = parse_media_type(header)
    charset = params.get("charset")
    if kind not in accepted or (charset is not None and charset not in UTF8):
        raise UnsupportedMediaType(f"Content-Type {header.strip()!r} is not accepted here; send the body as "
                                   f"{wanted}" + ("" if reads == YAML else " (charset utf-8, if any)"),
                                   code="unsupported_media_type")


def strict_type(handler: BaseRouteHandler) -> type | None:
    """The msgspec Struct a handler's ``data`` is (None: no typed body)."""
    field = handler.parsed_fn_signature.parameters.get("data")
    annotation = getattr(field, "annotation", None)
    return annotation if isinstance(annotation, type) and issubclass(annotation, msgspec.Struct) else None


async def check_strict_types(request: Request[Any, Any, Any], handler: BaseRouteHandler) -> None:
    """400 naming the field when the body's values are not of its schema's types (no coercion)."""
    kind = strict_type(handler)
    body = await request.body()
    if kind is None or not body.strip():
        return
    try:
        msgspec.json.decode(body, type=kind, strict=True)
    except msgspec.ValidationError as e:
        raise ValidationException("Validation failed", extra=[{"message": str(e), "key": "data",
                                                                "source": "body"}]) from None
    except msgspec.DecodeError:
        return  # malformed: Litestar's own parse says so


async def check_body(connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler) -> None:
    """Media type, depth and strict types of a request's body (a no-op for requests without one)."""
    if connection.scope["type"] != "http" or connection.scope.get("method") not in BODY_METHODS:
        return
    check_media_type(connection, handler)
    if connection.scope.get("method") == "DELETE" or not isinstance(connection, Request):
        return
    await check_json_depth(connection)
    await check_strict_types(connection, handler)
