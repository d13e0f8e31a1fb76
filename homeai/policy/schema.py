"""The policy model: workload classes, users, model aliases and global scheduler limits.

Field names follow Triton's ``ModelDynamicBatching`` / ``ModelQueuePolicy`` in snake_case so that a
reader who knows Triton can read a policy file. Every model forbids unknown keys and is strict about
types (``max_queue_size: "16"`` is an error, not a coercion): a typo in a policy must never silently
fall back to a default. Cross-field rules are checked once the fields are valid, and each failure
names its own key path (``users.bob.default_class``), not just the object it sits in.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from homeai.policy.durations import KeepAlive, parse_keep_alive

Kind = Literal["llm", "embedding"]
TimeoutAction = Literal["REJECT", "DELAY"]
Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_\-]*$", max_length=64)]
# Priority levels are keys of a YAML mapping; JSON (the admin API) can only send them as strings.
LevelKey = Annotated[int, Field(strict=False)]
# The background classes' min_share together: at most half of every step and of the device, so the other
# half is always left to interactive work (a voice prompt is planned within it before any share is paid).
MAX_BACKGROUND_SHARE = 0.5
# A background-only step while the house is active lasts at most this fraction of an interactive class's
# TTFT target (``arrival_step_fraction`` overrides it per class): a request arriving during it waits that.
DEFAULT_ARRIVAL_STEP_FRACTION = 0.1
# The loaded models' weights and KV caches may hold this much of the device's memory unless the policy says
DEFAULT_MEMORY_FRACTION = 0.8


# Class priorities: background classes rank after every interactive one (scheduler rank priority + 1000), so
# an interactive class's number must stay below that (1500 made chat rank after a background class).
MAX_PRIORITY = 999
MAX_PRIORITY_LEVELS = 100  # each level is a queue of its own: a million took seconds and gigabytes to build

class _Strict(BaseModel):
    # No infinity or NaN anywhere: "ttft_ms: .inf" validated, then failed every step planned for it.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True, allow_inf_nan=False)


def _fail(title: str, problems: list[tuple[tuple[str | int, ...], str, object]]) -> None:
    """Raise one ValidationError whose entries carry their own key paths (pydantic nests them)."""
    if problems:
        raise ValidationError.from_exception_data(
            title,
            [
                InitErrorDetails(type=PydanticCustomError("policy", msg), loc=loc, input=value)
                for loc, msg, value in problems
            ],
        )


class QueuePolicy(_Strict):
    """Triton's ModelQueuePolicy for one priority level of a class queue."""

    max_queue_size: int = Field(0, ge=0, description="requests waiting at this level; 0 = unbounded")
    timeout_action: TimeoutAction = Field("REJECT", description="past the timeout: fail, or move back")
    default_timeout_microseconds: int = Field(0, ge=0, description="queue timeout; 0 = none")
    allow_timeout_override: bool = Field(False, description="a request may shorten (never lengthen) it")


class Fairness(_Strict):
    """VTC cost weights: a user is charged in*w_in + out*w_out tokens, divided by the user's weight."""

    w_in: float = Field(1.0, ge=0.0)
    w_out: float = Field(2.0, ge=0.0)

    @model_validator(mode="after")
    def _not_both_zero(self) -> Fairness:
        if self.w_in == 0.0 and self.w_out == 0.0:
            _fail("Fairness", [(("w_out",), "w_in and w_out cannot both be 0", self.w_out)])
        return self


class Targets(_Strict):
    """Latency targets: shown against measurements (TUI, bench), and what the LLM planner sizes each
    step by (a step no longer than a share of the tightest ITL target of the running interactive
    classes, and of the TTFT target, so a request arriving meanwhile still makes it)."""

    ttft_ms: float | None = Field(None, gt=0)
    itl_ms: float | None = Field(None, gt=0)


class ClassPolicy(_Strict):
    """One workload class: its queue (Triton semantics), its place among classes, and its limits."""

    kind: Kind
    model: str = Field(min_length=1, description="a model name in the model repository")
    priority: int = Field(1, ge=0, le=MAX_PRIORITY, description="among classes; 0 is the most important (as in "
                          "Triton); background classes rank after every interactive one whatever their number")
    background: bool = Field(False, description="only fills idle capacity (plus min_share)")
    # Triton dynamic batching
    max_batch_size: int = Field(8, ge=1)
    preferred_batch_size: list[Annotated[int, Field(ge=1)]] = Field(default_factory=list)
    max_queue_delay_microseconds: int = Field(0, ge=0)
    priority_levels: int = Field(1, ge=1, le=MAX_PRIORITY_LEVELS,
                                 description="levels inside the class; 1 is served first")
    default_priority_level: int = Field(1, ge=1)
    default_queue_policy: QueuePolicy = Field(default_factory=QueuePolicy)
    priority_queue_policy: dict[LevelKey, QueuePolicy] = Field(default_factory=dict)
    preserve_ordering: bool = Field(False, description="batch responses in request order")
    # LLM limits
    max_running: int | None = Field(None, ge=1, description="running sequences of this class")
    min_share: float = Field(0.0, ge=0.0, le=1.0,
                             description="background: share guaranteed while backlogged, as a rate (no catch-up)")
    max_prompt_tokens: int | None = Field(None, ge=1)
    max_output_tokens: int | None = Field(None, ge=1)
    tool_choice: Literal["auto", "required"] = Field(
        "auto", description="for a request that brings tools but does not choose (Ollama cannot): 'required' "
        "makes the model make one call while the user spoke last (small models rarely choose to); after a "
        "tool result the model answers in words")
    fairness: Fairness = Field(default_factory=Fairness)
    targets: Targets = Field(default_factory=Targets)
    # How an interactive LLM class trades its own speed for the background's throughput
    latency_margin: float | None = Field(
        None, ge=0.0, le=10.0,
        description="interactive llm: how much the work of less important classes may lengthen a step that "
        "carries this class's work (0.15: at most 15 % longer than the step without it, as the planner's "
        "fitted cost model predicts it); unset: only the step budget from the targets bounds it")
    margin_between_steps: bool = Field(
        False, description="with latency_margin: the margin also bounds the background batches run between "
        "this class's steps, so its tokens come as in a quiet house (not only its steps); false: those batches "
        "fill the time its ITL target leaves")
    arrival_step_fraction: float | None = Field(
        None, gt=0.0, le=1.0,
        description="with latency_margin and a TTFT target: while the class is active, a step of background "
        f"work lasts at most this fraction of its TTFT target, what a request arriving during it waits "
        f"(default {DEFAULT_ARRIVAL_STEP_FRACTION})")

    @model_validator(mode="after")
    def _check(self) -> ClassPolicy:
        problems: list[tuple[tuple[str | int, ...], str, object]] = []
        if self.min_share > 0 and not self.background:  # it was accepted and ignored: the class starved
            problems.append((("min_share",), "only a background class has a min_share (interactive classes are "
                             "served by priority; set background: true, or a lower priority number)", self.min_share))
        for i, size in enumerate(self.preferred_batch_size):
            if size > self.max_batch_size:
                msg = f"preferred size {size} exceeds max_batch_size {self.max_batch_size}"
                problems.append((("preferred_batch_size", i), msg, size))
        if len(set(self.preferred_batch_size)) != len(self.preferred_batch_size):
            problems.append((("preferred_batch_size",), "sizes must be distinct", self.preferred_batch_size))
        if self.default_priority_level > self.priority_levels:
            msg = f"must be within 1..priority_levels ({self.priority_levels})"
            problems.append((("default_priority_level",), msg, self.default_priority_level))
        for level in self.priority_queue_policy:
            if not 1 <= level <= self.priority_levels:
                msg = f"level {level} is outside 1..priority_levels ({self.priority_levels})"
                problems.append((("priority_queue_policy", level), msg, level))
        if self.kind == "llm" and self.preferred_batch_size:
            msg = ("only for embedding classes: an LLM class batches in flight, admitting each request "
                   "into the running step as it comes, so there is no batch of a preferred size to wait "
                   "for (max_batch_size and the delay window are what group its new prompts)")
            problems.append((("preferred_batch_size",), msg, self.preferred_batch_size))
        if self.kind == "embedding":
            for key in ("max_running", "max_output_tokens"):
                if getattr(self, key) is not None:
                    problems.append(((key,), "only for llm classes", getattr(self, key)))
            if self.max_prompt_tokens is not None and self.max_prompt_tokens < 3:  # [CLS] text [SEP]
                problems.append((("max_prompt_tokens",), "an embedding input needs at least 3 tokens: the "
                                 "encoder's two special ones and one of the text", self.max_prompt_tokens))
        if self.latency_margin is not None and (self.kind != "llm" or self.background):
            msg = ("only for interactive llm classes: it bounds how much less important work may lengthen "
                   "this class's steps")
            problems.append((("latency_margin",), msg, self.latency_margin))
        if self.margin_between_steps and self.latency_margin is None:
            problems.append((("margin_between_steps",), "only with latency_margin", self.margin_between_steps))
        if self.arrival_step_fraction is not None:
            if self.latency_margin is None:
                problems.append((("arrival_step_fraction",), "only with latency_margin", self.arrival_step_fraction))
            elif self.targets.ttft_ms is None:
                problems.append((("arrival_step_fraction",), "needs targets.ttft_ms (a fraction of it)",
                                 self.arrival_step_fraction))
        _fail("ClassPolicy", problems)
        return self

    def queue_policy(self, level: int) -> QueuePolicy:
        """The queue policy of a priority level (priority_queue_policy overrides the default)."""
        return self.priority_queue_policy.get(level, self.default_queue_policy)

    @property
    def max_queue_delay_s(self) -> float:
        return self.max_queue_delay_microseconds / 1e6

    @property
    def arrival_fraction(self) -> float | None:
        """The fraction of its TTFT target a background-only step may last while this class is active
        (None: the class sets no latency_margin, or has no TTFT target)."""
        if self.latency_margin is None or self.targets.ttft_ms is None:
            return None
        return self.arrival_step_fraction if self.arrival_step_fraction is not None else DEFAULT_ARRIVAL_STEP_FRACTION


class ModelPolicy(_Strict):
    """How one LLM of the model repository stays on the device (``models.<name>``; a model without an
    entry here loads at start and stays, unless another model's load needs its memory while it is idle)."""

    pinned: bool = Field(False, description="loaded at start and never unloaded: neither keep_alive, a client's "
                         "keep_alive nor another model's load takes it off the device (voice's model)")
    load: Literal["start", "on_demand"] = Field(
        "start", description="start: loaded with the server; on_demand: loaded by its first request, which waits "
        "in its class meanwhile (the wait counts against its queue timeout)")
    keep_alive: KeepAlive = Field(
        -1, description="how long the model stays loaded once idle, as Ollama's keep_alive: a duration (\"5m\", "
        "\"1h30m\") or seconds; 0: unloaded as soon as it is idle; negative: stays. A client's keep_alive "
        "overrides it for that model, except for a pinned one")
    kv_cache_mb: int | None = Field(None, ge=1,
                                    description="this model's KV cache (default: the server's --kv-cache-mb)")

    @model_validator(mode="after")
    def _check(self) -> ModelPolicy:
        problems: list[tuple[tuple[str | int, ...], str, object]] = []
        try:
            seconds = parse_keep_alive(self.keep_alive)
        except ValueError as exc:
            problems.append((("keep_alive",), str(exc), self.keep_alive))
            seconds = None
        if self.pinned and self.load != "start":
            problems.append((("load",), "a pinned model loads at start", self.load))
        if self.pinned and seconds is not None:
            problems.append((("keep_alive",), "a pinned model stays loaded: keep_alive does not apply to it",
                             self.keep_alive))
        _fail("ModelPolicy", problems)
        return self

    @property
    def keep_alive_s(self) -> float | None:
        """Seconds the model stays once idle (0: unloaded when idle); None: it stays."""
        return None if self.pinned else parse_keep_alive(self.keep_alive)


class UserPolicy(_Strict):
    """A household member (or a service such as the indexer): fairness weight and allowed classes."""

    weight: float = Field(1.0, gt=0.0, description="share of a class relative to other users")
    allowed_classes: list[str] = Field(default_factory=lambda: ["*"], min_length=1)
    default_class: str | None = Field(None, description="class when the request names none")

    def allows(self, class_name: str) -> bool:
        return "*" in self.allowed_classes or class_name in self.allowed_classes


class AliasPolicy(_Strict):
    """A model name clients may send, routed to a class (and through it, to the class's model)."""

    model: str | None = Field(None, min_length=1, description="defaults to the class's model")
    class_name: str = Field(alias="class")


class GlobalLimits(_Strict):
    """Limits of the one device loop, shared by all classes."""

    max_num_batched_tokens: int = Field(2048, ge=1, description="tokens per LLM step")
    max_num_seqs: int = Field(64, ge=1, description="running sequences, all classes")
    # Not applied: a KV cache is sized by `homeai serve --kv-cache-mb` or models.<name>.kv_cache_mb. Kept so
    # that policy files copied from an older default (which set kv_cache_fraction: 0.8) stay valid.
    kv_cache_fraction: float | None = Field(None, gt=0.0, le=1.0, description="not applied (kept for older files): "
                                            "the KV cache is --kv-cache-mb or models.<name>.kv_cache_mb")
    kv_cache_mb: int | None = Field(None, ge=1, description="not applied (kept for older files): the KV cache is "
                                    "--kv-cache-mb or models.<name>.kv_cache_mb")
    # What the loaded models (weights and KV caches of every LLM, the encoders' weights) may hold together
    memory_mb: int | None = Field(None, ge=1, description="memory budget of the loaded models, in MB")
    memory_fraction: float | None = Field(
        None, gt=0.0, le=1.0, description=f"memory budget as a fraction of the device's memory (GPU memory, or "
        f"RAM on the CPU); default {DEFAULT_MEMORY_FRACTION} when neither this nor memory_mb is set")

    @model_validator(mode="after")
    def _one_kv_size(self) -> GlobalLimits:
        problems: list[tuple[tuple[str | int, ...], str, object]] = []
        if self.kv_cache_fraction is not None and self.kv_cache_mb is not None:
            problems.append((("kv_cache_mb",), "set kv_cache_fraction or kv_cache_mb, not both", self.kv_cache_mb))
        if self.memory_fraction is not None and self.memory_mb is not None:
            problems.append((("memory_mb",), "set memory_fraction or memory_mb, not both", self.memory_mb))
        _fail("GlobalLimits", problems)
        return self

    def memory_budget_bytes(self, device_memory_bytes: int | None) -> int | None:
        """The budget in bytes (None: memory_fraction of a device whose memory is unknown)."""
        if self.memory_mb is not None:
            return self.memory_mb * 2**20
        if device_memory_bytes is None:
            return None
        return int((self.memory_fraction or DEFAULT_MEMORY_FRACTION) * device_memory_bytes)

    def describe_budget(self) -> str:
        if self.memory_mb is not None:
            return "scheduler.memory_mb"
        return "scheduler.memory_fraction" if self.memory_fraction is not None else \
            f"the default memory_fraction {DEFAULT_MEMORY_FRACTION}"


class NodePolicy(_Strict):
    """One node of a cluster (``homeai node join --name NAME``), by name."""

    models: list[Annotated[str, Field(min_length=1)]] = Field(
        min_length=1, description="the LLMs this node's replica serves (overrides the node's --models)")


class ClusterPolicy(_Strict):
    """Which LLMs run where when the front door runs a cluster (``homeai serve --cluster``); without this
    section every node serves the models it names at join, or every LLM of the policy."""

    nodes: dict[str, NodePolicy] = Field(default_factory=dict, description="by node name (local: the front "
                                         "door's own device, which serves every LLM and is not configured here)")
    replicas: dict[str, Annotated[int, Field(ge=1)]] = Field(
        default_factory=dict, description="at most this many node replicas of an LLM (besides the front door's "
        "own device), given to nodes in the order they join; default: every node that serves it")


class Policy(_Strict):
    """A whole policy file. Immutable: a new policy is swapped in, never edited in place."""

    version: int = Field(1, ge=1, description="file format version")
    classes: dict[Name, ClassPolicy] = Field(min_length=1)
    users: dict[Name, UserPolicy] = Field(default_factory=dict)
    aliases: dict[str, AliasPolicy] = Field(default_factory=dict)
    scheduler: GlobalLimits = Field(default_factory=GlobalLimits)
    models: dict[str, ModelPolicy] = Field(default_factory=dict, description="residency of the LLMs by name")
    cluster: ClusterPolicy = Field(default_factory=ClusterPolicy, description="which LLMs run on which nodes")

    @model_validator(mode="after")
    def _cross_check(self) -> Policy:
        problems: list[tuple[tuple[str | int, ...], str, object]] = []
        llms = {c.model for c in self.classes.values() if c.kind == "llm"}
        for nname, node in self.cluster.nodes.items():
            for i, mname in enumerate(node.models):
                if mname not in llms:
                    msg = f"no llm class names model {mname!r} (llm models: {', '.join(sorted(llms)) or 'none'})"
                    problems.append((("cluster", "nodes", nname, "models", i), msg, mname))
        for mname in self.cluster.replicas:
            if mname not in llms:
                msg = f"no llm class names model {mname!r} (llm models: {', '.join(sorted(llms)) or 'none'})"
                problems.append((("cluster", "replicas", mname), msg, mname))
        for mname in self.models:
            if mname not in llms:
                msg = f"no llm class names model {mname!r} (llm models: {', '.join(sorted(llms)) or 'none'})"
                problems.append((("models", mname), msg, mname))
        for uname, user in self.users.items():
            for i, cname in enumerate(user.allowed_classes):
                if cname != "*" and cname not in self.classes:
                    problems.append((("users", uname, "allowed_classes", i), _no_class(cname, self), cname))
            if user.default_class is not None:
                loc: tuple[str | int, ...] = ("users", uname, "default_class")
                if user.default_class not in self.classes:
                    problems.append((loc, _no_class(user.default_class, self), user.default_class))
                elif not user.allows(user.default_class):
                    problems.append((loc, "is not in allowed_classes", user.default_class))
        for aname, alias in self.aliases.items():
            cls = self.classes.get(alias.class_name)
            if cls is None:
                problems.append((("aliases", aname, "class"), _no_class(alias.class_name, self),
                                 alias.class_name))
            elif alias.model is not None and alias.model != cls.model:
                msg = f"class {alias.class_name!r} serves model {cls.model!r}, not {alias.model!r}"
                problems.append((("aliases", aname, "model"), msg, alias.model))
        total = sum(c.min_share for c in self.classes.values())
        if total > 1.0 + 1e-9:
            problems.append((("classes",), f"min_share of all classes adds up to {total:g} > 1", total))
        background = {n: c.min_share for n, c in self.classes.items() if c.background and c.min_share > 0}
        if sum(background.values()) > MAX_BACKGROUND_SHARE + 1e-9:
            msg = (f"min_share of the background classes adds up to {sum(background.values()):g} > "
                   f"{MAX_BACKGROUND_SHARE:g}: interactive work keeps at least half of every step, or a "
                   f"voice request waits behind the shares")
            problems += [(("classes", n, "min_share"), msg, share) for n, share in background.items()]
        _fail("Policy", problems)
        return self

    def alias_class(self, model_name: str) -> str | None:
        """The class a model alias routes to, if the name is an alias."""
        alias = self.aliases.get(model_name)
        return alias.class_name if alias is not None else None

    def model_policy(self, name: str) -> ModelPolicy:
        """How the LLM ``name`` stays on the device (the defaults when the policy does not say)."""
        return self.models.get(name) or ModelPolicy()

    def llm_models(self) -> list[str]:
        """The LLMs the classes name, the most important class's first."""
        ordered = sorted((c.priority + (1000 if c.background else 0), c.model)
                         for c in self.classes.values() if c.kind == "llm")
        return list(dict.fromkeys(model for _, model in ordered))

    def user(self, name: str) -> UserPolicy:
        """A user's policy; unknown users get the ``default`` user's, else the built-in defaults."""
        return self.users.get(name) or self.users.get("default") or UserPolicy()


def _no_class(name: str, policy: Policy) -> str:
    return f"no class named {name!r} (classes: {', '.join(sorted(policy.classes))})"


SCHEMA_MODELS: tuple[type[BaseModel], ...] = (
    Policy, ClassPolicy, QueuePolicy, Fairness, Targets, UserPolicy, AliasPolicy, GlobalLimits, ModelPolicy,
)
