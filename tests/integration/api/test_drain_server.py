"""SIGTERM while streams run. A real `homeai serve` (its own, since this test stops it)
with a 3 s drain: the streams go on after the signal, then each ends with its API's final message (a
sampled stream may instead sample its own end during the drain: two run per API that cannot ignore EOS,
and each API must show its drain message); the process exits cleanly with no traceback, and the request
log holds every stream.

Before the fix: streams were cut mid-body after ~5 s with no final chunk, and tracebacks were logged.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_launcher import ServerProcess

pytestmark = pytest.mark.slow

DRAIN_S = 3.0
PROMPT = "Write a very long story about a lighthouse keeper and the sea, chapter by chapter."
# Every stream must still be running when the drain time is up: up to 1,000 tokens (the chat class's cap),
# EOS ignored where the API allows it, else a warm temperature so that an early EOS is unlikely.
HOT = 1.3
MAX_RESTARTS = 3  # a stream that sampled its end before the signal is asked again
SAMPLED_EACH = 2  # streams of each API that cannot ignore EOS


def drain_ending(reader: StreamReader) -> str | None:
    """"drained" when the stream ended with its API's shutdown message, else None."""
    if reader.path == "/api/chat":
        last = json.loads(reader.lines[-1][1])
        return "drained" if "shutting down" in last.get("error", "") else None
    events = sse_events([line for _, line in reader.lines])
    if reader.path == "/v1/responses":
        if events[-1][0] != "response.failed":
            return None
        failed = json.loads(events[-1][1])["response"]
        return "drained" if failed["status"] == "failed" and "shutting down" in failed["error"]["message"] else None
    if events[-1][1] != "[DONE]" or len(events) < 2:
        return None
    error = json.loads(events[-2][1]).get("error")
    return "drained" if error is not None and "shutting down" in error["message"] else None


def natural_ending(reader: StreamReader) -> str | None:
    """"natural" when a sampled stream ended by itself (its end token), with its API's normal last message."""
    if reader.path == "/api/chat":
        last = json.loads(reader.lines[-1][1])
        return "natural" if last.get("done") and "error" not in last else None
    events = sse_events([line for _, line in reader.lines])
    return "natural" if events[-1][0] == "response.completed" else None


class StreamReader(threading.Thread):
    """Reads one streaming response line by line; records when each line arrived."""

    def __init__(self, url: str, path: str, body: dict[str, Any]) -> None:
        super().__init__(daemon=True)
        self.url, self.path, self.body = url, path, body
        self.lines: list[tuple[float, str]] = []
        self.started = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with httpx.Client(base_url=self.url, timeout=60) as client, \
                    client.stream("POST", self.path, json=self.body) as response:
                assert response.status_code == 200, response.read()
                for line in response.iter_lines():
                    if line.strip():
                        self.lines.append((time.monotonic(), line))
                        self.started.set()
        except BaseException as exc:  # reported by the test, not lost in the thread
            self.error = exc
            self.started.set()

    def payloads_after(self, when: float) -> list[str]:
        return [line for t, line in self.lines if t > when]


def sse_events(lines: list[str]) -> list[tuple[str | None, str]]:
    """(event name, data) pairs of an SSE stream's lines."""
    out: list[tuple[str | None, str]] = []
    event: str | None = None
    for line in lines:
        if line.startswith("event: "):
            event = line[len("event: "):]
        elif line.startswith("data: "):
            out.append((event, line[len("data: "):]))
            event = None
    return out


def test_sigterm_drains_streams_with_final_messages(pulled_models: dict[str, Path], homeai_cache_dir: Path,
                                                    tmp_path: Path) -> None:
    server = ServerProcess(tmp_path, homeai_cache_dir, env={"HOMEAI_DRAIN_TIMEOUT_S": str(DRAIN_S)})
    server.start()
    try:
        chat = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": PROMPT}]}
        sampled = [("/v1/responses", {"model": "smollm2-135m-instruct", "input": PROMPT, "stream": True,
                                      "max_output_tokens": 1000, "temperature": HOT}),
                   ("/api/chat", {**chat, "stream": True, "options": {"num_predict": 1000, "temperature": HOT}})]
        # A sampled stream may also sample its end during the drain (a natural end, not a cut): two of each.
        readers = [StreamReader(server.url, "/v1/chat/completions", {**chat, "stream": True, "max_tokens": 1000,
                                                                     "ignore_eos": True}),
                   *(StreamReader(server.url, path, body) for path, body in sampled for _ in range(SAMPLED_EACH))]
        for reader in readers:
            reader.start()
        for reader in readers:
            assert reader.started.wait(120), f"{reader.path} sent nothing"
            assert reader.error is None, f"{reader.path}: {reader.error!r}"
        num_started = len(readers)
        for i in range(len(readers)):  # a sampled stream (no ignore_eos there) may end early: ask again
            for _ in range(MAX_RESTARTS):
                if readers[i].is_alive():
                    break
                readers[i] = StreamReader(server.url, readers[i].path, readers[i].body)
                readers[i].start()
                num_started += 1
                assert readers[i].started.wait(120), f"{readers[i].path} sent nothing"
            assert readers[i].is_alive(), f"{readers[i].path} ended before the signal {MAX_RESTARTS} times"
        assert server.proc is not None
        signalled = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        for reader in readers:
            reader.join(DRAIN_S + 30)
            assert not reader.is_alive(), f"{reader.path} still streaming long after the drain"
            assert reader.error is None, f"{reader.path} was cut: {reader.error!r}"
        exit_code = server.proc.wait(60)
    finally:
        log = server.log()
        server.stop()
    assert exit_code in (0, -signal.SIGTERM, 128 + signal.SIGTERM), log
    assert "Traceback" not in log, log

    openai = readers[0]
    drained: dict[str, int] = {}
    for reader in readers:  # each ended with its API's final message: drained, or (sampled) its own end
        ending = drain_ending(reader) if reader is openai else (drain_ending(reader) or natural_ending(reader))
        assert ending, (reader.path, reader.lines[-3:])
        if ending == "drained":  # it went on after the signal for about the drain time
            assert len(reader.payloads_after(signalled)) > 1, reader.path
            assert reader.lines[-1][0] - signalled > DRAIN_S - 1.0, reader.path
            drained[reader.path] = drained.get(reader.path, 0) + 1
    assert set(drained) == {r.path for r in readers}, drained  # every API showed its drain message

    with sqlite3.connect(tmp_path / "homeai.db") as db:  # the request log was flushed before exit
        num_rows = db.execute("SELECT count(*) FROM request_log").fetchone()[0]
    assert num_rows == num_started, log  # every stream, the ones asked again included
