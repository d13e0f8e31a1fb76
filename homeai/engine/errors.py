"""What the engine refuses or fails with, apart from the queues' own refusals (QueueFullError, in
scheduling): plain exceptions with no HTTP in them; the API maps each to its status once
(``homeai.api.errors.to_api_error``)."""

from __future__ import annotations


class RequestError(ValueError):
    """A request the engine cannot serve as asked (HTTP 400)."""


class QueueTimeoutError(Exception):
    """A queued request passed its timeout under a REJECT policy (HTTP 503)."""


class EmbedBatchError(RuntimeError):
    """The batch holding this input failed on the device (HTTP 500 naming the cause)."""
