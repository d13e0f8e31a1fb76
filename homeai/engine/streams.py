"""Hands token deltas from the engine thread to asyncio consumers without blocking the engine.

The engine calls ``publish`` once per step with every delta of that step; one
``call_soon_threadsafe`` per event loop wakes the consumers, so a step with 32 sequences costs one
cross-thread hop, not 32.
"""

from __future__ import annotations

import asyncio
import threading
from collections import defaultdict
from collections.abc import Iterable

from homeai.core.types import TokenDelta


class StreamRegistry:
    """request id -> (event loop, queue); consumers read their queue, the engine publishes to all."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue[TokenDelta]]] = {}

    def open(self, request_id: str) -> asyncio.Queue[TokenDelta]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[TokenDelta] = asyncio.Queue()
        with self._lock:
            if request_id in self._streams:
                raise ValueError(f"request id {request_id!r} is already in use")
            self._streams[request_id] = (loop, queue)
        return queue

    def close(self, request_id: str) -> None:
        with self._lock:
            self._streams.pop(request_id, None)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._streams

    def publish(self, deltas: Iterable[TokenDelta]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue[TokenDelta], TokenDelta]]] = \
            defaultdict(list)
        with self._lock:
            for delta in deltas:
                entry = self._streams.get(delta.request_id)
                if entry is not None:
                    by_loop[entry[0]].append((entry[1], delta))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:  # the consumer's loop is closed: nobody is listening any more
                pass


def _deliver(items: list[tuple[asyncio.Queue[TokenDelta], TokenDelta]]) -> None:
    for queue, delta in items:
        queue.put_nowait(delta)
