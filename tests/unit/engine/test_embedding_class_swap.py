"""A policy swap that takes an embedding class away (or moves it to another encoder) fails what its queue
held with the reason, as a retired LLM class's unstarted requests fail. Before, the queue stayed and each
batch of it failed on the device ("class 'indexing' is not an embedding class"): HTTP 500s, and after three
such batches the embedding engine counted as failing, so /readyz said 503 to a supervisor."""

from __future__ import annotations

import asyncio

import pytest
from test_device_loop import Rig
from test_device_ownership import FakeEncoder

from homeai.engine.embed_service import EmbedInput
from homeai.engine.errors import QueueTimeoutError
from homeai.policy.loader import parse_policy
from homeai.scheduling.class_queue import QueuedItem
from homeai.scheduling.class_scheduler import UnknownClassError

CHAT = "  chat: {kind: llm, model: m}\n"
INDEXING = ("  indexing: {kind: embedding, model: %s, background: true, min_share: 0.1, max_batch_size: 4,\n"
            "             default_queue_policy: {max_queue_size: 100}}\n")


def policy(indexing_model: str | None) -> str:
    return "classes:\n" + CHAT + (INDEXING % indexing_model if indexing_model else "")


def queue_inputs(rig: Rig, n: int) -> list[QueuedItem]:
    aloop = asyncio.get_running_loop()
    items = [QueuedItem(f"i{i}", "indexer", payload=EmbedInput([1, 2, 3], aloop, aloop.create_future()))
             for i in range(n)]
    rig.embed.submit("indexing", items)
    rig.embed.apply_inbox()  # queued, none embedded yet
    return items


async def swap_and_run(rig: Rig, text: str) -> None:
    rig.loop.post_policy(parse_policy(text, source="swap"))
    for _ in range(10):
        rig.loop.run_once()
        rig.clock.advance(0.01)
    await asyncio.sleep(0)  # the answers are delivered on the event loop


async def test_removing_an_embedding_class_fails_its_queue_with_the_reason_and_not_the_engine() -> None:
    rig = Rig(parse_policy(policy("e"), source="before"), asyncio.get_running_loop())
    items = queue_inputs(rig, 16)
    await swap_and_run(rig, policy(None))
    errors = {str(it.payload.future.exception()) for it in items}
    assert errors == {"class 'indexing' was removed by a policy change"}
    assert all(isinstance(it.payload.future.exception(), QueueTimeoutError) for it in items)  # 503
    assert rig.embed.health.consecutive_failures == 0 and not rig.embed.health.failing
    assert "indexing" not in rig.batcher.embed_queues
    late = QueuedItem("late", "indexer", payload=EmbedInput([1], items[0].payload.loop,
                                                             asyncio.get_running_loop().create_future()))
    rig.embed.submit("indexing", [late])  # routed before the swap, posted after: a 400 naming the class
    rig.loop.run_once()
    await asyncio.sleep(0)
    with pytest.raises(UnknownClassError, match="'indexing' is not an embedding class"):
        late.payload.future.result()


async def test_moving_an_embedding_class_to_another_encoder_fails_what_was_tokenized_for_the_old_one() -> None:
    rig = Rig(parse_policy(policy("e"), source="before"), asyncio.get_running_loop())
    rig.embed.embedders["e2"] = FakeEncoder(rig.clock)  # type: ignore[assignment]
    items = queue_inputs(rig, 8)
    await swap_and_run(rig, policy("e2"))
    assert {str(it.payload.future.exception()) for it in items} == {
        "class 'indexing' now runs on model 'e2', not 'e'"}
    after = queue_inputs(rig, 2)  # the class stays, on its new encoder
    for _ in range(10):
        rig.loop.run_once()
        rig.clock.advance(0.06)  # past the class's delay window
    await asyncio.sleep(0)
    assert all(it.payload.future.done() and it.payload.future.exception() is None for it in after)
    assert not rig.embed.health.failing


async def test_an_input_posted_before_the_class_moved_is_not_embedded_by_the_new_encoder() -> None:
    """Tokenized for 'e' and still in the inbox when the class moved to 'e2': it was pushed after the swap
    and embedded by 'e2' with 'e''s token ids (wrong vectors in the index, no error)."""
    rig = Rig(parse_policy(policy("e"), source="before"), asyncio.get_running_loop())
    rig.embed.embedders["e2"] = FakeEncoder(rig.clock)  # type: ignore[assignment]
    aloop = asyncio.get_running_loop()
    posted = QueuedItem("p0", "indexer", payload=EmbedInput([1, 2, 3], aloop, aloop.create_future(), "e"))
    rig.embed.submit("indexing", [posted])
    await swap_and_run(rig, policy("e2"))
    error = posted.payload.future.exception()
    assert isinstance(error, QueueTimeoutError) and str(error) == "class 'indexing' now runs on model 'e2', not 'e'"


class Tagged(FakeEncoder):
    """An encoder that records which of them embedded which rows."""

    def __init__(self, clock: object, name: str, log: list[tuple[str, list[list[int]]]]) -> None:
        super().__init__(clock)
        self.name, self.log = name, log

    def embed(self, token_ids: list[list[int]]) -> object:  # type: ignore[override]
        self.log.append((self.name, token_ids))
        return super().embed(token_ids)


async def test_rows_tokenized_before_a_move_are_not_embedded_by_the_new_encoder() -> None:
    """Rows the route's encoder ('e') made, posted after a swap moved the class to 'e2': they fail (503) and
    the caller tokenizes again. Before: they were stamped with the class's encoder at posting time, 'e2',
    which embedded 'e''s token ids (an indexing run then filled the index with wrong vectors, silently)."""
    log: list[tuple[str, list[list[int]]]] = []
    rig = Rig(parse_policy(policy("e"), source="before"), asyncio.get_running_loop())
    rig.embed.embedders["e"] = Tagged(rig.clock, "e", log)
    rig.embed.embedders["e2"] = Tagged(rig.clock, "e2", log)
    rig.loop.post_policy(parse_policy(policy("e2"), source="swap"))
    rig.loop.run_once()  # the swap lands while the rows were being made
    task = asyncio.ensure_future(rig.embed.embed("indexing", [[101, 7, 8, 102]], "indexer", model="e"))
    for _ in range(50):
        await asyncio.sleep(0)
        rig.loop.run_once()
        rig.clock.advance(0.06)
        if task.done():
            break
    with pytest.raises(QueueTimeoutError, match="now runs on model 'e2', not 'e'"):
        task.result()
    assert log == []


async def test_an_encoder_no_class_uses_after_a_swap_is_dropped_by_the_device_thread() -> None:
    """An embedding model a swap left unused stayed loaded for good (~90 MB for MiniLM, more for larger
    ones). The device thread drops it once it has applied the swap, unless a newer policy (or a load under
    way) wants it."""
    rig = Rig(parse_policy(policy("e"), source="before"), asyncio.get_running_loop())
    rig.embed.embedders["e2"] = FakeEncoder(rig.clock)  # type: ignore[assignment]
    newer: set[str] = set()
    rig.loop._encoders_wanted = lambda: newer
    await swap_and_run(rig, policy("e2"))
    assert set(rig.embed.embedders) == {"e2"}
    rig.embed.embedders["e"] = FakeEncoder(rig.clock)  # type: ignore[assignment]
    newer.add("e")  # posted next: the newer policy moves the class back
    await swap_and_run(rig, policy("e2"))
    assert set(rig.embed.embedders) == {"e", "e2"}
