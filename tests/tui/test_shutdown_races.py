"""Answers that land while the app shuts down must not fail it. The stats stream keeps delivering, and a
screen's worker may be waiting for the server, as the screens' widgets are removed or after the screens are
gone; drawing then raised from the worker (NoMatches on the widgets, ScreenStackError on an empty stack),
and Textual re-raised that at the end of a Pilot test: CI saw it once, at the end of the jobs screen's Pilot
test. Each case releases the held answer a number of event-loop turns into the shutdown (each turn lets it
remove a little more)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from tui_helpers import ReplayClient, recorded_json

from tui.app import MonitorApp
from tui.client import Connection
from tui.documents import JobView, StatsDoc, convert


class HeldBackDocs(ReplayClient):
    """Streams its first document at once and the rest only when ``release`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()

    async def stats_events(self) -> AsyncIterator[StatsDoc | Connection]:
        yield Connection(True, "live")
        yield self.docs[0]
        await self.release.wait()
        for doc in self.docs[1:4]:
            yield doc
        await asyncio.Event().wait()


class HeldBackJobs(ReplayClient):
    """Answers the jobs screen's list only when ``release`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.asked = asyncio.Event()

    async def list_jobs(self) -> list[JobView]:
        self.asked.set()
        await self.release.wait()
        return []


async def shut_down_with_a_late_answer(client: HeldBackDocs | HeldBackJobs, turns: int, keys: str = "") -> None:
    """Run the app (after ``keys``), then release the client's held answer ``turns`` event-loop turns after
    its shutdown began."""
    app = MonitorApp(client)
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.press(*keys)
        await pilot.pause(0.1)

        async def release_during_shutdown() -> None:
            while app.is_running:
                await asyncio.sleep(0)
            for _ in range(turns):
                await asyncio.sleep(0)
            client.release.set()

        release = asyncio.get_running_loop().create_task(release_during_shutdown())
    await release


async def test_documents_that_land_while_the_app_shuts_down_do_not_fail_it() -> None:
    # Turns 9-15 released the documents while the dashboard's widgets were being removed: NoMatches.
    for turns in range(0, 30, 3):
        await shut_down_with_a_late_answer(HeldBackDocs(), turns)


async def test_a_job_list_that_lands_while_the_app_shuts_down_does_not_fail_it() -> None:
    for turns in range(0, 48, 4):
        client = HeldBackJobs()
        await shut_down_with_a_late_answer(client, turns, keys="j")
        assert client.asked.is_set()


async def test_a_document_arriving_after_the_screens_are_gone_is_kept_without_failing() -> None:
    last = recorded_json()[-1]
    app = MonitorApp(ReplayClient([convert(last, StatsDoc)]), follow=False)
    async with app.run_test(size=(120, 24)):
        pass
    assert not app.screen_stack
    app.add_stats(convert(last, StatsDoc))
    assert app.stats is not None and app.history.num_docs == 1
