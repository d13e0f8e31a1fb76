"""Hands token deltas from the engine thread to asyncio consumers without blocking the engine.

The engine calls ``publish`` once per step with every delta of that step; one
``call_soon_threadsafe`` per event loop wakes the consumers, so a step with 32 sequences costs one
cross-thread hop, not 32. A request the device thread could not queue gets its error the same way
(``fail``), so the caller raises it where it awaits the first delta.
"""

from __future__ import annotations

import asyncio
import threading
from collections import defaultdict
from collections.abc import Iterable

from homeai.core.types import TokenDelta

StreamItem = TokenDelta | Exception
_Entry = tuple[asyncio.AbstractEventLoop, "asyncio.Queue[StreamItem]"]


class StreamRegistry:
    """request id -> (event loop, queue); consumers read their queue, the engine publishes to all."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._streams: dict[str, _Entry] = {}

    def open(self, request_id: str) -> asyncio.Queue[StreamItem]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[StreamItem] = asyncio.Queue()
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
        self._send([(delta.request_id, delta) for delta in deltas])

    def fail(self, request_id: str, exc: Exception) -> None:
        """The consumer raises ``exc`` instead of reading a delta (e.g. QueueFullError: HTTP 429)."""
        self._send([(request_id, exc)])

    def _send(self, items: list[tuple[str, StreamItem]]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue[StreamItem], StreamItem]]] = \
            defaultdict(list)
        with self._lock:
            for request_id, item in items:
                entry = self._streams.get(request_id)
                if entry is not None:
                    by_loop[entry[0]].append((entry[1], item))
        for loop, batch in by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver, batch)
            except RuntimeError:  # the consumer's loop is closed: nobody is listening any more
                pass


def _deliver(items: list[tuple[asyncio.Queue[StreamItem], StreamItem]]) -> None:
    for queue, item in items:
        queue.put_nowait(item)
