"""The engine: one thread owns the device and runs step after step while there is work.

asyncio code adds and aborts requests at any moment through an inbox; only the device thread touches
the scheduler: it applies the inbox at the start of each iteration (so an abort frees its KV blocks
within one step, and a full queue's 429 reaches the caller as the first thing its stream yields), then runs

    plan = scheduler.schedule(); output = runner.execute(plan); scheduler.update(plan, output)

and publishes the step's token deltas to the consumers' event loops.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import logging
import threading
import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from homeai.core.sequence import Sequence, SequenceStatus
from homeai.core.types import (
    Constraint,
    FinishReason,
    SamplingParams,
    StepOutput,
    StepPlan,
    TokenDelta,
    TokenLogprob,
)
from homeai.engine.detokenizer import IncrementalDetokenizer
from homeai.engine.errors import ModelUnloadedError, RequestError
from homeai.engine.health import EngineHealth
from homeai.engine.model_runner import ModelRunner
from homeai.engine.streams import StreamRegistry
from homeai.runtime.grammar import GrammarError
from homeai.runtime.weights_format import WeightsFormat
from homeai.scheduling.class_scheduler import ClassScheduler
from homeai.scheduling.interface import StepScheduler

log = logging.getLogger(__name__)


@dataclass(slots=True)
class EngineStats:
    num_steps: int = 0
    num_tokens_generated: int = 0
    num_prompt_tokens: int = 0
    num_preemptions: int = 0
    last_batch_tokens: int = 0
    last_batch_seqs: int = 0


class LLMEngine:
    """Async front of the device loop for one LLM."""

    def __init__(self, runner: ModelRunner, scheduler: StepScheduler, tokenizer: Any,
                 eos_token_ids: list[int], max_model_len: int) -> None:
        self.runner = runner
        self.scheduler = scheduler
        self.tokenizer = tokenizer
        self.eos_token_ids = frozenset(eos_token_ids)
        # A stop string that is a special token ("<|im_start|>", as Ollama clients send) stops on that token:
        # the detokenizer leaves special tokens out of the text, so it never matched, and the model wrote
        # a made-up next turn.
        added = getattr(tokenizer, "get_added_vocab", None)
        self._special_ids: dict[str, int] = {t: i for t, i in (added() if added else {}).items()
                                             if tokenizer.decode([i], skip_special_tokens=True) == ""}
        self.max_model_len = max_model_len
        self.streams = StreamRegistry()
        self.stats = EngineStats()
        self._ids = itertools.count()
        self._inbox: list[tuple[str, Any]] = []
        self._inbox_lock = threading.Lock()
        self.name = ""  # the model's name where a pool serves it (what ModelUnloadedError names)
        self._left = False  # the model left the device loop: nothing drains the inbox any more
        self.wake = threading.Event()  # set when work arrives; the device loop waits on it
        self.health = EngineHealth()  # failures of this model's steps (/readyz, /metrics)
        self.weights = WeightsFormat("none", "not reported")  # what the builder loaded, and why

    @functools.cached_property
    def tokenizer_size(self) -> int:
        """Token ids below this are valid. Kept: ``len()`` of a fast tokenizer rebuilds the vocabulary with its
        added tokens, ~20 ms for SmolLM2's 49k, and admission asks on the event loop for every request."""
        return len(self.tokenizer)

    # ---- asyncio side ----------------------------------------------------------------------------
    def make_sequence(self, prompt_token_ids: list[int], params: SamplingParams, request_id: str | None = None,
                      class_name: str = "default", user: str = "default", priority_level: int | None = None,
                      timeout_us: int | None = None) -> Sequence:
        """Validate a request and build its sequence (raises RequestError with a clear message)."""
        n = len(prompt_token_ids)
        if n == 0:
            raise RequestError("prompt is empty")
        if n >= self.max_model_len:
            raise RequestError(f"prompt has {n} tokens; the context holds {self.max_model_len} "
                               f"(prompt + at least 1 output token)")
        if params.max_tokens < 1:
            raise RequestError("max_tokens must be at least 1")
        params = dataclasses.replace(params, max_tokens=min(params.max_tokens, self.max_model_len - n))
        stop_ids = [self._special_ids[s] for s in params.stop if s in self._special_ids]
        if stop_ids:
            params.stop_token_ids = [*params.stop_token_ids, *stop_ids]
        bm = self.scheduler.block_manager
        if bm.blocks_needed(n + params.max_tokens) > bm.num_blocks:
            raise RequestError(f"prompt + max_tokens ({n + params.max_tokens}) exceed the KV cache "
                               f"({bm.num_blocks * bm.block_size} tokens)")
        seq = Sequence(next(self._ids), request_id or uuid.uuid4().hex, list(prompt_token_ids), params,
                       eos_token_ids=self.eos_token_ids, class_name=class_name, user=user,
                       priority_level=priority_level, timeout_us=timeout_us)
        seq.sink = IncrementalDetokenizer(self.tokenizer, seq.prompt_token_ids, params.stop)
        return seq

    async def generate(self, prompt_token_ids: list[int], params: SamplingParams, request_id: str | None = None,
                       class_name: str = "default", user: str = "default", priority_level: int | None = None,
                       timeout_us: int | None = None) -> AsyncGenerator[TokenDelta, None]:
        """Stream deltas until the request finishes; leaving early (disconnect) aborts it. A request its
        queue refuses raises QueueFullError (HTTP 429) where the first delta is awaited."""
        seq = self.make_sequence(prompt_token_ids, params, request_id, class_name, user, priority_level,
                                 timeout_us)
        if params.constraint is not None:
            await self.compile_constraint(params.constraint)
        queue = self.streams.open(seq.request_id)
        try:
            self.submit(seq)
        except BaseException:
            self.streams.close(seq.request_id)
            raise
        finished = False
        try:
            while not finished:
                item = await queue.get()
                if isinstance(item, Exception):
                    finished = True  # never queued: nothing to abort
                    raise item
                finished = item.finished
                yield item
        finally:
            self.streams.close(seq.request_id)
            if not finished:
                self.abort(seq.request_id)

    async def compile_constraint(self, constraint: Constraint) -> int | None:
        """Compile (or find cached) a constraint's grammar on a worker thread, never the device thread.
        Returns the output tokens of the shortest output it allows, the end token included (None: unknown)."""
        grammars = self.runner.grammars
        if grammars is None:
            raise RequestError("this model serves no constrained output")
        try:
            return await asyncio.to_thread(grammars.min_output_tokens, constraint)
        except GrammarError as exc:
            raise RequestError(str(exc)) from exc

    def submit(self, seq: Sequence) -> None:
        """Post a built sequence; the device thread queues it (the only thread that touches the
        scheduler). If its queue refuses it, its stream gets the error. ModelUnloadedError at once if the
        model has left the device (its inbox would never be read again)."""
        with self._inbox_lock:
            if self._left:
                raise ModelUnloadedError(self.name, f"model {self.name!r} was unloaded before the request reached it")
            self._inbox.append(("add", seq))
        self.wake.set()

    def abort(self, request_id: str) -> None:
        self._post("abort", request_id)

    def fail_all_soon(self, message: str) -> None:
        """From asyncio: end every sequence with ``message`` as its error before the next step (a
        server draining at shutdown), so each stream closes with its API's error ending."""
        self._post("fail_all", message)

    def share_counters(self, counters: dict[str, dict[str, float]]) -> None:
        """A cluster's fairness counters (class -> user -> service on every replica), for the scheduler to
        take before the next step."""
        self._post("counters", counters)

    def _post(self, kind: str, item: Any) -> None:
        with self._inbox_lock:
            self._inbox.append((kind, item))
        self.wake.set()

    # ---- the device thread -----------------------------------------------------------------------
    def drain_inbox(self) -> None:
        """Apply adds and aborts posted from asyncio, in posting order (the device loop calls it before
        each iteration: the scheduler is only ever touched from that thread)."""
        with self._inbox_lock:
            items, self._inbox = self._inbox, []
        deltas = []
        try:
            for kind, item in items:  # each item alone: one that raises must not lose the others (adds
                try:  # whose callers would wait for ever)
                    if kind == "add":
                        try:
                            self.scheduler.add(item)
                        except Exception as exc:  # QueueFullError (429), an unknown class (400): the caller raises it
                            self.streams.fail(item.request_id, exc)
                    elif kind == "counters" and isinstance(self.scheduler, ClassScheduler):
                        self.scheduler.share_counters(item)
                    elif kind == "abort":
                        seq = self.scheduler.abort(item)
                        if seq is not None:
                            self.runner.release(seq.seq_id)
                            deltas.append(self._delta(seq))
                except Exception:  # noqa: BLE001 - logged; the loop counts failures of its own
                    log.exception("applying a posted %s failed", kind)
        finally:
            if deltas:
                self.streams.publish(deltas)
        for kind, item in items:
            if kind == "fail_all":
                self._fail_all(item)

    def step(self) -> list[TokenDelta]:
        """One iteration: plan, execute, apply, publish. Public so tests can drive it synchronously.

        A step that raises fails only itself: each of its sequences is run again alone, and those that
        fail alone too (their second failure) end with the error; the others go on as if nothing happened.
        """
        plan = self.scheduler.schedule()
        failed: list[tuple[Sequence, Exception]] = []
        try:
            output = self.runner.execute(plan, self.scheduler.seqs)
            self.health.succeeded()
        except Exception as exc:  # noqa: BLE001 - any failure of a step is contained to that step
            self.health.failed("llm_step", exc)
            log.error("LLM step of %d sequences failed; running each alone", len(plan.chunks), exc_info=exc)
            plan, output, failed = self._run_each_alone(plan)
        touched = self.scheduler.update(plan, output)
        touched += self._rejected()
        st = self.stats
        st.num_preemptions += len(plan.preempted)
        st.last_batch_tokens = plan.num_tokens
        st.last_batch_seqs = len(plan.chunks) + len(failed)
        if not plan.is_empty:
            st.num_steps += 1
            st.num_tokens_generated += len(output.sampled)
        deltas = [self._delta(seq, output) for seq in touched]
        for seq in touched:
            if seq.status.is_finished:
                self.runner.release(seq.seq_id)
        deltas += [self._end_with_error(seq, f"engine error: {type(exc).__name__}: {exc}") for seq, exc in failed]
        if deltas:
            self.streams.publish(deltas)
        return deltas

    def _run_each_alone(self, plan: StepPlan) -> tuple[StepPlan, StepOutput, list[tuple[Sequence, Exception]]]:
        """After a failed step: run each chunk as a step of its own. Returns the chunks that ran (as one plan),
        their merged output, and the sequences whose chunk failed again with the exception."""
        kept, merged = StepPlan(preempted=plan.preempted), StepOutput()
        failed: list[tuple[Sequence, Exception]] = []
        for chunk in plan.chunks:
            seq = self.scheduler.seqs.get(chunk.seq_id)
            if seq is None:
                continue
            try:
                out = self.runner.execute(StepPlan(chunks=[chunk]), self.scheduler.seqs)
            except Exception as exc:  # noqa: BLE001 - the second failure of this sequence: it ends
                self.health.failed("llm_step", exc)
                log.error("request %s failed twice in a step; ending it", seq.request_id, exc_info=exc)
                failed.append((seq, exc))
                continue
            kept.chunks.append(chunk)
            merged.sampled.update(out.sampled)
            merged.logprobs.update(out.logprobs)
            merged.top_logprobs.update(out.top_logprobs)
        return kept, merged, failed

    def _end_with_error(self, seq: Sequence, message: str) -> TokenDelta:
        """Abort ``seq`` (its KV blocks go back) and return its final delta carrying ``message``."""
        self.scheduler.abort(seq.request_id)
        self.runner.release(seq.seq_id)
        seq.error = message
        delta = self._delta(seq)
        delta.error = message
        delta.finish_reason = FinishReason.ABORT
        return delta

    def _rejected(self) -> list[Sequence]:
        """Sequences rejected from their queues, to publish; one refused with an exception (pushed out of a
        full queue: 429) gets it raised at its caller instead."""
        out = []
        for seq in self.scheduler.drain_rejected():
            if seq.refusal is not None:
                self.streams.fail(seq.request_id, seq.refusal)
            else:
                out.append(seq)
        return out

    def fail_all(self, message: str) -> None:
        """End every sequence with an error (the device loop's last resort when it keeps failing outside
        any step, so that no request waits on a loop that cannot serve it)."""
        self._fail_all(message)

    def _delta(self, seq: Sequence, output: StepOutput | None = None) -> TokenDelta:
        new_ids = seq.output_token_ids[seq.num_emitted_tokens:]
        seq.num_emitted_tokens = len(seq.output_token_ids)
        text, seq.pending_text = seq.pending_text, ""
        delta = TokenDelta(seq.request_id, text, new_ids, seq.num_prompt_tokens, seq.num_output_tokens,
                           seq.status.finish_reason, seq.error,
                           timed_out=seq.status == SequenceStatus.FINISHED_TIMED_OUT,
                           num_cached_tokens=seq.num_cached_prompt_tokens)
        if seq.admitted_s is not None and not seq.queue_reported:
            seq.queue_reported = True
            delta.queue_s = max(0.0, seq.admitted_s - seq.arrival_s)
        sid = seq.seq_id
        if seq.params.logprobs is not None and output is not None and sid in output.sampled and new_ids:
            seq.held_logprobs.append(TokenLogprob(output.sampled[sid], output.logprobs[sid],
                                                  output.top_logprobs.get(sid, [])))
        if seq.held_logprobs and (text or seq.status.is_finished):
            # with the text they made; a stop string's tokens (their text cut) are not part of the answer
            cut = seq.sink is not None and seq.sink.stopped and not text
            delta.logprobs, seq.held_logprobs = ([] if cut else seq.held_logprobs), []
        return delta

    def _fail_all(self, message: str) -> None:
        # Requests the scheduler already rejected (a queue timeout, a retired class) are published by a step,
        # and none may run: they end now with their own reason.
        # Each sequence alone, and what was ended is published whatever fails: before, one sequence whose
        # ending raised left the ones ended before it out of the scheduler with no answer (streams open for
        # good). Its own stream gets the error as an exception.
        deltas: list[TokenDelta] = []
        try:
            for seq in self._rejected():
                deltas.append(self._delta(seq))
            for seq in list(self.scheduler.seqs.values()):
                try:
                    deltas.append(self._end_with_error(seq, message))
                except Exception as exc:  # noqa: BLE001 - this request still gets an answer
                    log.exception("ending request %s failed", seq.request_id)
                    self.streams.fail(seq.request_id, RuntimeError(f"{message} (and ending it failed: {exc})"))
        finally:
            self.streams.publish(deltas)

    def is_idle(self) -> bool:
        with self._inbox_lock:
            return not self._inbox and not self.scheduler.has_work()

    def leave_if_idle(self) -> bool:
        """Device thread: when nothing is posted or scheduled, mark the engine as gone from the device (under
        the inbox's lock, so no add slips in between the check and the mark) and return True; a later
        ``submit`` raises ModelUnloadedError instead of waiting in an inbox nobody reads."""
        with self._inbox_lock:
            if self._inbox or self.scheduler.has_work():
                return False
            self._left = True
            return True

