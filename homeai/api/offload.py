"""Tokenizing on the event loop or off it, by size.

A long prompt takes milliseconds to template and encode (1,500 tokens: ~2.5 ms), which must not stall
every other stream's tokens, so it goes to a worker thread. A short one (a voice command, a search query)
takes ~0.1 ms, less than the hop itself: to the worker and back cost a 46-token prompt ~0.35 ms of its
first token (two cross-thread wake-ups). Below ``INLINE_CHARS`` the work runs where it is awaited.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

T = TypeVar("T")

# ~200 tokens of English; SmolLM2's template and encoder take ~0.12 ms for a 46-token chat (~190 chars).
INLINE_CHARS = 1024


def text_size(parts: Iterable[Any]) -> int:
    """Characters of the strings among ``parts`` and in the text ``content`` of the dicts among them (chat
    messages); anything else (content parts, tool calls) counts as too long to run inline."""
    size = 0
    for part in parts:
        if isinstance(part, str):
            size += len(part)
        elif isinstance(part, dict) and part.keys() <= {"role", "content", "name"} \
                and isinstance(content := part.get("content", ""), str | None):
            size += len(content or "") + 16  # the role and the template's markup around it
        else:
            return INLINE_CHARS + 1
    return size


async def tokenize(size: int, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` here when ``size`` (characters) is at most ``INLINE_CHARS``, else on a worker
    thread."""
    if size <= INLINE_CHARS:
        return fn(*args, **kwargs)
    return await asyncio.to_thread(fn, *args, **kwargs)
