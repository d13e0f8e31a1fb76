"""Constrained decoding with xgrammar: compiled grammars cached per constraint, one matcher per sequence.

Compiling a grammar takes milliseconds to seconds, so the engine compiles it on a worker thread before
the sequence is queued (``GrammarCache.compile``); the device thread only looks the result up. Each step,
``SequenceGrammars.fill`` writes the allowed-token bitmask of every constrained row (a few microseconds
a row) and ``advance`` feeds each sampled token to its matcher. A batch without constrained rows never
touches this module.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch
import xgrammar as xgr

from homeai.core.types import Constraint, ConstraintKind

log = logging.getLogger(__name__)
_SOURCE_LOCATION = re.compile(r"\[[\d:]+\] \S+:\d+: ")


class GrammarError(ValueError):
    """A constraint that cannot be compiled (an invalid schema, say); the API answers 400."""


class GrammarCache:
    """Compiled grammars for one tokenizer, least recently used evicted past ``max_entries``."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int], max_entries: int = 128) -> None:
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
        self.vocab_size = vocab_size
        self.stop_token_ids = list(stop_token_ids)
        self._compiler = xgr.GrammarCompiler(info, max_threads=1)
        self._cache: OrderedDict[Constraint, xgr.CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()
        self._max_entries = max_entries

    def compile(self, constraint: Constraint) -> xgr.CompiledGrammar:
        """The compiled grammar of ``constraint`` (compiled on the caller's thread on a miss)."""
        with self._lock:
            hit = self._cache.get(constraint)
            if hit is not None:
                self._cache.move_to_end(constraint)
                return hit
        compiled = self._compile(constraint)
        probe = xgr.allocate_token_bitmask(1, self.vocab_size)
        xgr.GrammarMatcher(compiled).fill_next_token_bitmask(probe, 0)
        if not bool(probe.any()):  # say {"anyOf": []}: no first token, the request could only fail
            raise GrammarError(f"the {constraint.kind} constraint accepts no output at all")
        with self._lock:
            self._cache[constraint] = compiled
            while len(self._cache) > self._max_entries:
                self._cache.popitem(last=False)
        return compiled

    def _compile(self, constraint: Constraint) -> xgr.CompiledGrammar:
        try:
            if constraint.kind == ConstraintKind.JSON_OBJECT:
                # Compact JSON: a small model left free to add whitespace may emit it until max_tokens.
                return self._compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)
            if constraint.kind == ConstraintKind.JSON_SCHEMA:
                return self._compiler.compile_json_schema(constraint.spec, any_whitespace=False, strict_mode=True)
            if constraint.kind == ConstraintKind.STRUCTURAL_TAG:
                return self._compiler.compile_structural_tag(json.dumps(compact_json(json.loads(constraint.spec))))
        except (RuntimeError, ValueError, json.JSONDecodeError) as exc:
            reason = _SOURCE_LOCATION.sub("", str(exc)).strip()  # "[03:26:24] /project/cpp/x.cc:5082: "
            raise GrammarError(f"cannot compile the {constraint.kind} constraint: {reason}") from exc
        raise GrammarError(f"unknown constraint kind {constraint.kind!r}")


def compact_json(node: Any) -> Any:
    """A structural tag whose JSON contents allow no free whitespace (as ``any_whitespace=False`` does for
    a schema): left free, a small model spends its tokens on newlines and indents, or never stops."""
    if isinstance(node, list):
        return [compact_json(item) for item in node]
    if not isinstance(node, dict):
        return node
    if node.get("type") == "json_schema" and "json_schema" in node:
        schema = json.dumps(node["json_schema"])
        grammar = xgr.Grammar.from_json_schema(schema, any_whitespace=False, strict_mode=True)
        return {"type": "grammar", "grammar": str(grammar)}
    return {key: compact_json(value) for key, value in node.items()}


def _bit(index: int) -> int:
    """Bit ``index`` of an int32 word, as a Python int that fits int32 (bit 31 is the sign)."""
    return (1 << index) - (1 << 32 if index == 31 else 0)


@dataclass(slots=True)
class _MatcherState:
    matcher: xgr.GrammarMatcher
    num_accepted: int  # output tokens the matcher has consumed


class SequenceGrammars:
    """One matcher per constrained sequence, kept in step with the sequence's output tokens."""

    def __init__(self, cache: GrammarCache) -> None:
        self.cache = cache
        self._states: dict[int, _MatcherState] = {}

    def fill(self, seq_ids: list[int], constraints: list[Constraint], outputs: list[list[int]]) -> torch.Tensor:
        """The allowed-token bitmask [len(seq_ids), ceil(V / 32)] int32 (CPU) of the given sequences.

        A matcher that missed tokens (new, or reset after a preemption) replays the sequence's output first.
        """
        bitmask = xgr.allocate_token_bitmask(len(seq_ids), self.cache.vocab_size)
        for row, (seq_id, constraint, output) in enumerate(zip(seq_ids, constraints, outputs, strict=True)):
            state = self._state(seq_id, constraint, output)
            state.matcher.fill_next_token_bitmask(bitmask, row)
            if not bool(bitmask[row].any()):  # a dead end (a refused token): let the sequence end
                for stop_id in self.cache.stop_token_ids:
                    bitmask[row, stop_id // 32] |= _bit(stop_id % 32)
        return bitmask

    def advance(self, seq_id: int, token_id: int) -> None:
        """Feed a sampled token to the sequence's matcher."""
        state = self._states.get(seq_id)
        if state is None:
            return
        if not state.matcher.accept_token(token_id):
            # Only a token outside the mask can be refused; rebuild from the sequence's tokens next step.
            log.warning("grammar refused token %d of sequence %d", token_id, seq_id)
            self._states.pop(seq_id, None)
            return
        state.num_accepted += 1

    def reset(self, seq_id: int) -> None:
        """Drop a sequence's matcher (preempted: it is rebuilt from the recomputed tokens; finished)."""
        self._states.pop(seq_id, None)

    def _state(self, seq_id: int, constraint: Constraint, output: list[int]) -> _MatcherState:
        state = self._states.get(seq_id)
        if state is not None and state.num_accepted == len(output):
            return state
        matcher = xgr.GrammarMatcher(self.cache.compile(constraint))
        for token_id in output:
            if not matcher.accept_token(token_id):
                break
        state = self._states[seq_id] = _MatcherState(matcher, len(output))
        return state
