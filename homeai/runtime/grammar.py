"""Constrained decoding with xgrammar: compiled grammars cached per constraint, one matcher per sequence.

Compiling a grammar takes milliseconds to seconds, so the engine compiles it on a worker thread before
the sequence is queued (``GrammarCache.compile``); the device thread only looks the result up. Each step,
``SequenceGrammars.fill`` writes the allowed-token bitmask of every constrained row (a few microseconds
a row) and ``advance`` feeds each sampled token to its matcher. A batch without constrained rows never
touches this module.

Closing in time. A grammar keeps every prefix valid, but a budget (``max_tokens``) can still cut the
output in the middle of a call or a JSON document. So every constrained row keeps a *closing*: tokens
that finish the grammar from where the row is (found by ``Closer``: the grammar's forced text, and at
each choice the character that closes soonest, e.g. ``"`` ``}`` ``0``). While the closing plus the end
token leave at least ``CLOSING_WINDOW`` tokens of the budget spare, the row samples freely (the
closing is recomputed now and then, not every step). Inside that window every token is checked: the
row may take the next token of its closing, or one of the model's ``CLOSING_CANDIDATES`` likeliest
tokens after which a closing still fits; so the output ends complete, with its end token, within the
budget. ``GrammarCache.min_output_tokens`` is the shortest complete output of a constraint (its
closing from the start plus the end token): the API does not start a request whose budget is smaller.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import xgrammar as xgr

from homeai.core.types import Constraint, ConstraintKind

log = logging.getLogger(__name__)
_SOURCE_LOCATION = re.compile(r"\[[\d:]+\] \S+:\d+: ")

CLOSING_WINDOW = 16  # spare tokens under which every sampled token must leave a closing that fits
CLOSING_CANDIDATES = 8  # of the model's likeliest tokens checked each step inside that window
CLOSING_SEARCH_BYTES = 2048  # a closing longer than this is not looked for (the output may be cut)
# Bytes a row's candidate searches may go through in a step, each a bitmask fill of the vocabulary (~10 us):
# they run on the device thread the batch shares, and 8 candidates of a long schema's closing each searched
# up to 8 bytes a token left (20 strings of 50 characters: steps of up to ~1 s, every step near the end).
CLOSING_STEP_BYTES = 2048
_COMPARED_CHOICES = 16  # choices at which the shortest search compares its options (then greedy)
_LONGEST_CLOSING_TOKEN = 16  # bytes: longer tokens (runs of spaces, long words) never help to close
# Characters tried at a choice, most closing first: end a string, an object or array, a value's
# separator, the shortest values; then anything printable.
_PREFERRED = '"}],0123456789fnt' + "abcdeghijklmopqrsuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-.:[{ "
# Then the rest of a character a token left unfinished, and the first byte of a character beyond ASCII: a
# choice only between such characters (enum ["客厅", "卧室"], pattern ^[α-ω]+$) had no closing at all.
_CLOSE_ORDER = ([c.encode() for c in _PREFERRED] + [bytes([b]) for b in range(0x21, 0x7f) if chr(b) not in _PREFERRED]
                + [bytes([b]) for b in range(0x80, 0xc0)] + [bytes([b]) for b in range(0xc2, 0xf5)])
_UNFOUND_NEED = CLOSING_SEARCH_BYTES // _LONGEST_CLOSING_TOKEN  # tokens at least in a closing not found


class GrammarError(ValueError):
    """A constraint that cannot be compiled (an invalid schema, say); the API answers 400."""


class Closer:
    """Ways to finish a grammar from a matcher's state, as token ids: the grammar's forced text, and at
    each choice the first allowed character of ``_CLOSE_ORDER`` (``shortest``: the choice whose own
    completion is shortest), then cut into the longest vocabulary tokens. Thread-safe (no shared state)."""

    def __init__(self, decoded_vocab: list[bytes], vocab_size: int, special_ids: set[int]) -> None:
        self.vocab_size = vocab_size
        self._ids: dict[bytes, int] = {}
        for token_id, text in enumerate(decoded_vocab[:vocab_size]):
            if text and token_id not in special_ids:
                self._ids.setdefault(text, token_id)
        chars = [c for c in _CLOSE_ORDER if c in self._ids]
        self._chars = chars
        ids = np.array([self._ids[c] for c in chars], dtype=np.int64)
        self._word, self._bit = ids >> 5, (ids & 31).astype(np.uint32)

    def tokens(self, text: bytes) -> list[int] | None:
        """``text`` as the longest vocabulary tokens, left to right (None: some byte has no token)."""
        out: list[int] = []
        i = 0
        while i < len(text):
            for n in range(min(_LONGEST_CLOSING_TOKEN, len(text) - i), 0, -1):
                token_id = self._ids.get(text[i:i + n])
                if token_id is not None:
                    out.append(token_id)
                    i += n
                    break
            else:
                return None
        return out

    def closing(self, matcher: xgr.GrammarMatcher, limit: int = CLOSING_SEARCH_BYTES,
                shortest: bool = False) -> list[int] | None:
        """Tokens that complete the grammar from ``matcher``'s state (left unchanged); None when no
        completion of at most ``limit`` bytes was found."""
        text = self._complete(matcher.fork(), limit, False)
        tokens = None if text is None else self.tokens(text)
        if shortest and text is not None and tokens is not None:  # no better one is looked for much past it
            better = self._complete(matcher.fork(), min(limit, 2 * len(text)), True)
            fewer = None if better is None else self.tokens(better)
            if fewer is not None and len(fewer) < len(tokens):
                return fewer
        return tokens

    def _complete(self, m: xgr.GrammarMatcher, limit: int, compare: bool) -> bytes | None:
        compared = 0
        out = bytearray()
        bitmask = xgr.allocate_token_bitmask(1, self.vocab_size)
        words = bitmask.numpy()[0].view(np.uint32)
        while len(out) <= limit:
            if m.is_completed():
                return bytes(out)
            forced = m.find_jump_forward_string()
            if forced:
                if not m.accept_string(forced):
                    return None
                out += forced.encode()
                continue
            m.fill_next_token_bitmask(bitmask, 0)
            allowed = np.flatnonzero((words[self._word] >> self._bit) & 1)
            if not len(allowed):
                return None
            choice = self._chars[allowed[0]]
            if compare and len(allowed) > 1 and compared < _COMPARED_CHOICES:  # the choice whose own
                compared += 1  # greedy completion is the fewest tokens
                best: int | None = None
                for index in allowed[:CLOSING_CANDIDATES]:
                    fork = m.fork()
                    char = self._chars[index]
                    rest = self._complete(fork, limit - len(out) - 1, False) if fork.accept_string(char) else None
                    size = None if rest is None else len(self.tokens(char + rest) or ())
                    if size and (best is None or size < best):
                        best, choice = size, char
            if not m.accept_string(choice):
                return None
            out += choice
        return None


class GrammarCache:
    """Compiled grammars for one tokenizer, least recently used evicted past ``max_entries``."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int], max_entries: int = 128) -> None:
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
        self.vocab_size = vocab_size
        self.stop_token_ids = list(stop_token_ids)
        special = {*getattr(tokenizer, "all_special_ids", ()), *getattr(tokenizer, "added_tokens_decoder", ()),
                   *info.special_token_ids, *stop_token_ids}  # never written by a closing
        self.closer = Closer(info.decoded_vocab, vocab_size, special)
        # cache_enabled=False: xgrammar's own cache has no bound; ours (max_entries) is the one cache
        self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self._cache: OrderedDict[Constraint, tuple[xgr.CompiledGrammar, list[int] | None]] = OrderedDict()
        self._lock = threading.Lock()
        self._max_entries = max_entries

    def compile(self, constraint: Constraint) -> xgr.CompiledGrammar:
        """The compiled grammar of ``constraint`` (compiled on the caller's thread on a miss)."""
        return self._entry(constraint)[0]

    def initial_closing(self, constraint: Constraint) -> list[int] | None:
        """The shortest closing found from the start (None: none within ``CLOSING_SEARCH_BYTES``)."""
        return self._entry(constraint)[1]

    def min_output_tokens(self, constraint: Constraint) -> int | None:
        """Output tokens of the shortest complete output found, its end token included (None: unknown,
        longer than ``CLOSING_SEARCH_BYTES``)."""
        closing = self.initial_closing(constraint)
        return None if closing is None else len(closing) + 1

    def _entry(self, constraint: Constraint) -> tuple[xgr.CompiledGrammar, list[int] | None]:
        with self._lock:
            hit = self._cache.get(constraint)
            if hit is not None:
                self._cache.move_to_end(constraint)
                return hit
        compiled = self._compile(constraint)
        probe = xgr.allocate_token_bitmask(1, self.vocab_size)
        matcher = xgr.GrammarMatcher(compiled)
        matcher.fill_next_token_bitmask(probe, 0)
        if not bool(probe.any()):  # say {"anyOf": []}: no first token, the request could only fail
            raise GrammarError(f"the {constraint.kind} constraint accepts no output at all")
        try:
            entry = (compiled, self.closer.closing(matcher, shortest=True))
        except (RuntimeError, MemoryError) as exc:  # std::bad_alloc building a huge forced text
            raise GrammarError(f"the {constraint.kind} constraint forces more text than can be built: {exc}") from exc
        with self._lock:
            self._cache[constraint] = entry
            while len(self._cache) > self._max_entries:
                self._cache.popitem(last=False)
        return entry

    def _compile(self, constraint: Constraint) -> xgr.CompiledGrammar:
        try:
            if constraint.kind == ConstraintKind.JSON_OBJECT:
                # Compact JSON: a small model left free to add whitespace may emit it until max_tokens.
                return self._compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)
            if constraint.kind == ConstraintKind.JSON_SCHEMA:
                return self._compiler.compile_json_schema(constraint.spec, any_whitespace=False, strict_mode=True)
            if constraint.kind == ConstraintKind.STRUCTURAL_TAG:
                return self._compiler.compile_structural_tag(json.dumps(compact_json(json.loads(constraint.spec))))
        except (RuntimeError, MemoryError, ValueError, json.JSONDecodeError) as exc:
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
    closing: list[int] | None = None  # tokens known to complete the grammar from here (None: not known now)
    need: int = 0  # the length of the last closing found...
    need_at: int = -1  # ...at this many accepted tokens (-1: never looked)
    hopeless: bool = False  # no closing fits the budget any more: sample freely (the output may be cut)
    options: dict[int, list[int]] = field(default_factory=dict)  # this step's allowed tokens -> their closing


class SequenceGrammars:
    """One matcher per constrained sequence, kept in step with the sequence's output tokens."""

    def __init__(self, cache: GrammarCache) -> None:
        self.cache = cache
        self._states: dict[int, _MatcherState] = {}

    def fill(self, seq_ids: list[int], constraints: list[Constraint], outputs: list[list[int]],
             budgets: list[int] | None = None,
             row_logits: Callable[[int], torch.Tensor] | None = None) -> torch.Tensor:
        """The allowed-token bitmask [len(seq_ids), ceil(V / 32)] int32 (CPU) of the given sequences.

        A matcher that missed tokens (new, or reset after a preemption) replays the sequence's output first.
        ``budgets``: each row's tokens left (max_tokens - output), so that the output closes in time;
        ``row_logits(row)``: that row's logits, whose likeliest tokens are checked near the end of the budget.
        """
        bitmask = xgr.allocate_token_bitmask(len(seq_ids), self.cache.vocab_size)
        for row, (seq_id, constraint, output) in enumerate(zip(seq_ids, constraints, outputs, strict=True)):
            state = self._state(seq_id, constraint, output)
            state.matcher.fill_next_token_bitmask(bitmask, row)
            state.options = {}
            if budgets is not None and not state.hopeless:
                self._close_in_time(state, constraint, bitmask, row, budgets[row], row_logits)
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
        closing = state.closing
        if token_id in state.options:
            state.closing = state.options[token_id]
        elif closing and closing[0] == token_id:
            state.closing = closing[1:]
        else:
            state.closing = None
        state.options = {}

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
        if not output:  # found once per constraint
            state.closing = self.cache.initial_closing(constraint)
            if state.closing is None:  # none within the search limit: looked for again once the budget nears
                state.need, state.need_at = _UNFOUND_NEED, 0
        return state

    def _close_in_time(self, state: _MatcherState, constraint: Constraint, bitmask: torch.Tensor, row: int,
                       remaining: int, row_logits: Callable[[int], torch.Tensor] | None) -> None:
        """Narrow ``bitmask[row]`` near the end of the budget to tokens after which the grammar can still
        be completed, with the end token, in ``remaining`` tokens."""
        matcher = state.matcher
        if matcher.is_completed():  # the output may end here: nothing to close
            return
        closer = self.cache.closer
        if state.closing is None:
            if state.need_at >= 0:  # the closing grows by about a token a step at most: look again when it might
                could_need = state.need + (state.num_accepted - state.need_at)  # not fit with room to spare
                if remaining - 1 - could_need >= 2 * CLOSING_WINDOW:
                    return
            state.closing = closer.closing(matcher, min(CLOSING_SEARCH_BYTES, 8 * remaining + 64))
        closing = state.closing
        if closing is None or len(closing) + 1 > remaining:  # too late (or no closing): it may be cut
            state.hopeless = True
            return
        state.need, state.need_at = len(closing), state.num_accepted
        if remaining - 1 - len(closing) >= CLOSING_WINDOW:
            return
        options = {closing[0]: closing[1:]}
        if row_logits is not None:
            scores = row_logits(row).detach().float().cpu().unsqueeze(0)
            xgr.apply_token_bitmask_inplace(scores, bitmask[row:row + 1])
            top = scores[0].topk(min(CLOSING_CANDIDATES, scores.shape[1]))
            limit, spare = 8 * remaining + 64, CLOSING_STEP_BYTES  # the bytes each search, and all, may go
            for score, token_id in zip(top.values.tolist(), top.indices.tolist(), strict=True):
                if token_id in options or score == float("-inf"):
                    continue
                if limit > spare:  # the step's search is spent: the row follows its closing (and those found)
                    break
                fork = matcher.fork()
                if not fork.accept_token(token_id):
                    continue
                rest = [] if fork.is_completed() else closer.closing(fork, limit)
                spare -= limit
                if rest is not None and len(rest) + 1 <= remaining - 1:
                    options[token_id] = rest
        bitmask[row] = 0
        for token_id in options:
            bitmask[row, token_id // 32] |= _bit(token_id % 32)
        state.options = options
