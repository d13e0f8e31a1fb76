"""Incremental detokenizing with stop strings: turn one token at a time into text that is safe to send.

Decoding a token alone is wrong for most tokenizers (SentencePiece drops a word's leading space,
byte-level BPE and byte fallback split characters across tokens), so, as in vLLM and TGI, we decode a
short window of recent tokens twice, up to the last emitted token (``prefix_offset:read_offset``) and
up to the newest one, and emit the difference. Cost per token is O(window), not O(length).
"""

from __future__ import annotations

from typing import Protocol

REPLACEMENT_CHAR = "\ufffd"  # what decode shows for bytes that are not (yet) a whole UTF-8 character
PROMPT_CONTEXT_TOKENS = 5  # prompt tokens kept as context, so the first output token decodes in place
MAX_HELD_TOKENS = 32  # a character never spans this many tokens: past it, give up waiting (bad bytes)
COMPACT_AFTER_TOKENS = 64  # drop ids before the window once this many pile up


class Tokenizer(Protocol):
    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str: ...


class IncrementalDetokenizer:
    """One sequence's streaming text: never a broken UTF-8 character, never any part of a stop string.

    ``push`` returns the text that became safe with this token; ``flush`` at the finish returns what
    was held back (a stop-string prefix that never completed). Once ``stopped``, nothing more comes.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_ids: list[int],
        stop: list[str],
        skip_special_tokens: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._ids = list(prompt_ids[-PROMPT_CONTEXT_TOKENS:])
        self._prefix_offset = 0  # window start: context for decoding what follows
        self._read_offset = len(self._ids)  # ids before this are already turned into text
        self._read_chars = 0  # chars of text past read_offset already let out (a broken char ends it)
        self._stops = [s for s in stop if s]
        self._max_stop_chars = max((len(s) for s in self._stops), default=0)
        self._pending = ""  # decoded text held back because it may begin a stop string
        self._emitted: list[str] = []
        self.stopped = False

    @property
    def text(self) -> str:
        """Everything emitted so far."""
        return "".join(self._emitted)

    def push(self, token_id: int) -> str:
        """Add one generated token; return the new text that is now safe to emit (often "")."""
        if self.stopped:
            return ""
        self._ids.append(token_id)
        return self._release(self._decode_new(final=False), final=False)

    def flush(self) -> str:
        """At the finish: release held text; an incomplete character at the very end is dropped."""
        if self.stopped:
            return ""
        return self._release(self._decode_new(final=True), final=True)

    def _decode(self, start: int, end: int | None = None) -> str:
        return self._tokenizer.decode(self._ids[start:end], skip_special_tokens=self._skip_special)

    def _decode_new(self, final: bool) -> str:
        """Text added by the tokens past read_offset, without a trailing incomplete character."""
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        new_text = self._decode(self._prefix_offset)
        if len(new_text) <= len(prefix_text) and not final:
            return ""  # e.g. a skipped special token: nothing to show yet
        tail = new_text[len(prefix_text) :]
        num_held = len(self._ids) - self._read_offset
        if tail.endswith(REPLACEMENT_CHAR) and not final and num_held < MAX_HELD_TOKENS:
            # A character is still incomplete; the whole ones before it are final already.
            whole = tail.rstrip(REPLACEMENT_CHAR)
            delta = whole[self._read_chars :]
            self._read_chars = max(self._read_chars, len(whole))
            return delta
        if final:
            tail = tail.rstrip(REPLACEMENT_CHAR)
        delta = tail[self._read_chars :]
        self._prefix_offset, self._read_offset, self._read_chars = self._read_offset, len(self._ids), 0
        self._compact()
        return delta

    def _compact(self) -> None:
        """Forget ids before the window so memory stays O(window) on long generations."""
        if self._prefix_offset >= COMPACT_AFTER_TOKENS:
            del self._ids[: self._prefix_offset]
            self._read_offset -= self._prefix_offset
            self._prefix_offset = 0

    def _release(self, new_text: str, final: bool) -> str:
        """Apply stop strings to held + new text; emit what can no longer become part of a stop."""
        text = self._pending + new_text
        self._pending = ""
        if not self._stops:
            return self._emit(text)
        # Held text contains no whole stop string. The stop honoured is the one that ends first (then the one
        # that starts first), as if the text had come a character at a time: cutting at the earliest start
        # made the output depend on the tokens ("abcd" with stops "abcd" and "bc": "" in one token, "a" in four).
        found = [(i + len(s), i) for s, i in ((s, text.find(s)) for s in self._stops) if i >= 0]
        if found:
            self.stopped = True
            return self._emit(text[:min(found)[1]])
        if not final:
            held = self._stop_prefix_len(text)
            if held:
                text, self._pending = text[:-held], text[-held:]
        return self._emit(text)

    def _stop_prefix_len(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of some stop string."""
        for size in range(min(len(text), self._max_stop_chars - 1), 0, -1):
            suffix = text[-size:]
            if any(s.startswith(suffix) for s in self._stops):
                return size
        return 0

    def _emit(self, text: str) -> str:
        if text:
            self._emitted.append(text)
        return text
