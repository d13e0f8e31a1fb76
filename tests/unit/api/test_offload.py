"""Short prompts are tokenized where they are awaited, long ones on a worker thread (api/offload.py)."""

from __future__ import annotations

import threading

import pytest

from homeai.api.offload import INLINE_CHARS, text_size, tokenize


def test_size_counts_text_and_refuses_what_it_cannot_measure() -> None:
    assert text_size(["abc", "de"]) == 5
    assert text_size([{"role": "user", "content": "hello"}, {"role": "assistant", "content": None}]) == 5 + 32
    too_long = INLINE_CHARS + 1
    assert text_size([{"role": "user", "content": [{"type": "text", "text": "hi"}]}]) == too_long  # parts
    assert text_size([{"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]}]) == too_long
    assert text_size([3]) == too_long


@pytest.mark.asyncio
@pytest.mark.parametrize(("size", "inline"), [(0, True), (INLINE_CHARS, True), (INLINE_CHARS + 1, False)])
async def test_short_work_runs_here_long_work_on_a_worker(size: int, inline: bool) -> None:
    here = threading.get_ident()
    ran_on = await tokenize(size, lambda scale=1: threading.get_ident() * scale, scale=1)
    assert (ran_on == here) is inline
