"""The indexer's test-only pause point: it blocks exactly at the N-th file, once per marker, and never
when unarmed (the sigkill integration test depends on all three)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from homeai.jobs.pause_point import PAUSE_AFTER_FILES_ENV, PAUSE_MARKER_ENV, pause_after_files


async def blocks(num_files: int) -> bool:
    """Whether the pause point waits instead of returning: its task is still pending after its first step
    (an armed point waits on what only a cancel or the process's death ends; the check itself never waits)."""
    point = asyncio.ensure_future(pause_after_files(num_files))
    await asyncio.sleep(0)  # one loop turn: the task has run up to its first wait, or to its end
    if point.done():
        point.result()
        return False
    point.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await point
    return True


async def test_unarmed_never_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PAUSE_AFTER_FILES_ENV, raising=False)
    monkeypatch.delenv(PAUSE_MARKER_ENV, raising=False)
    assert not any([await blocks(n) for n in range(1, 5)])


async def test_blocks_at_the_nth_file_once_per_marker(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    marker = tmp_path / "paused"
    monkeypatch.setenv(PAUSE_AFTER_FILES_ENV, "3")
    monkeypatch.setenv(PAUSE_MARKER_ENV, str(marker))
    assert not await blocks(2) and not marker.exists()
    assert await blocks(3)
    assert marker.read_text() == "3"
    assert not await blocks(3)  # the marker exists: a restarted server resumes without pausing again
