"""Typed views of what the gateway sends the TUI: the stats document, jobs, policy answers (msgspec Structs).

The TUI imports nothing from ``homeai`` (it talks HTTP only), so these mirror the server's documents
field for field instead of importing them: ``homeai/metrics/stats.py`` (``/v1/stats`` and its stream),
``homeai/api/jobs_schemas.py`` (``/v1/jobs``), ``homeai/api/admin_routes.py`` (``/admin/policy/*``).
Only what the TUI reads is declared; fields it does not read are ignored when decoding, and every field
has a default, so an older server (or a newer one with more fields) still decodes. A field of the wrong
type is a ``msgspec.ValidationError`` (a ``ValueError``): the client reports bad data, it does not guess.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

T = TypeVar("T")


def decode(data: bytes | str, kind: type[T]) -> T:
    """JSON text -> ``kind`` (ValueError when it does not fit)."""
    return msgspec.json.decode(data, type=kind)


def convert(obj: Any, kind: type[T]) -> T:
    """Already-parsed JSON (dicts and lists) -> ``kind`` (ValueError when it does not fit)."""
    return msgspec.convert(obj, type=kind)


# ---- /v1/stats (homeai/metrics/stats.py build_stats, homeai/api/observability_routes.py) -------------
class Targets(msgspec.Struct):
    ttft_ms: float | None = None
    itl_ms: float | None = None


class PrefixCache(msgspec.Struct):
    """Prefix-cache hits of one class since start (homeai/metrics/prefix.py prefix_entry)."""

    token_hit_rate: float = 0.0
    request_hit_rate: float = 0.0
    hit_tokens: int = 0
    prompt_tokens: int = 0
    hit_requests: int = 0
    requests: int = 0


class ClassStats(msgspec.Struct):
    """One workload class: queue, latency over the window, outcomes; ``kind`` to ``targets`` come from the
    policy (absent for a class the policy no longer has)."""

    queued: int = 0
    running: int = 0
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    ttft_samples: int = 0
    itl_p50_ms: float | None = None
    itl_p99_ms: float | None = None
    itl_samples: int = 0
    requests: dict[str, int] = msgspec.field(default_factory=dict)  # status -> count
    rejections: dict[str, int] = msgspec.field(default_factory=dict)  # reason -> count
    prefix_cache: PrefixCache = msgspec.field(default_factory=PrefixCache)
    kind: str = "llm"
    model: str | None = None
    priority: int | None = None
    background: bool = False
    targets: Targets = msgspec.field(default_factory=Targets)


class UserStats(msgspec.Struct):
    tokens_per_s_10s: float = 0.0
    tokens_per_s_60s: float = 0.0
    prompt_tokens_per_s_60s: float = 0.0
    generated_tokens: int = 0
    prompt_tokens: int = 0
    fairness: dict[str, float] = msgspec.field(default_factory=dict)  # class -> VTC counter


class CompiledDecode(msgspec.Struct):
    """Decode steps compiled per batch bucket (homeai/runtime/decode_graph.py snapshot)."""

    buckets: list[int] = msgspec.field(default_factory=list)
    ready: list[int] = msgspec.field(default_factory=list)
    failed: str | None = None


class DeviceStats(msgspec.Struct):
    """One served LLM's device figures (homeai/gateway/gateway.py _build_snapshot, plus steps_per_s)."""

    kv_usage: float = 0.0
    kv_blocks: int = 0
    steps: int = 0
    steps_per_s: float = 0.0
    preemptions: int = 0
    last_batch_tokens: int = 0
    last_batch_seqs: int = 0
    weights: str | None = None  # "none" (float weights), "int8", "int4"; absent from older servers
    dtype: str | None = None
    compiled_decode: CompiledDecode | None = None


class ModelResidency(msgspec.Struct):
    """One LLM the policy names, loaded or not (homeai/gateway/model_pool.py ``ModelPool.snapshot``)."""

    state: str = "loaded"  # unloaded | loading | loaded | unloading
    loaded: bool = True
    pinned: bool = False
    load: str = "start"  # start | on_demand
    resident_bytes: int = 0
    load_s: float | None = None
    num_loads: int = 0
    waiting_for_load: int = 0
    keep_alive: str = ""
    expires_at: float | None = None
    last_error: str | None = None


class RecentRequest(msgspec.Struct):
    """One finished request (homeai/metrics/recorder.py FinishedRequest)."""

    request_id: str = ""
    kind: str = ""
    class_name: str = ""
    user: str = ""
    model: str = ""
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    ttft_ms: float | None = None
    e2e_ms: float | None = None
    status: str = ""
    finished_at: float | None = None


class PolicyErrorItem(msgspec.Struct):
    """One policy error: key path ("" for the whole file), message, 1-based line (None: no line)."""

    path: str = ""
    message: str = ""
    line: int | None = None


class PolicyStatus(msgspec.Struct):
    """``{"status": "ok"}``, or the start-up refusal of the policy file while its fallback runs."""

    status: str = "ok"
    running: str | None = None
    reason: str | None = None
    file: str | None = None
    errors: list[PolicyErrorItem] = msgspec.field(default_factory=list)


class NodeStats(msgspec.Struct):
    """One machine's replica in a cluster (issue 23, homeai/cluster): what it serves, its load and outcomes.
    ``since_s`` is the server's wall-clock time of the last state change (ready, loading, left)."""

    name: str = ""
    node_id: str = ""
    address: str = ""
    device: str = ""
    models: list[str] = msgspec.field(default_factory=list)
    state: str = "ready"  # ready | loading | left
    replica: str = ""
    running: dict[str, int] = msgspec.field(default_factory=dict)  # class -> running sequences
    queued: dict[str, int] = msgspec.field(default_factory=dict)  # class -> waiting
    free_kv_tokens: int = 0
    served: int = 0
    failed: int = 0
    since_s: float | None = None


class ClusterStats(msgspec.Struct):
    """The nodes behind the front door; its own device is the node named "local"."""

    nodes: list[NodeStats] = msgspec.field(default_factory=list)


class StatsDoc(msgspec.Struct):
    """One /v1/stats document (also each ``stats`` event of /v1/stats/stream)."""

    time: float = 0.0  # the server's wall clock, epoch seconds
    uptime_s: float | None = None
    window_s: float | None = None
    num_live_requests: int = 0
    classes: dict[str, ClassStats] = msgspec.field(default_factory=dict)
    users: dict[str, UserStats] = msgspec.field(default_factory=dict)
    device: dict[str, DeviceStats] = msgspec.field(default_factory=dict)
    models: dict[str, ModelResidency] = msgspec.field(default_factory=dict)  # absent from older servers
    recent: list[RecentRequest] = msgspec.field(default_factory=list)  # most recent first
    policy: PolicyStatus = msgspec.field(default_factory=PolicyStatus)
    cluster: ClusterStats | None = None  # only while the server runs a cluster (homeai serve --cluster)


# ---- /v1/jobs (homeai/api/jobs_schemas.py JobView, JobProgress, JobList) ------------------------------
class JobProgress(msgspec.Struct):
    done_chunks: int = 0
    total_chunks: int = 0
    done_files: int = 0
    total_files: int = 0
    phase: str | None = None
    chunks_per_s: float = 0.0
    eta_s: float | None = None


class JobView(msgspec.Struct):
    """One job; ``spec`` holds what the job was asked to do: ``path`` and ``collection`` (index),
    ``prompt`` (prompt), ``days`` (retention)."""

    id: int
    kind: str = ""
    state: str = ""
    spec: dict[str, Any] = msgspec.field(default_factory=dict)
    schedule: str | None = None
    next_run_at: str | None = None
    progress: JobProgress = msgspec.field(default_factory=JobProgress)
    error: str | None = None
    created_by: str = ""
    created_at: str | None = None
    started_at: str | None = None
    finished_at: str | None = None

    def target(self) -> str:
        """What the job works on, as a person names it: ``family ← /home/me/Documents`` for an index job."""
        spec = self.spec
        if self.kind == "index":
            collection, path = spec.get("collection"), spec.get("path")
            return " ← ".join(str(v) for v in (collection, path) if v)
        if self.kind == "prompt":
            return repr(str(spec.get("prompt", "")))
        if self.kind == "retention":
            return f"{spec.get('days', '?')} days"
        return ""


class JobList(msgspec.Struct):
    jobs: list[JobView] = msgspec.field(default_factory=list)


# ---- /admin/policy (homeai/api/admin_routes.py) ---------------------------------------------------
class PolicySummary(msgspec.Struct):
    classes: list[str] = msgspec.field(default_factory=list)
    users: list[str] = msgspec.field(default_factory=list)
    aliases: list[str] = msgspec.field(default_factory=list)


class PolicyCheck(msgspec.Struct):
    """POST /admin/policy/validate's 200: valid, and what applying would change."""

    valid: bool = True
    changed: bool = False
    diff: list[str] = msgspec.field(default_factory=list)
    policy: PolicySummary = msgspec.field(default_factory=PolicySummary)


class PolicyApplied(msgspec.Struct):
    """PUT /admin/policy's and POST /admin/policy/rollback's 200."""

    changed: bool = False
    diff: list[str] = msgspec.field(default_factory=list)
    version: int | None = None  # the stored version (None: not stored)
    swap_version: int = 0
    warning: str | None = None
    written_to: str | None = None
    rolled_back_to: int | None = None


class PolicyVersion(msgspec.Struct):
    version: int
    applied_at: str = ""
    applied_by: str = ""
    note: str | None = None


class PolicyHistory(msgspec.Struct):
    current: int | None = None  # the version the running policy is (None: not stored)
    versions: list[PolicyVersion] = msgspec.field(default_factory=list)  # newest first
