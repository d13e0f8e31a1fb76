"""`homeai bench serve`: the acceptance bench, over HTTP, against the server a user runs.

It starts `homeai serve` as a user starts it (its defaults, a fresh temporary data directory, a free
loopback port, this Python), waits for /readyz and for the compiled decode buckets /v1/stats reports,
then measures only what a client sees. With ``--url`` it measures any running OpenAI-compatible server
(llama.cpp's llama-server, Ollama, vLLM) the same way, so the figures compare.

Every request is a streamed chat completion (``stream_options.include_usage``, ``temperature`` 0,
``ignore_eos`` so that each output runs to ``max_tokens``), its class in ``X-HomeAI-Class`` and its user
in ``X-HomeAI-User`` and ``user`` (other servers ignore both). Per request the client records the send
time and the arrival of every content chunk; one chunk counts as one token (our server and llama-server
stream per token; ``chunk_token_ratio`` in the report checks it against the usage counts).

Phases, in this order (``--phases`` picks some):

1. single     sequential requests of 128 tokens: ``single_decode_tok_s``, the p50 of
              (output tokens - 1) / (last token - first token)
2. idle       sequential requests of 2 tokens after a 46-token prompt: ``idle_ttft_p50_ms`` with every
              prompt new (computed in full), then ``idle_warm_ttft_p50_ms`` for a voice assistant's turns:
              the same system message each time, the user's last few words new (what a prefix cache
              keeps: ours and llama-server's by token), then ``idle_repeat_ttft_p50_ms`` with that
              conversation's first turn sent again each time (a prompt cached whole: only its last token
              is computed, as llama-server computes it)
3. streams    1, 4, 8, 16 clients each sending 128-token requests back to back for a fixed time:
              ``streams_N_tok_s``, the tokens that arrived inside the time ÷ the time
4. household  voice every 2 s (40-token prompt, 32 tokens), chat every 5 s (100-token prompt, 128 tokens)
              and 12 summaries (1,500-token document, 256 tokens, class summarize) kept in flight; then
              the same voice and chat schedule alone, the reference for the ratios

Prompts are sized for SmolLM2's chat template (a system message, the user's text): the text is single-
token words, so the count is exact there and close elsewhere; ``prompt_tokens`` in the report gives what
the server counted. Each prompt opens with a request number of its own, so a prefix cache finds at most
the few tokens before it (ours caches whole 16-token blocks: none): the figures are for prompts computed
in full. Requests still running when a timed phase ends are cancelled and counted as ``cut_at_window``
(their first token and gaps, where they came, still count in the latency figures; one that had waited
more than ``STALL_S`` for its next token is ``voice_stalled`` / ``chat_stalled`` and adds that wait); a request
that ends with neither its ``[DONE]`` nor an error is ``lost``. Figures are measured, never judged here.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

PHASES = ("single", "idle", "streams", "household")
DEFAULT_MODEL = "smollm2-135m-instruct"
CLASS_HEADER, USER_HEADER = "X-HomeAI-Class", "X-HomeAI-User"
USERS = {"voice": "kitchen", "chat": "phone", "summarize": "indexer"}  # indexer: the policy's background user
STANDARD_LEVELS = (1, 4, 8, 16)

SHORT_PROMPT_TOKENS = 32  # single and streams
IDLE_PROMPT_TOKENS, IDLE_MAX_TOKENS = 46, 2  # as `homeai bench speed` measures idle TTFT
VOICE_EVERY_S, VOICE_OFFSET_S, VOICE_PROMPT_TOKENS, VOICE_MAX_TOKENS = 2.0, 0.5, 40, 32
CHAT_EVERY_S, CHAT_OFFSET_S, CHAT_PROMPT_TOKENS, CHAT_MAX_TOKENS = 5.0, 1.0, 100, 128
SUMMARY_PROMPT_TOKENS, SUMMARY_MAX_TOKENS = 1500, 256
NTH_TOKEN = 12  # a voice reply's first words: what a speech synthesizer needs to start talking
STALL_S = 1.0  # a household request cut at the window's end after waiting this long for a token: stalled

COMPILE_TIMEOUT_S = 900.0  # every decode bucket, compiled in the background at start
READ_TIMEOUT_S = 600.0  # between two chunks: a queued background request may wait long for its first
ERROR_PAUSE_S = 0.2  # a client whose request failed waits this long, so a dead server is no busy loop
RSS_EVERY_S = 0.5
IDLE_GAP_S = 0.1  # between idle requests: the previous one's tail is over
VOICE_TURN_NEW_WORDS = 4  # words of a voice turn that differ from the turn before (the user's new command)
SERVER_ENV_SCRUBBED = ("HOMEAI_DATA_DIR", "HOMEAI_DATABASE_URL", "HOMEAI_HOST", "HOMEAI_PORT",
                       "HOMEAI_TEST_PAUSE_AFTER_FILES", "HOMEAI_TEST_PAUSE_MARKER")

# Request outcomes besides HTTP status codes ("429", "503", ...), which are errors too.
PENDING, OK, CUT, LOST = "pending", "ok", "cut", "lost"
SSE_ERROR, BAD_EVENT, TRANSPORT = "sse_error", "bad_event", "transport"
NOT_ERRORS = frozenset({PENDING, OK, CUT, LOST})

Log = Callable[[str], None]


# ---- options -------------------------------------------------------------------------------------------


@dataclass(slots=True)
class BenchOptions:
    """How much of each phase to run (``quick``: seconds per phase, a smoke test, not a measurement)."""

    phases: tuple[str, ...] = PHASES
    model: str | None = None  # None: the model of the server's voice class, else DEFAULT_MODEL
    output_tokens: int = 128  # single and streams
    single_requests: int = 20
    idle_requests: int = 20
    stream_levels: tuple[int, ...] = STANDARD_LEVELS
    streams_s: float = 20.0  # per level
    household_s: float = 60.0  # per run (with background, then the reference)
    background_in_flight: int = 12

    @classmethod
    def quick(cls) -> BenchOptions:
        return cls(output_tokens=32, single_requests=3, idle_requests=3, streams_s=3.0, household_s=6.0)


# ---- one request -----------------------------------------------------------------------------------------


@dataclass(slots=True)
class RequestRecord:
    """One streamed request as the client saw it; times are ``time.perf_counter()`` seconds."""

    cls: str
    prompt_target: int  # the prompt length asked for (tokens)
    max_tokens: int
    sent_s: float = 0.0
    chunk_s: list[float] = field(default_factory=list)  # arrival of each non-empty content chunk
    status: str = PENDING
    prompt_tokens: int | None = None  # from the usage chunk
    output_tokens: int | None = None
    detail: str = ""  # an error's message, for the report's examples

    @property
    def ok(self) -> bool:
        return self.status == OK

    @property
    def is_error(self) -> bool:
        return self.status not in NOT_ERRORS

    @property
    def tokens(self) -> int:
        """Output tokens: the server's count where it sent one, else one per chunk."""
        return self.output_tokens if self.output_tokens is not None else len(self.chunk_s)

    @property
    def ttft_ms(self) -> float | None:
        return (self.chunk_s[0] - self.sent_s) * 1e3 if self.chunk_s else None

    @property
    def itl_ms(self) -> list[float]:
        return [(b - a) * 1e3 for a, b in zip(self.chunk_s, self.chunk_s[1:], strict=False)]

    def token_ms(self, n: int) -> float | None:
        """Send to the ``n``-th token (1-based), or None when fewer arrived."""
        return (self.chunk_s[n - 1] - self.sent_s) * 1e3 if len(self.chunk_s) >= n else None

    @property
    def decode_tok_s(self) -> float | None:
        """Decode speed once the first token is out: (tokens - 1) / (last - first)."""
        if len(self.chunk_s) < 2 or self.chunk_s[-1] <= self.chunk_s[0]:
            return None
        return (self.tokens - 1) / (self.chunk_s[-1] - self.chunk_s[0])

    def chunks_between(self, start_s: float, end_s: float) -> int:
        return sum(start_s <= t <= end_s for t in self.chunk_s)


# ---- figures (pure) ----------------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float | None:
    """numpy's percentile (linear), rounded; None for no values rather than a misleading 0."""
    return round(float(np.percentile(values, q)), 2) if values else None


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return round(numerator / denominator, 3)


def present(values: list[float | None]) -> list[float]:
    return [v for v in values if v is not None]


def error_counts(records: list[RequestRecord]) -> dict[str, int]:
    """Errors by status (an HTTP code, ``sse_error``, ``transport``...) and their ``total``."""
    counts = Counter(r.status for r in records if r.is_error)
    return {**dict(sorted(counts.items())), "total": sum(counts.values())}


def error_examples(records: list[RequestRecord], limit: int = 3) -> list[str]:
    return [f"{r.cls} {r.status}: {r.detail}"[:300] for r in records if r.is_error][:limit]


def lost_count(records: list[RequestRecord]) -> int:
    return sum(r.status in (PENDING, LOST) for r in records)


def short_count(records: list[RequestRecord]) -> int:
    """Finished requests whose server counted fewer output tokens than forced (every request sets
    ``ignore_eos``): a server that ignores it (Ollama does) ends answers early, and a rate over shorter
    answers is not the same figure. Ours never does: its failures end with an error event."""
    return sum(r.ok and r.output_tokens is not None and r.output_tokens < r.max_tokens for r in records)


def single_figures(records: list[RequestRecord]) -> dict[str, Any]:
    return {"single_decode_tok_s": percentile(present([r.decode_tok_s for r in records if r.ok]), 50)}


def idle_figures(records: list[RequestRecord], key: str = "idle") -> dict[str, Any]:
    ttft = present([r.ttft_ms for r in records if r.ok])
    return {f"{key}_ttft_p50_ms": percentile(ttft, 50), f"{key}_ttft_p99_ms": percentile(ttft, 99)}


def window_tok_s(records: list[RequestRecord], start_s: float, window_s: float) -> float:
    """Tokens that arrived inside the window ÷ its length (requests cut at its end count up to there)."""
    return round(sum(r.chunks_between(start_s, start_s + window_s) for r in records) / window_s, 2)


def class_latency(records: list[RequestRecord], cls: str, end_s: float | None = None) -> dict[str, float | None]:
    """Latency percentiles of one class: over finished requests and those cut at the window's end once
    past the point measured (a slow first token is then still seen); ITL pooled over all their gaps.
    A request cut at ``end_s`` while it had waited ``STALL_S`` or more for the point measured (its first
    token, its next one, its 12th) adds that wait, a lower bound, and counts as ``stalled``: it left every
    figure before, so a stream that hung in the loaded window made its ratios look better."""
    seen = [r for r in records if r.cls == cls and r.status in (OK, CUT)]
    ttft = present([r.ttft_ms for r in seen])
    gaps = [gap for r in seen for gap in r.itl_ms]
    nth = present([r.token_ms(NTH_TOKEN) for r in seen])
    stalled = 0
    end = end_s if end_s is not None else -math.inf  # no end given: no request counts as stalled
    for r in (r for r in seen if r.status == CUT):
        age_ms = (end - r.sent_s) * 1e3
        pending_ms = (end - (r.chunk_s[-1] if r.chunk_s else r.sent_s)) * 1e3
        late = pending_ms > STALL_S * 1e3
        stalled += int(late)
        if late and not r.chunk_s:
            ttft.append(age_ms)
        elif late:
            gaps.append(pending_ms)
        if late and len(r.chunk_s) < NTH_TOKEN:
            nth.append(age_ms)
    return {"ttft_p50_ms": percentile(ttft, 50), "ttft_p99_ms": percentile(ttft, 99),
            "itl_p99_ms": percentile(gaps, 99), "nth_token_p99_ms": percentile(nth, 99),
            "finished": sum(r.ok for r in seen), "stalled": stalled}


@dataclass(slots=True)
class HouseholdRun:
    """One window of the household schedule: every request sent in it, and where it started."""

    records: list[RequestRecord]
    start_s: float
    window_s: float


def household_side(run: HouseholdRun) -> dict[str, Any]:
    end_s = run.start_s + run.window_s
    voice, chat = class_latency(run.records, "voice", end_s), class_latency(run.records, "chat", end_s)
    return {"voice_ttft_p50_ms": voice["ttft_p50_ms"], "voice_ttft_p99_ms": voice["ttft_p99_ms"],
            "voice_itl_p99_ms": voice["itl_p99_ms"], f"voice_{NTH_TOKEN}th_token_p99_ms": voice["nth_token_p99_ms"],
            "chat_ttft_p99_ms": chat["ttft_p99_ms"], "chat_itl_p99_ms": chat["itl_p99_ms"],
            "voice_finished": voice["finished"], "chat_finished": chat["finished"],
            "voice_stalled": voice["stalled"], "chat_stalled": chat["stalled"],
            "lost": lost_count(run.records), "cut_at_window": sum(r.status == CUT for r in run.records),
            "errors": error_counts(run.records)["total"]}


def household_figures(loaded: HouseholdRun, reference: HouseholdRun) -> dict[str, Any]:
    """The loaded window's figures, its ratios to the reference (loaded ÷ reference) and the reference's."""
    out, ref = household_side(loaded), household_side(reference)
    nth = f"voice_{NTH_TOKEN}th_token_p99_ms"
    background = [r for r in loaded.records if r.cls == "summarize"]
    out.update(voice_ttft_p99_ratio=ratio(out["voice_ttft_p99_ms"], ref["voice_ttft_p99_ms"]),
               **{f"voice_{NTH_TOKEN}th_token_p99_ratio": ratio(out[nth], ref[nth])},
               background_tok_s=window_tok_s(background, loaded.start_s, loaded.window_s),
               summaries_finished=sum(r.ok for r in background), window_s=loaded.window_s, reference=ref)
    return out


def prompt_tokens_seen(records: list[RequestRecord]) -> dict[str, int]:
    """Prompt length asked for -> the median the server reported: how close the sizing came."""
    seen: dict[int, list[int]] = {}
    for r in records:
        if r.prompt_tokens is not None:
            seen.setdefault(r.prompt_target, []).append(r.prompt_tokens)
    return {str(k): int(np.median(v)) for k, v in sorted(seen.items())}


def chunk_token_ratio(records: list[RequestRecord]) -> float | None:
    """Content chunks per output token over finished requests with usage: 1.0 when streamed per token."""
    done = [r for r in records if r.ok and r.output_tokens]
    return ratio(sum(len(r.chunk_s) for r in done), sum(r.output_tokens or 0 for r in done))


# ---- prompts -----------------------------------------------------------------------------------------------

# Each is one token after a space in SmolLM2's tokenizer (and in most BPE vocabularies).
WORDS = ("the house kitchen light door garden window table morning evening family dinner water music school "
         "weather room floor garage winter summer coffee bread dog cat car street city park book phone clock "
         "paper plant tree river road chair shelf lamp bed").split()
INSTRUCTION = "Write about:"
# SmolLM2's template around a system message "Request NNNNNN. You are a helpful assistant." and INSTRUCTION.
TEMPLATE_TOKENS = 32


class Prompts:
    """Chat messages of a given token length, each opening with a request number of its own."""

    def __init__(self, seed: int | None = None) -> None:
        self._next = random.Random(seed).randrange(1_000_000)  # another run's cached prompts do not match
        self._session = self._next  # the fixed system message of this run's voice turns

    def messages(self, num_tokens: int) -> list[dict[str, str]]:
        self._next = (self._next + 1) % 1_000_000
        words = " ".join(WORDS[i % len(WORDS)] for i in range(max(0, num_tokens - TEMPLATE_TOKENS)))
        return [{"role": "system", "content": f"Request {self._next:06d}. You are a helpful assistant."},
                {"role": "user", "content": f"{INSTRUCTION} {words}".strip()}]

    def voice_turn(self, num_tokens: int, turn: int) -> list[dict[str, str]]:
        """A turn of one voice conversation: the same system message and opening every time, only the last
        ``VOICE_TURN_NEW_WORDS`` words of the user's text differ (same length in tokens)."""
        n = max(0, num_tokens - TEMPLATE_TOKENS)
        fixed = [WORDS[i % len(WORDS)] for i in range(max(0, n - VOICE_TURN_NEW_WORDS))]
        new = [WORDS[(turn * 7 + i) % len(WORDS)] for i in range(n - len(fixed))]
        return [{"role": "system", "content": f"Request {self._session:06d}. You are a helpful assistant."},
                {"role": "user", "content": " ".join([INSTRUCTION, *fixed, *new])}]


# ---- the client --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Target:
    """The server under test as the phases use it."""

    client: httpx.AsyncClient
    model: str
    prompts: Prompts

    async def request(self, cls: str, prompt_tokens: int, max_tokens: int,
                      into: list[RequestRecord] | None = None, turn: int | None = None) -> RequestRecord:
        """Send one streamed request and record it (added to ``into`` before it is sent, so that a
        request cancelled mid-way is still counted). ``turn``: a voice conversation's turn, not a new prompt."""
        rec = RequestRecord(cls, prompt_tokens, max_tokens)
        if into is not None:
            into.append(rec)
        prompts = self.prompts
        messages = prompts.messages(prompt_tokens) if turn is None else prompts.voice_turn(prompt_tokens, turn)
        await stream_request(self.client, self.model, rec, messages)
        if rec.is_error:
            await asyncio.sleep(ERROR_PAUSE_S)
        return rec


def request_body(model: str, rec: RequestRecord, messages: list[dict[str, str]]) -> dict[str, Any]:
    return {"model": model, "messages": messages, "stream": True, "stream_options": {"include_usage": True},
            "temperature": 0, "max_tokens": rec.max_tokens, "ignore_eos": True, "user": USERS[rec.cls]}


async def stream_request(client: httpx.AsyncClient, model: str, rec: RequestRecord,
                         messages: list[dict[str, str]]) -> None:
    """POST /v1/chat/completions and fill ``rec``; never raises but for cancellation (status ``cut``)."""
    headers = {CLASS_HEADER: rec.cls, USER_HEADER: USERS[rec.cls]}
    rec.sent_s = time.perf_counter()
    try:
        async with client.stream("POST", "/v1/chat/completions", json=request_body(model, rec, messages),
                                 headers=headers) as response:
            if response.status_code != 200:
                rec.detail = (await response.aread()).decode(errors="replace")
                rec.status = str(response.status_code)
                return
            rec.status = await read_events(response, rec)
    except asyncio.CancelledError:
        if rec.status == PENDING:  # not one that ended just before
            rec.status = CUT
        raise
    except httpx.HTTPError as exc:
        rec.status, rec.detail = TRANSPORT, f"{type(exc).__name__}: {exc}"


async def read_events(response: httpx.Response, rec: RequestRecord) -> str:
    """Read the SSE stream into ``rec``; returns the outcome: ok at ``[DONE]``, lost when it just ends."""
    async for line in response.aiter_lines():
        now = time.perf_counter()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return OK
        try:
            event = json.loads(data)
        except ValueError:
            rec.detail = data[:200]
            return BAD_EVENT
        if not isinstance(event, dict):
            continue
        if event.get("error"):
            rec.detail = json.dumps(event["error"])
            return SSE_ERROR
        if usage := event.get("usage"):
            rec.prompt_tokens, rec.output_tokens = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if any((choice.get("delta") or {}).get("content") for choice in event.get("choices") or []):
            rec.chunk_s.append(now)
    return LOST


async def cancel_all(tasks: list[asyncio.Task[Any]]) -> None:
    """Cancel what still runs and wait until every task has recorded how it ended."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def sleep_until(t: float) -> None:
    await asyncio.sleep(max(0.0, t - time.perf_counter()))


# ---- phases ------------------------------------------------------------------------------------------------

Phase = Callable[[Target, BenchOptions, Log], Awaitable[tuple[dict[str, Any], list[RequestRecord]]]]


async def single_phase(target: Target, opts: BenchOptions, log: Log) -> tuple[dict[str, Any], list[RequestRecord]]:
    log(f"single: {opts.single_requests} sequential requests of {opts.output_tokens} tokens")
    records = [await target.request("chat", SHORT_PROMPT_TOKENS, opts.output_tokens)
               for _ in range(opts.single_requests)]
    return single_figures(records), records


async def idle_phase(target: Target, opts: BenchOptions, log: Log) -> tuple[dict[str, Any], list[RequestRecord]]:
    async def one_by_one(turns: list[int | None]) -> list[RequestRecord]:
        """Sequential voice requests, each IDLE_GAP_S after the one before (``turn`` None: a new prompt)."""
        records = []
        for turn in turns:
            await asyncio.sleep(IDLE_GAP_S)
            records.append(await target.request("voice", IDLE_PROMPT_TOKENS, IDLE_MAX_TOKENS, turn=turn))
        return records

    n = opts.idle_requests
    log(f"idle: {n} sequential voice requests, {IDLE_PROMPT_TOKENS}-token prompt")
    cold = await one_by_one([None] * n)
    log(f"idle: {n} turns of one voice conversation (the last {VOICE_TURN_NEW_WORDS} words new)")
    warm = await one_by_one(list(range(n + 1)))  # its first turn (0) is not counted
    log(f"idle: its first turn, {n} times again")
    repeat = await one_by_one([0] * n)
    return ({**idle_figures(cold), **idle_figures(warm[1:], "idle_warm"), **idle_figures(repeat, "idle_repeat")},
            cold + warm + repeat)


async def streams_level(target: Target, streams: int, window_s: float, max_tokens: int,
                        ) -> tuple[float, list[RequestRecord]]:
    """``streams`` clients sending back to back for ``window_s``: tokens/s over the window."""
    records: list[RequestRecord] = []

    async def client() -> None:
        while True:
            await target.request("chat", SHORT_PROMPT_TOKENS, max_tokens, into=records)

    start = time.perf_counter()
    tasks = [asyncio.create_task(client()) for _ in range(streams)]
    await sleep_until(start + window_s)
    await cancel_all(tasks)
    return window_tok_s(records, start, window_s), records


async def streams_phase(target: Target, opts: BenchOptions, log: Log) -> tuple[dict[str, Any], list[RequestRecord]]:
    figures: dict[str, Any] = {}
    records: list[RequestRecord] = []
    for n in opts.stream_levels:
        log(f"streams: {n} for {opts.streams_s:g} s")
        figures[f"streams_{n}_tok_s"], level = await streams_level(target, n, opts.streams_s, opts.output_tokens)
        records += level
    return figures, records


def household_schedule(window_s: float) -> list[tuple[float, str, int, int]]:
    """(offset s, class, prompt tokens, max tokens) of every voice and chat request in a window."""
    voice = [(t, "voice", VOICE_PROMPT_TOKENS, VOICE_MAX_TOKENS)
             for t in np.arange(VOICE_OFFSET_S, window_s, VOICE_EVERY_S)]
    chat = [(t, "chat", CHAT_PROMPT_TOKENS, CHAT_MAX_TOKENS) for t in np.arange(CHAT_OFFSET_S, window_s, CHAT_EVERY_S)]
    return sorted((float(t), cls, p, m) for t, cls, p, m in voice + chat)


async def household_run(target: Target, window_s: float, background: int) -> HouseholdRun:
    """The voice and chat schedule (open loop: on time whatever is still running) and ``background``
    summary clients, each sending a new one when its last ends; everything still running at the end
    is cancelled."""
    records: list[RequestRecord] = []

    async def summaries() -> None:
        while True:
            await target.request("summarize", SUMMARY_PROMPT_TOKENS, SUMMARY_MAX_TOKENS, into=records)

    start = time.perf_counter()
    tasks: list[asyncio.Task[Any]] = [asyncio.create_task(summaries()) for _ in range(background)]
    for offset, cls, prompt_tokens, max_tokens in household_schedule(window_s):
        await sleep_until(start + offset)
        tasks.append(asyncio.create_task(target.request(cls, prompt_tokens, max_tokens, into=records)))
    await sleep_until(start + window_s)
    await cancel_all(tasks)
    return HouseholdRun(records, start, window_s)


async def household_phase(target: Target, opts: BenchOptions, log: Log,
                          ) -> tuple[dict[str, Any], list[RequestRecord]]:
    log(f"household: {opts.household_s:g} s with {opts.background_in_flight} summaries in flight")
    loaded = await household_run(target, opts.household_s, opts.background_in_flight)
    log(f"household: {opts.household_s:g} s reference, no background")
    reference = await household_run(target, opts.household_s, 0)
    return {"household": household_figures(loaded, reference)}, loaded.records + reference.records


PHASE_RUNNERS: dict[str, Phase] = {"single": single_phase, "idle": idle_phase, "streams": streams_phase,
                                   "household": household_phase}


# ---- the server ------------------------------------------------------------------------------------------


@contextlib.contextmanager
def launched_server(log: Log, serve_args: Sequence[str] = ()) -> Iterator[tuple[str, int]]:
    """`homeai serve` with its defaults (plus ``serve_args``: ``--policy``, ``--kv-cache-mb``) on a free
    loopback port and a temporary data directory; yields (url, pid) once /readyz says ready; SIGTERM on
    the way out (SIGKILL if it hangs)."""
    from homeai.bench.soak_server import _free_port, _wait_ready, stop_server

    with tempfile.TemporaryDirectory(prefix="homeai-bench-serve-") as tmp:
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        cmd = [sys.executable, "-m", "homeai.cli.main", "serve", "--host", "127.0.0.1", "--port", str(port),
               "--data-dir", str(Path(tmp) / "data"), *serve_args]
        env = {k: v for k, v in os.environ.items() if k not in SERVER_ENV_SCRUBBED}
        log_path = Path(tmp) / "server.log"
        log(f"serve: starting {' '.join(cmd[2:])}")
        with log_path.open("ab") as server_log:
            proc = subprocess.Popen(cmd, env=env, stdout=server_log, stderr=subprocess.STDOUT)
        try:
            _wait_ready(proc, url, log_path)
            yield url, proc.pid
        finally:
            stop_server(proc)


async def get_json(client: httpx.AsyncClient, path: str) -> Any:
    """The JSON body of a GET, or None where the server has no such endpoint (another server)."""
    try:
        response = await client.get(path, timeout=10)
        return response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


def compile_states(stats: Any) -> dict[str, dict[str, Any]]:
    """Model -> its compiled decode state ({"buckets", "ready", "failed"}) where /v1/stats reports one."""
    device = stats.get("device") if isinstance(stats, dict) else None
    return {model: d["compiled_decode"] for model, d in (device or {}).items()
            if isinstance(d, dict) and d.get("compiled_decode")}


def compiling(states: dict[str, dict[str, Any]]) -> list[str]:
    return [m for m, s in states.items() if s.get("failed") is None and set(s["ready"]) != set(s["buckets"])]


async def wait_compiled(client: httpx.AsyncClient, log: Log, timeout_s: float = COMPILE_TIMEOUT_S) -> bool | None:
    """Wait until every compiled decode bucket is ready (or failed: steps stay eager, as served).
    None where the server reports no compilation; False when the wait timed out."""
    deadline, said = time.monotonic() + timeout_s, 0.0
    while True:
        states = compile_states(await get_json(client, "/v1/stats"))
        if not states:
            return None
        if not (pending := compiling(states)):
            return True
        if time.monotonic() > deadline:
            log(f"serve: decode buckets of {pending} still compiling after {timeout_s:.0f} s; measuring anyway")
            return False
        if time.monotonic() - said > 15:
            said = time.monotonic()
            log(f"serve: waiting for compiled decode buckets: {states}")
        await asyncio.sleep(1.0)


async def server_info(client: httpx.AsyncClient) -> dict[str, Any] | None:
    """What the server says it runs: /api/ps (Ollama), /v1/models, the device part of /v1/stats."""
    info: dict[str, Any] = {}
    if isinstance(ps := await get_json(client, "/api/ps"), dict):
        info["ps"] = [{k: m.get(k) for k in ("name", "details", "size_vram")} for m in ps.get("models") or []]
    if isinstance(models := await get_json(client, "/v1/models"), dict):
        info["models"] = [m.get("id") for m in models.get("data") or []]
    stats = await get_json(client, "/v1/stats")
    if isinstance(stats, dict):
        info["device"] = stats.get("device")
        info["class_models"] = {name: c.get("model") for name, c in (stats.get("classes") or {}).items()
                                if c.get("model")}
    return info or None


class RssSampler:
    """The launched server's resident memory (VmRSS) now and then; the maximum seen."""

    def __init__(self, pid: int) -> None:
        from homeai.bench.soak import rss_mb

        self._read, self.pid = rss_mb, pid
        self.max: float | None = None
        self._task: asyncio.Task[None] | None = None
        self.at_ready = self.sample()

    def sample(self) -> float | None:
        try:
            value = round(self._read(self.pid), 1)
        except (OSError, RuntimeError):  # the process is gone
            return None
        self.max = value if self.max is None else max(self.max, value)
        return value

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(RSS_EVERY_S)
            self.sample()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> dict[str, float | None]:
        if self._task is not None:
            await cancel_all([self._task])
        self.sample()
        return {"at_ready": self.at_ready, "max": self.max}


# ---- the run -----------------------------------------------------------------------------------------------


def load_avg_1m() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


async def run_bench(url: str, pid: int | None, opts: BenchOptions, log: Log, key: str | None = None,
                    during_household: Callable[[], Coroutine[Any, Any, None]] | None = None) -> dict[str, Any]:
    """Every chosen phase against ``url``; ``pid``: the server's process, for its memory (None: not ours);
    ``during_household`` runs beside the household phase (a cluster's node that stops)."""
    rss = RssSampler(pid) if pid is not None else None
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    timeout = httpx.Timeout(READ_TIMEOUT_S, connect=10.0)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=timeout, limits=limits) as client:
        compiled = await wait_compiled(client, log)
        info = await server_info(client)
        model = opts.model or ((info or {}).get("class_models") or {}).get("voice") or DEFAULT_MODEL
        target = Target(client, model, Prompts())
        load_start = load_avg_1m()
        if rss is not None:
            rss.start()
        log(f"bench: model {model}, one warm-up request")
        records = [await target.request("chat", SHORT_PROMPT_TOKENS, 8)]
        figures: dict[str, Any] = {}
        for phase in opts.phases:
            side = asyncio.create_task(during_household()) if phase == "household" and during_household else None
            phase_figures, phase_records = await PHASE_RUNNERS[phase](target, opts, log)
            if side is not None:
                await side
            figures.update(phase_figures)
            records += phase_records
        memory = await rss.stop() if rss is not None else None
    return assemble_report(url, model, opts, figures, records, memory, info, compiled,
                           {"start": load_start, "end": load_avg_1m()})


def assemble_report(url: str, model: str, opts: BenchOptions, figures: dict[str, Any], records: list[RequestRecord],
                    memory: dict[str, float | None] | None, info: dict[str, Any] | None, compiled: bool | None,
                    load: dict[str, float | None]) -> dict[str, Any]:
    """One JSON object: the headline figures first (null for a phase not run), then what they ran on."""
    levels = dict.fromkeys(f"streams_{n}_tok_s" for n in sorted({*STANDARD_LEVELS, *opts.stream_levels}))
    return {"single_decode_tok_s": None, "idle_ttft_p50_ms": None, "idle_ttft_p99_ms": None,
            "idle_warm_ttft_p50_ms": None, "idle_warm_ttft_p99_ms": None,
            "idle_repeat_ttft_p50_ms": None, "idle_repeat_ttft_p99_ms": None, **levels,
            "household": None, **figures,
            "errors": error_counts(records), "error_examples": error_examples(records),
            "lost": lost_count(records), "short_outputs": short_count(records), "rss_mb": memory,
            "load_avg_1m": load,
            "prompt_tokens": prompt_tokens_seen(records), "chunk_token_ratio": chunk_token_ratio(records),
            "url": url, "model": model, "compiled_decode_ready": compiled, "server": info,
            "options": {**asdict(opts), "phases": list(opts.phases), "stream_levels": list(opts.stream_levels)}}


def format_table(report: dict[str, Any]) -> str:
    """The report for people: one figure a line, the household's loaded and reference side by side."""
    lines = [f"{'model':<28} {report['model']} at {report['url']}"]
    scalar = ["single_decode_tok_s", "idle_ttft_p50_ms", "idle_warm_ttft_p50_ms", "idle_repeat_ttft_p50_ms",
              *(k for k in report if k.startswith("streams_"))]
    lines += [f"{key:<28} {_fmt(report.get(key))}" for key in scalar]
    if household := report.get("household"):
        ref = household["reference"]
        title = f"household ({household['window_s']:g} s)"
        lines.append(f"{title:<28} {'loaded':>10} {'reference':>10} {'ratio':>7}")
        for key, value in household.items():
            if key in ("reference", "window_s") or key.endswith("_ratio"):
                continue
            ratio_key = key.replace("_ms", "_ratio")
            lines.append(f"  {key:<26} {_fmt(value):>10} {_fmt(ref.get(key, '')):>10} "
                         f"{_fmt(household.get(ratio_key, '')) if ratio_key != key else '':>7}")
    errors = report["errors"]
    lines.append(f"{'errors':<28} {errors['total']}" + (f" {errors}" if errors["total"] else ""))
    lines.append(f"{'lost':<28} {report['lost']}")
    if rss := report.get("rss_mb"):
        lines.append(f"{'server rss_mb':<28} at ready {_fmt(rss['at_ready'])}, max {_fmt(rss['max'])}")
    load = report["load_avg_1m"]
    lines.append(f"{'load_avg_1m':<28} {_fmt(load['start'])} -> {_fmt(load['end'])}")
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if isinstance(value, float) else str(value)


# ---- command line ----------------------------------------------------------------------------------------


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help="measure this running OpenAI-compatible server instead of starting ours")
    p.add_argument("--key", default=os.environ.get("HOMEAI_API_KEY"),
                   help="API key for --url (default $HOMEAI_API_KEY)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--quick", action="store_true", help="seconds per phase: a smoke test, not a measurement")
    p.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated, of {','.join(PHASES)} (default all)")
    p.add_argument("--model", help=f"model name sent (default: the voice class's model, else {DEFAULT_MODEL})")
    p.add_argument("--tokens", type=int, help="output tokens of single and streams requests (default 128)")
    p.add_argument("--single-requests", type=int, help="requests of the single phase (default 20)")
    p.add_argument("--idle-requests", type=int, help="requests of the idle TTFT phase (default 20)")
    p.add_argument("--streams", help="concurrent streams, comma-separated (default 1,4,8,16)")
    p.add_argument("--streams-s", type=float, help="seconds per stream count (default 20)")
    p.add_argument("--household-s", type=float, help="seconds per household window, twice (default 60)")
    p.add_argument("--background", type=int, help="summaries kept in flight in the household (default 12)")
    p.add_argument("--policy", type=Path, help="the server's policy file (default: its own, policies/default.yaml)")
    p.add_argument("--kv-cache-mb", type=int, help="the server's KV cache size (default: its own, 256)")
    p.add_argument("--nodes", type=int, default=0,
                   help="serve as a cluster: `homeai serve --cluster` on loopback plus this many `homeai node join` "
                        "processes on this machine (default 0: one device)")
    p.add_argument("--stop-node-at", type=float, default=None, metavar="SECONDS",
                   help="with --nodes: stop one node this long into the loaded household run")


def options_from_args(args: argparse.Namespace) -> BenchOptions:
    """``--quick`` or the full defaults, then whatever was given explicitly; ValueError names a bad value."""
    opts = BenchOptions.quick() if args.quick else BenchOptions()
    phases = tuple(p.strip() for p in args.phases.split(",") if p.strip())
    if not phases or set(phases) - set(PHASES):
        raise ValueError(f"--phases wants some of {','.join(PHASES)}, got {args.phases!r}")
    opts.phases = tuple(p for p in PHASES if p in phases)  # always in the documented order
    if args.streams is not None:
        try:
            opts.stream_levels = tuple(sorted({int(s) for s in args.streams.split(",") if s.strip()}))
        except ValueError:
            opts.stream_levels = ()
        if not opts.stream_levels or min(opts.stream_levels) < 1:
            raise ValueError(f"--streams wants positive integers like 1,4,8,16, got {args.streams!r}")
    for name, attr in (("tokens", "output_tokens"), ("single_requests", "single_requests"),
                       ("idle_requests", "idle_requests"), ("streams_s", "streams_s"),
                       ("household_s", "household_s"), ("background", "background_in_flight"),
                       ("model", "model")):
        if (value := getattr(args, name)) is not None:
            setattr(opts, attr, value)
    return opts


def serve_arguments(args: argparse.Namespace) -> list[str]:
    """What ``--policy`` and ``--kv-cache-mb`` pass on to the `homeai serve` the bench starts."""
    out = []
    if args.policy is not None:
        out += ["--policy", str(args.policy.resolve())]
    if args.kv_cache_mb is not None:
        out += ["--kv-cache-mb", str(args.kv_cache_mb)]
    return out


def run_serve(args: argparse.Namespace) -> int:
    try:
        opts = options_from_args(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    def log(msg: str) -> None:  # progress on stderr: with --json, stdout stays one object
        print(msg, file=sys.stderr, flush=True)

    if args.url:
        report = asyncio.run(run_bench(args.url.rstrip("/"), None, opts, log, args.key))
    elif args.nodes > 0:
        report = run_cluster_bench(opts, log, args.nodes, args.stop_node_at)
    else:
        with launched_server(log, serve_arguments(args)) as (url, pid):
            report = asyncio.run(run_bench(url, pid, opts, log))
    print(json.dumps(report) if args.json else format_table(report))
    return 0


def run_cluster_bench(opts: BenchOptions, log: Log, num_nodes: int, stop_node_at_s: float | None) -> dict[str, Any]:
    """The bench against a front door and ``num_nodes`` nodes on this machine (serve_cluster.py); the
    report gains ``cluster``: the nodes at the end, and when one was stopped."""
    from homeai.bench.serve_cluster import launched_cluster

    with launched_cluster(log, num_nodes) as (url, pid, nodes):
        async def stop_one() -> None:
            if stop_node_at_s is not None:
                await asyncio.sleep(stop_node_at_s)
                log(f"cluster: stopping node1 {stop_node_at_s:g} s into the household")
                await asyncio.to_thread(nodes.stop_first)

        report = asyncio.run(run_bench(url, pid, opts, log, during_household=stop_one))
        report["cluster"] = nodes.summary()
        # the models run in the nodes' Ray workers, which the sampled process does not hold: not the server's
        report["front_door_rss_mb"], report["rss_mb"] = report["rss_mb"], None
    return report
