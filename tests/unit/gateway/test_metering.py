"""The gateway's meter: each submission is recorded exactly once, with the outcome its caller saw.

A real MetricsRecorder is the sink, and fake engine streams stand in for the LLM engine (the meter only
sees async iterators of token deltas and awaitables), so every ending is driven deterministically:
a full stream, a caller that stops reading, a cancelled reader, a queue that is full, a queue timeout.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from homeai.core.types import FinishReason, TokenDelta
from homeai.engine.embed_service import QueueTimeoutError
from homeai.gateway.metering import Meter, Submission
from homeai.metrics.recorder import FinishedRequest, MetricsRecorder
from homeai.scheduling.class_queue import QueueFullError


class Engine:
    """A stand-in for LLMEngine.generate: yields ``deltas``, then raises ``fail`` if set; remembers
    whether it was closed before its final delta (the real engine aborts the sequence then)."""

    def __init__(self, deltas: list[TokenDelta], fail: BaseException | None = None,
                 block: asyncio.Event | None = None) -> None:
        self.deltas, self.fail, self.block = deltas, fail, block
        self.aborted = False
        self.closed = False

    async def generate(self) -> AsyncIterator[TokenDelta]:
        finished = False
        try:
            if self.fail is not None:
                raise self.fail
            for delta in self.deltas:
                finished = delta.finished
                yield delta
            if self.block is not None:
                await self.block.wait()
        finally:
            self.closed = True
            self.aborted = not finished


def delta(n: int, reason: FinishReason | None = None, error: str | None = None,
          timed_out: bool = False) -> TokenDelta:
    return TokenDelta("r", "x" * n, list(range(n)), 3, 0, reason, error, timed_out=timed_out)


def meter_and_log() -> tuple[Meter, MetricsRecorder, list[FinishedRequest]]:
    recorder = MetricsRecorder()
    done: list[FinishedRequest] = []
    recorder.listeners.append(done.append)
    return Meter(recorder), recorder, done


def sub(request_id: str = "r", kind: str = "chat", class_name: str = "chat") -> Submission:
    return Submission(request_id, kind, class_name, "alice", "m", 3)


async def read_all(stream: AsyncIterator[TokenDelta]) -> list[TokenDelta]:
    return [d async for d in stream]


async def test_a_full_stream_is_one_ok_record_with_its_tokens() -> None:
    meter, recorder, done = meter_and_log()
    engine = Engine([delta(1), delta(2), delta(1, FinishReason.STOP)])
    got = await read_all(meter.stream(sub(), engine.generate()))
    assert len(got) == 3 and not engine.aborted
    assert [(d.status, d.num_output_tokens, d.num_prompt_tokens, d.user) for d in done] == [("ok", 4, 3, "alice")]
    assert done[0].ttft_ms is not None and done[0].itl_ms is not None
    assert recorder.requests_by_status("chat") == {"ok": 1}
    assert recorder.user_rates()["alice"]["generated_tokens"] == 4
    assert recorder.num_live() == 0


async def test_a_reader_that_stops_after_the_final_delta_leaves_nothing_open() -> None:
    meter, recorder, done = meter_and_log()
    stream = meter.stream(sub(), Engine([delta(2, FinishReason.LENGTH)]).generate())
    async for d in stream:
        assert d.finished
        break  # no aclose: the record must already be complete
    assert [d.status for d in done] == ["ok"] and recorder.num_live() == 0
    await stream.aclose()
    assert len(done) == 1


async def test_closing_mid_stream_is_aborted_once_and_aborts_the_engine_stream() -> None:
    meter, recorder, done = meter_and_log()
    engine = Engine([delta(1), delta(1), delta(1, FinishReason.STOP)])
    stream = meter.stream(sub(), engine.generate())
    assert len((await anext(stream)).token_ids) == 1
    await stream.aclose()
    await stream.aclose()
    assert engine.closed and engine.aborted
    assert [(d.status, d.num_output_tokens) for d in done] == [("aborted", 1)]
    assert recorder.num_live() == 0


async def test_a_cancelled_reader_is_aborted() -> None:
    meter, recorder, done = meter_and_log()
    engine = Engine([delta(1)], block=asyncio.Event())  # then waits for a next delta that never comes

    async def reader() -> None:
        await read_all(meter.stream(sub(), engine.generate()))

    task = asyncio.create_task(reader())
    for _ in range(5):
        await asyncio.sleep(0)
    assert recorder.num_live() == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [d.status for d in done] == ["aborted"] and engine.aborted


async def test_a_full_queue_is_rejected_and_counted_as_a_rejection() -> None:
    meter, recorder, done = meter_and_log()
    stream = meter.stream(sub(class_name="voice"), Engine([], fail=QueueFullError(1.0, "voice")).generate())
    with pytest.raises(QueueFullError):
        await anext(stream)
    assert [d.status for d in done] == ["rejected"]
    assert recorder.rejections("voice") == {"queue_full": 1}


@pytest.mark.parametrize(("error", "timed_out", "status"), [
    ("queue timeout", True, "timeout"), ("device failed", False, "error"),
    ("engine error: timeout reading a weight file", False, "error"),  # a timeout is a status, not a word
])
async def test_an_error_delta_ends_the_record(error: str, timed_out: bool, status: str) -> None:
    meter, recorder, done = meter_and_log()
    got = await read_all(meter.stream(sub(), Engine([delta(0, error=error, timed_out=timed_out)]).generate()))
    assert len(got) == 1
    assert [(d.status, d.ttft_ms) for d in done] == [(status, None)]
    assert recorder.rejections("chat") == ({"timeout": 1} if status == "timeout" else {})


async def test_an_engine_abort_is_aborted() -> None:
    meter, _, done = meter_and_log()
    await read_all(meter.stream(sub(), Engine([delta(1), delta(0, FinishReason.ABORT)]).generate()))
    assert [d.status for d in done] == ["aborted"] and done[0].ttft_ms is not None


async def test_a_stream_ended_before_its_first_token_has_no_ttft() -> None:
    meter, recorder, done = meter_and_log()
    await read_all(meter.stream(sub(), Engine([delta(0), delta(0, FinishReason.ABORT)]).generate()))
    assert [(d.status, d.ttft_ms, d.num_output_tokens) for d in done] == [("aborted", None, 0)]
    assert recorder.class_latency("chat")["ttft_samples"] == 0


async def test_a_stream_never_read_is_never_recorded() -> None:
    meter, recorder, done = meter_and_log()
    stream = meter.stream(sub(), Engine([delta(1, FinishReason.STOP)]).generate())
    await stream.aclose()
    assert done == [] and recorder.num_live() == 0


async def test_embedding_calls_record_each_outcome_once() -> None:
    meter, recorder, done = meter_and_log()

    async def vectors() -> str:
        return "v"

    async def failing(exc: BaseException) -> str:
        raise exc

    assert await meter.call(sub("a", "embedding", "indexing"), vectors()) == "v"
    for rid, exc in (("b", QueueFullError(1.0)), ("c", QueueTimeoutError("late")), ("d", ValueError("bad"))):
        with pytest.raises(type(exc)):
            await meter.call(sub(rid, "embedding", "indexing"), failing(exc))
    assert [(d.request_id, d.status, d.kind) for d in done] == [
        ("a", "ok", "embedding"), ("b", "rejected", "embedding"), ("c", "timeout", "embedding"),
        ("d", "error", "embedding")]
    assert recorder.requests_by_status("indexing") == {"ok": 1, "rejected": 1, "timeout": 1, "error": 1}
    assert recorder.user_rates()["alice"]["prompt_tokens"] == 12


async def test_the_last_placement_names_the_node_that_served_it() -> None:
    meter, _, done = meter_and_log()

    async def placed_then_served(node_names: list[str]) -> AsyncIterator[TokenDelta]:
        for node in node_names:  # the cluster router places (and, after a failed replica, places again)
            meter.placed("r", node)
        yield delta(1, FinishReason.STOP)

    await read_all(meter.stream(sub("r"), placed_then_served(["node-a", "node-b"])))
    await read_all(meter.stream(sub("r"), placed_then_served([])))  # a single box: never placed
    assert [d.node for d in done] == ["node-b", None]


async def test_a_broken_sink_never_fails_the_request() -> None:
    class Broken:
        def __getattr__(self, name: str) -> object:
            def fail(*args: object) -> None:
                raise RuntimeError("sink down")
            return fail

    meter = Meter(Broken())  # type: ignore[arg-type]
    got = await read_all(meter.stream(sub(), Engine([delta(1, FinishReason.STOP)]).generate()))
    assert len(got) == 1
    meter.placed("r", "node-a")  # logged, not raised


async def test_the_wait_in_the_class_queue_reaches_the_histogram_and_the_log() -> None:
    """The engine reports a request's wait in its class queue on its first delta after admission;
    homeai_queue_seconds had no sample and the request log's queue_ms was always empty."""
    meter, recorder, done = meter_and_log()
    first = delta(1)
    first.queue_s = 0.25
    await read_all(meter.stream(sub(), Engine([first, delta(1, FinishReason.STOP)]).generate()))
    assert done[0].queue_ms == pytest.approx(250.0)
    text = recorder.prometheus_text().decode()
    assert 'homeai_queue_seconds_count{class_name="chat"} 1.0' in text
    assert 'homeai_queue_seconds_sum{class_name="chat"} 0.25' in text
