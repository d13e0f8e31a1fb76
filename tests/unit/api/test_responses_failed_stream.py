"""A streamed response that fails midway (an engine error, the drain's deadline) keeps what it streamed: its
open message is closed "incomplete" (its done events come) and the failed response carries it. It sent
``response.failed`` with an empty output, and the message it had opened never closed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from types import SimpleNamespace
from typing import Any

import pytest

from homeai.api import responses_routes
from homeai.api.generation import AnswerStep
from homeai.api.openai_schemas import ResponsesRequest
from homeai.api.tool_calls import ParseEvent
from homeai.api.tools import ToolPlan


class FailingReader:
    def __init__(self, generation: Any, reads_calls: bool) -> None:
        pass

    async def steps(self) -> AsyncGenerator[AnswerStep, None]:
        yield AnswerStep("Hello", [ParseEvent(text="Hello")])
        yield AnswerStep(error="engine error: the device failed", finished=True)


def test_a_failed_stream_keeps_its_text_and_closes_its_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(responses_routes, "AnswerReader", FailingReader)
    gen = SimpleNamespace(request_id="r1", prompt_ids=[1, 2, 3], num_output_tokens=1, num_cached_tokens=0,
                          route=SimpleNamespace(model="m"))
    reply = responses_routes._Reply(gen, ResponsesRequest(model="m", input="hi"),  # type: ignore[arg-type]
                                    ToolPlan([], "none", []))
    admitted = SimpleNamespace(generation=gen, reads_calls=False)

    async def collect() -> list[dict[str, Any]]:
        return [json.loads(line[len(b"data: "):]) async for chunk in responses_routes.response_events(admitted, reply)  # type: ignore[arg-type]
                for line in chunk.splitlines() if line.startswith(b"data: ")]

    events = asyncio.run(collect())
    kinds = [e["type"] for e in events]
    assert kinds[-2:] == ["error", "response.failed"]
    done = next(e for e in events if e["type"] == "response.output_item.done")
    assert kinds.index("response.output_item.done") < kinds.index("error")
    assert done["item"]["status"] == "incomplete" and done["item"]["content"][0]["text"] == "Hello"
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["output"][0]["content"][0]["text"] == "Hello"
    assert failed["error"]["message"] == "engine error: the device failed"
