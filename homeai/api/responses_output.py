"""The output items of a Responses answer and the events that build them, in the order the SDK expects.

Text becomes a ``message`` item (``output_item.added``, ``content_part.added``, ``output_text.delta``...,
then the matching ``.done`` events); each tool call becomes a ``function_call`` item (``output_item.added``
with its name, ``function_call_arguments.delta`` fragments, ``function_call_arguments.done``,
``output_item.done``), all at once when the call is complete: a call the budget cuts short gets no item
(the response is then "incomplete"). An item closes before the next opens; an answer with neither gets an
empty message.
"""

from __future__ import annotations

from typing import Any

from homeai.api.tool_calls import ParseEvent
from homeai.core.types import FinishReason

Event = tuple[str, dict[str, Any]]


class OutputItems:
    """Feed the answer's parse events as they come (``generation.AnswerReader``); collect the events to send and the
    final output items."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.items: list[dict[str, Any]] = []
        self._text: list[str] | None = None  # the open message's text parts (None: no message open)
        self._call_items: dict[int, dict[str, Any]] = {}  # call index -> its item

    def feed(self, parsed: list[ParseEvent], finished: bool, reason: FinishReason | None = None) -> list[Event]:
        """``reason``: how the answer ended (with ``finished``): a message the budget cut is closed
        "incomplete" in its ``output_item.done`` as in the final response (it said "completed" there)."""
        events: list[Event] = []
        for e in parsed:
            if e.text:
                events += self._text_delta(e.text)
            elif e.call is not None:
                events += self._call_event(e)
        if finished:
            if self._text is None and not self.items:
                events += self._open_message()
            events += self._close_message("incomplete" if reason == FinishReason.LENGTH else "completed")
        return events

    def output(self, reason: FinishReason | None) -> list[dict[str, Any]]:
        status = "incomplete" if reason == FinishReason.LENGTH else "completed"
        return [{**item, "status": status} if item["type"] == "message" else item for item in self.items]

    # ---- message items ---------------------------------------------------------------------------
    def _where(self) -> dict[str, Any]:
        item = self.items[-1]
        return {"item_id": item["id"], "output_index": len(self.items) - 1, "content_index": 0}

    def _open_message(self) -> list[Event]:
        n = sum(1 for i in self.items if i["type"] == "message")
        item = {"type": "message", "id": f"msg_{self.request_id}" + (f"_{n}" if n else ""),
                "status": "in_progress", "role": "assistant", "content": []}
        self.items.append(item)
        self._text = []
        return [("response.output_item.added", {"output_index": len(self.items) - 1, "item": dict(item)}),
                ("response.content_part.added", {**self._where(),
                                                 "part": {"type": "output_text", "text": "", "annotations": []}})]

    def _text_delta(self, text: str) -> list[Event]:
        events = self._open_message() if self._text is None else []
        assert self._text is not None
        self._text.append(text)
        return [*events, ("response.output_text.delta", {**self._where(), "delta": text, "logprobs": []})]

    def _close_message(self, status: str = "completed") -> list[Event]:
        if self._text is None:
            return []
        text, self._text = "".join(self._text), None
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        item = self.items[-1]
        item.update(status=status, content=[part])
        where = self._where()
        return [("response.output_text.done", {**where, "text": text, "logprobs": []}),
                ("response.content_part.done", {**where, "part": part}),
                ("response.output_item.done", {"output_index": where["output_index"], "item": dict(item)})]

    # ---- function_call items ---------------------------------------------------------------------
    def _call_event(self, e: ParseEvent) -> list[Event]:
        call = e.call
        assert call is not None
        item = self._call_items.get(call.index)
        if item is None:
            events = self._close_message()
            item = {"type": "function_call", "id": f"fc_{self.request_id}_{call.index}", "call_id": call.id,
                    "name": call.name, "arguments": "", "status": "in_progress"}
            self._call_items[call.index] = item
            self.items.append(item)
            return [*events, ("response.output_item.added", {"output_index": len(self.items) - 1,
                                                             "item": dict(item)})]
        where = {"item_id": item["id"], "output_index": self.items.index(item)}
        if e.fragment:
            item["arguments"] += e.fragment
            return [("response.function_call_arguments.delta", {**where, "delta": e.fragment})]
        if e.done:
            item["status"] = "completed"
            return [("response.function_call_arguments.done", {**where, "arguments": item["arguments"]}),
                    ("response.output_item.done", {"output_index": where["output_index"], "item": dict(item)})]
        return []
