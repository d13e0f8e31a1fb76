"""Waiting in tests: for a condition, never for a length of time.

A test that needs something to have happened waits until it has (an event, a marker, a counter that
moves) and then asserts; it never sleeps a fixed time and checks that nothing happened, and never
asserts how long anything took (speed is measured by the benches). Where the thing happens in another
process or thread and there is nothing to await, ``wait_until`` polls a predicate under a deadline.
The deadline only turns a hang into a failure: it is generous (the tests share two busy cores) and no
assertion depends on how long the wait took.

pytest puts ``tests/`` on sys.path (``tests/conftest.py`` has no package): import this as ``waiting``.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

T = TypeVar("T")
DEFAULT_TIMEOUT_S = 60.0


def _failure(what: str | Callable[[], str] | None, predicate: object, timeout_s: float, last: object) -> str:
    described = what() if callable(what) else what
    return f"timed out after {timeout_s:g} s waiting for {described or predicate} (last value: {last!r})"


def wait_until(predicate: Callable[[], T], timeout_s: float = DEFAULT_TIMEOUT_S, *, interval_s: float = 0.05,
               what: str | Callable[[], str] | None = None) -> T:
    """The first truthy value of ``predicate()``, checked every ``interval_s``; fails the test (naming
    ``what``, or what ``what()`` says then, and the last value) if none comes within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(_failure(what, predicate, timeout_s, value))
        time.sleep(interval_s)


async def await_until(predicate: Callable[[], T | Awaitable[T]], timeout_s: float = DEFAULT_TIMEOUT_S, *,
                      interval_s: float = 0.01, what: str | Callable[[], str] | None = None,
                      pause: Callable[[], Awaitable[object]] | None = None) -> T:
    """``wait_until`` on the event loop: the predicate may be a coroutine function, and the loop runs
    between checks (``pause``, e.g. a Textual pilot's, or ``asyncio.sleep(interval_s)``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value  # type: ignore[return-value]
        if time.monotonic() > deadline:
            pytest.fail(_failure(what, predicate, timeout_s, value))
        await (pause() if pause is not None else asyncio.sleep(interval_s))
