"""What the engine refuses or fails with, apart from the queues' own refusals (QueueFullError, in
scheduling): plain exceptions with no HTTP in them; the API maps each to its status once
(``homeai.api.errors.to_api_error``)."""

from __future__ import annotations


class RequestError(ValueError):
    """A request the engine cannot serve as asked (HTTP 400)."""


class QueueTimeoutError(Exception):
    """A queued request passed its timeout under a REJECT policy (HTTP 503)."""


class ClassRetiredError(RuntimeError):
    """A queued request whose class a policy change removed (or moved to another model) before it ran
    (HTTP 503 with Retry-After: sent again, the new policy routes it)."""


class EmbedBatchError(RuntimeError):
    """The batch holding this input failed on the device (HTTP 500 naming the cause)."""


class _ModelError(RuntimeError):
    """An error about one model: picklable with its two arguments (a cluster's replica raises it in another
    process; without ``__reduce__`` Ray could not rebuild it and the front door got an opaque error, a 500)."""

    def __init__(self, model: str, message: str) -> None:
        super().__init__(message)
        self.model = model

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return type(self), (self.model, str(self))


class ModelCapacityError(_ModelError):
    """A model cannot be loaded: it does not fit the memory budget beside the models that must stay (pinned,
    or serving requests). Never answered by evicting a pinned model (HTTP 503 naming the model)."""


class ModelUnloadedError(_ModelError):
    """The model left the device (its keep_alive ran out) between a request's lookup of it and the request's
    submission. The gateway loads it again and submits once more; a caller that gets this sees HTTP 503."""


class ShuttingDownError(RuntimeError):
    """The drain's deadline has passed: no request starts any more (HTTP 503 with Retry-After)."""


class ModelLoadingError(_ModelError):
    """The model is being loaded (an embedding model a policy change named): HTTP 503 with a short
    Retry-After."""


class ModelLoadError(_ModelError):
    """Loading a model failed (HTTP 503 naming the model and the cause); the next request tries again."""


# An error delta's text starts with this when the node serving the request left after its first token (a
# cluster's front door could not place it again): the answer is cut, but a job may ask again.
REPLICA_LOST = "replica lost"
