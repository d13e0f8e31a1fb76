"""A test-only pause point in indexing, so a test can SIGKILL the server at a known place instead of
racing a progress poll against the job (which lost on a fast SQLite).

With HOMEAI_TEST_PAUSE_AFTER_FILES=N and HOMEAI_TEST_PAUSE_MARKER=PATH both set, an indexing run that has
just committed its N-th file writes N to PATH and then blocks until it is cancelled or the process dies.
It pauses once per marker: while PATH exists, runs go on, so a server restarted with the same settings
resumes the job. Nothing outside the test suite sets these variables; unset, the check is two lookups.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

PAUSE_AFTER_FILES_ENV = "HOMEAI_TEST_PAUSE_AFTER_FILES"
PAUSE_MARKER_ENV = "HOMEAI_TEST_PAUSE_MARKER"

log = logging.getLogger(__name__)


async def pause_after_files(num_files_committed: int) -> None:
    """Block forever after the N-th committed file of a run when the test settings ask for it."""
    after, marker = os.environ.get(PAUSE_AFTER_FILES_ENV), os.environ.get(PAUSE_MARKER_ENV)
    if not after or not marker or num_files_committed != int(after) or Path(marker).exists():
        return
    partial = Path(f"{marker}.tmp")
    partial.write_text(str(num_files_committed))
    partial.replace(marker)  # the test never reads a half-written marker
    log.warning("test pause point: indexing blocked after %d committed files (%s)", num_files_committed, marker)
    await asyncio.Event().wait()
