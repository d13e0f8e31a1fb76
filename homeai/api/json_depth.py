"""A bound on how deeply a request body may nest, checked before anything parses it.

msgspec (and the json module) recurse once per level and raise RecursionError near a thousand levels,
which would reach the client as a 500 with a traceback in the log. No request of ours needs more than
a few levels (a tool's JSON schema perhaps a dozen), so a body nested deeper than ``MAX_JSON_DEPTH``
gets a 400 that says so. The check is a C-speed pass (a regex that blanks strings, then a cumulative
sum over the brackets), and it is skipped when the body has too few brackets to be that deep.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
from litestar import Request
from litestar.connection import ASGIConnection

from homeai.api.errors import BadRequest

MAX_JSON_DEPTH = 64
# A string, or an unterminated one to the end of the body: the possessive loop never backtracks and every
# string start matches, so the pass is linear. Requiring the closing quote made a malformed body such as
# ``["\"\"\"...`` quadratic (each quote a new start scanning to the end): 80 KB held the event loop 20 s.
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*+(?:"|\\?\Z)', re.DOTALL)
_OPEN = np.zeros(256, dtype=np.int32)
_OPEN[[ord("["), ord("{")]] = 1
_OPEN[[ord("]"), ord("}")]] = -1


def json_depth(body: bytes) -> int:
    """The deepest nesting of ``[``/``{`` outside JSON strings (a lower bound for malformed bodies)."""
    stripped = _STRING.sub(b'""', body)
    if not stripped:
        return 0
    steps = _OPEN[np.frombuffer(stripped, dtype=np.uint8)]
    return int(np.cumsum(steps).max(initial=0))


def too_deep(body: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    if body.count(b"[") + body.count(b"{") <= limit:  # cannot nest deeper than its brackets
        return False
    return json_depth(body) > limit


async def check_json_depth(connection: ASGIConnection[Any, Any, Any, Any], limit: int = MAX_JSON_DEPTH) -> None:
    """Read the body (Litestar keeps it for the handler) and refuse one nested deeper than ``limit``."""
    if not isinstance(connection, Request):
        return
    body = await connection.body()
    if too_deep(body, limit):
        raise BadRequest(f"the JSON body is nested more than {limit} levels deep", code="json_too_deep")
