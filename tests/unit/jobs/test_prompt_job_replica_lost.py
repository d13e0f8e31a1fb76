"""A prompt job whose node leaves mid-answer asks again (a cluster's other replica answers); any other
failure still fails the run at once. The job has its model loaded first, as an API request does (an
on-demand model whose keep_alive ran out has left the device: the template and tokenizer are its)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from datetime import UTC, datetime
from typing import Any

import pytest

from homeai.core.types import SamplingParams, TokenDelta
from homeai.engine.errors import REPLICA_LOST, QueueTimeoutError
from homeai.gateway.gateway import Route
from homeai.jobs.kinds import MAX_LOST_REPLICAS, ReplicaLostError, run_prompt
from homeai.store.jobs import JobInfo


class ScriptedGateway:
    """Answers each generate() with the next script entry: an error text or the answer's pieces."""

    def __init__(self, script: list[str | list[str]]) -> None:
        self.script = script
        self.calls = 0
        self.loaded: set[str] = set()

    async def ensure_llm(self, model: str, timeout_s: float | None = None, class_name: str = "") -> None:
        self.loaded.add(model)

    def route(self, model: str | None, class_name: str | None, kind: str, user: str) -> Route:
        return Route("m", class_name or "summarize")

    def chat_prompt(self, model: str, messages: list[dict[str, Any]]) -> list[int]:
        if model not in self.loaded:
            raise QueueTimeoutError(f"model {model!r} is not loaded")  # what Gateway.llm() says
        return [1, 2, 3]

    async def generate(self, route: Route, ids: list[int], params: SamplingParams, user: str, request_id: str,
                       kind: str = "chat") -> AsyncGenerator[TokenDelta, None]:
        entry = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        yield TokenDelta(request_id, "Part", [5], 3, 1)
        if isinstance(entry, str):
            yield TokenDelta(request_id, "", [], 3, 1, error=entry)
            return
        for i, piece in enumerate(entry):
            yield TokenDelta(request_id, piece, [6], 3, 2 + i, finish_reason="stop" if i == len(entry) - 1 else None)


def _job() -> JobInfo:
    return JobInfo(7, "prompt", {"prompt": "summarize"}, None, "running", 0, 0, 0, 0, None, "admin",
                   datetime.now(UTC), None, None)


def test_the_job_has_its_model_loaded_before_it_builds_the_prompt() -> None:
    gw = ScriptedGateway([[" done"]])
    assert asyncio.run(run_prompt(gw, _job(), "summarize")) == "Part done"
    assert gw.loaded == {"m"}


def test_a_node_that_leaves_mid_answer_is_asked_again() -> None:
    gw = ScriptedGateway([f"{REPLICA_LOST}: node gaming-pc failed while serving the request: ActorDiedError",
                          [" one", " two"]])
    assert asyncio.run(run_prompt(gw, _job(), "summarize")) == "Part one two"
    assert gw.calls == 2


def test_a_node_that_keeps_leaving_fails_the_run_in_the_end() -> None:
    gw = ScriptedGateway([f"{REPLICA_LOST}: node x failed while serving the request: gone"])
    with pytest.raises(ReplicaLostError):
        asyncio.run(run_prompt(gw, _job(), "summarize"))
    assert gw.calls == MAX_LOST_REPLICAS + 1


def test_another_failure_fails_the_run_at_once() -> None:
    gw = ScriptedGateway(["engine step failed: RuntimeError('boom')", [" never"]])
    with pytest.raises(RuntimeError, match="boom"):
        asyncio.run(run_prompt(gw, _job(), "summarize"))
    assert gw.calls == 1
