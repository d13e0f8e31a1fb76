"""The indexer's test-only pause point: it blocks exactly at the N-th file, once per marker, and never
when unarmed (the sigkill integration test depends on all three)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from homeai.jobs.pause_point import PAUSE_AFTER_FILES_ENV, PAUSE_MARKER_ENV, pause_after_files


async def blocks(num_files: int) -> bool:
    """Whether the pause point is still waiting 50 ms after it was reached."""
    try:
        await asyncio.wait_for(pause_after_files(num_files), timeout=0.05)
    except TimeoutError:
        return True
    return False


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
