"""Which engine replica serves a request: by class, from what the replicas publish and what was sent them.

Pure (no Ray, no clock): the cluster gateway and the simulator (``homeai bench sim --devices``) place
requests with the same object.

- An interactive class (not ``background``) goes where its first token would come soonest: the
  interactive work already there (queued or prefilling, each costing about a prompt's prefill; running,
  lengthening each step by a row), the replica's fitted step cost, and the part of the prompt it would
  compute, the blocks it already holds of the prompt's prefix left out (Home Assistant resends its
  system prompt every turn). A replica whose KV pool cannot take the prompt is a last resort.
- A background class goes where capacity is idle: fewest live requests per unit of speed, interactive
  work counting far more than background.
- A replica that does not have the model on its device now loads it first: the load's seconds (its last
  load there, else ``UNKNOWN_LOAD_S``) count as waiting, so an idle node beats a front door seconds behind.
- Whatever the class, a replica whose engine keeps failing comes after every other (its requests end at
  once, so it would look the idlest); it is tried only when no other serves the model (it stops counting
  as failing once a step succeeds there, or a minute after its last failure).

The router counts what it placed itself (``dispatched``/``first_token``/``ended``) and reads only costs and
free KV from a replica's published load: every request goes through the one front door, so its own counts
are exact, while a published load is up to half a second old (a burst of voice requests inside it must not
all land on one replica, and a request that ended since must not keep voice away).
Prefix affinity is the router's memory of the block hashes it sent each replica (a bounded LRU), as
SGLang's cache-aware router does, rather than a copy of every replica's cache.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from homeai.core.block_hash import BlockHash, block_hash, root_hash

PREFIX_MEMORY_BLOCKS = 8192  # block hashes remembered per replica (~128k tokens at 16 tokens per block)
INTERACTIVE_WEIGHT = 8.0  # a live interactive request weighs this many background ones when placing background
SAME_CLASS_WEIGHT = 4.0  # ... and one of the same background class this many of another


UNKNOWN_LOAD_S = 10.0  # a model's load on a replica that never loaded it: weights from disk, seconds


@dataclass(slots=True)
class ReplicaLoad:
    """What a replica publishes (every ``load`` poll): enough to predict a first token there."""

    replica_id: str
    node: str = ""
    device: str = "cpu"
    models: tuple[str, ...] = ()  # the LLMs it serves
    loaded: tuple[str, ...] | None = None  # of those, the ones on its device now (None: all of them)
    base_s: float = 0.02  # fitted step cost: a step's fixed time,
    row_s: float = 0.001  # each decode row,
    prompt_token_s: float = 0.001  # each prompt token beyond a row
    free_kv_tokens: int = 1 << 30
    block_size: int = 16
    queued: dict[str, int] = field(default_factory=dict)  # class -> waiting in the replica's queues
    running: dict[str, int] = field(default_factory=dict)  # class -> running sequences
    alive: bool = True
    ready: bool = True
    failing: bool = False  # its engine keeps failing: its requests end at once, so it looks idle
    # model -> {base_s, row_s, prompt_token_s, free_kv_tokens} where it serves several: each model has its
    # own step cost and KV pool (a 135M voice model's step is not an 8B chat model's)
    per_model: dict[str, dict[str, float]] = field(default_factory=dict)
    load_s: dict[str, float] = field(default_factory=dict)  # model -> how long its last load took there

    def for_model(self, model: str) -> ReplicaLoad:
        """This load with ``model``'s own costs and free KV, where it published them."""
        own = self.per_model.get(model)
        if not own:
            return self
        return replace(self, base_s=own["base_s"], row_s=own["row_s"], prompt_token_s=own["prompt_token_s"],
                       free_kv_tokens=int(own["free_kv_tokens"]))


@dataclass(slots=True)
class _Placed:
    """What the router sent a replica and has not seen end, by class: ``waiting`` before its first token."""

    waiting: dict[str, int] = field(default_factory=dict)
    live: dict[str, int] = field(default_factory=dict)
    users: dict[str, int] = field(default_factory=dict)  # live requests by user
    prefixes: OrderedDict[BlockHash, None] = field(default_factory=OrderedDict)


@dataclass(slots=True)
class Placement:
    replica_id: str
    predicted_ttft_s: float
    cached_blocks: int


class NoReplicaError(LookupError):
    """No live replica serves the model (HTTP 503: one may come back)."""


class Router:
    def __init__(self, interactive_classes: Iterable[str] = (), prompt_estimate_tokens: int = 256) -> None:
        self.interactive = set(interactive_classes)
        self.prompt_estimate_tokens = prompt_estimate_tokens  # a waiting request's prefill, when unknown
        self._placed: dict[str, _Placed] = {}
        # replica -> interactive prompt tokens placed, first token not yet seen: the prefills a new interactive
        # request waits behind (a background prompt waits behind it instead, and would count 12 queued
        # 1,500-token summaries as seconds of delay)
        self._waiting_tokens: dict[str, int] = {}
        self._gone: set[str] = set()  # replicas forgotten: a request placed on one as it left adds nothing back

    def set_interactive(self, classes: Iterable[str]) -> None:
        self.interactive = set(classes)

    # ---- placing ---------------------------------------------------------------------------------
    def place(self, class_name: str, model: str, num_prompt_tokens: int, prefix: Sequence[BlockHash],
              replicas: Sequence[ReplicaLoad], exclude: Iterable[str] = (), user: str = "") -> Placement:
        """The replica for one request (raises NoReplicaError when none alive serves ``model``). Between
        replicas that would serve it equally soon, the one with fewest of ``user``'s requests: each user's
        requests spread over the replicas, so every replica's queue holds every busy user and the shared
        VTC counters can order them (a user whose requests all sat on one replica would get that replica
        whatever their weight)."""
        excluded = set(exclude)
        candidates = [r.for_model(model) for r in replicas if r.alive and r.ready and model in r.models
                      and r.replica_id not in excluded]
        if self._gone:  # a replica id published again is back
            self._gone.difference_update(r.replica_id for r in candidates)
        if not candidates:
            raise NoReplicaError(f"no live replica serves {model!r}")
        interactive = class_name in self.interactive
        # "Idle": nothing the router placed there is live. Voice never goes behind background while one is.
        idle_exists = any(not any(self.placed_live(r.replica_id).values()) for r in candidates if not r.failing)
        scored = []
        for r in candidates:
            cached = self.cached_blocks(r.replica_id, prefix)
            compute = max(1, num_prompt_tokens - cached * r.block_size)
            # a replica without the model on its device loads it first: seconds, counted as waiting (not a rank
            # of its own: the front door, which always has it to tokenize, took everything while a node idled)
            load_s = r.load_s.get(model, UNKNOWN_LOAD_S) if r.loaded is not None and model not in r.loaded else 0.0
            ttft = self.predict_ttft_s(r, compute) + load_s
            fits = compute <= r.free_kv_tokens
            if interactive:
                behind_background = idle_exists and self._live_background(r.replica_id) > 0
                key: tuple[float, ...] = (r.failing, not fits, behind_background, ttft, -cached,
                                          self._user_live(r, user))
            else:
                key = (r.failing, not fits, self.idle_score(r, class_name) + load_s, ttft, self._user_live(r, user))
            scored.append((key, r.replica_id, ttft, cached))
        _, rid, ttft, cached = min(scored)
        return Placement(rid, ttft, cached)

    def predict_ttft_s(self, r: ReplicaLoad, prompt_tokens: int) -> float:
        """A new interactive request's first token there: the interactive prefills ahead of it, then its
        own, each step also carrying a row for every running sequence. Counts are the router's own (every
        request goes through it, and it sees each one's first token and end at once); the replica's
        published load gives its costs and free KV."""
        placed = self._placed.get(r.replica_id, _Placed())
        rows = sum(placed.live.values()) - sum(placed.waiting.values())
        ahead_requests = sum(placed.waiting.get(c, 0) for c in self.interactive)
        ahead_tokens = self._waiting_tokens.get(r.replica_id, 0)
        step_s = r.base_s + r.row_s * max(0, rows)
        return (ahead_requests + 1) * step_s + r.prompt_token_s * (ahead_tokens + prompt_tokens)

    def idle_score(self, r: ReplicaLoad, class_name: str = "") -> float:
        """Lower is idler: live requests there (interactive weighted up, and ``class_name``'s own weighted
        up, so each background class spreads evenly rather than one replica taking all the summaries while
        another takes the indexing), per unit of the replica's speed."""
        live = self.placed_live(r.replica_id)
        interactive = sum(live.get(c, 0) for c in self.interactive)
        load = (INTERACTIVE_WEIGHT * interactive + self._live_background(r.replica_id)
                + SAME_CLASS_WEIGHT * live.get(class_name, 0))
        return load * (r.base_s + r.row_s)

    def _user_live(self, r: ReplicaLoad, user: str) -> int:
        placed = self._placed.get(r.replica_id)
        return placed.users.get(user, 0) if placed is not None else 0

    def _live_background(self, replica_id: str) -> int:
        return sum(n for c, n in self.placed_live(replica_id).items() if c not in self.interactive)

    def cached_blocks(self, replica_id: str, prefix: Sequence[BlockHash]) -> int:
        """Leading blocks of ``prefix`` the router sent this replica before (and it may still hold)."""
        placed = self._placed.get(replica_id)
        if placed is None:
            return 0
        n = 0
        for h in prefix:
            if h not in placed.prefixes:
                break
            n += 1
        return n

    # ---- what was placed -------------------------------------------------------------------------
    def dispatched(self, replica_id: str, class_name: str, num_prompt_tokens: int,
                   prefix: Sequence[BlockHash], user: str = "") -> None:
        if replica_id in self._gone:  # it left between the placement and now: its stream fails, nothing to count
            return
        placed = self._placed.setdefault(replica_id, _Placed())
        placed.users[user] = placed.users.get(user, 0) + 1
        placed.waiting[class_name] = placed.waiting.get(class_name, 0) + 1
        placed.live[class_name] = placed.live.get(class_name, 0) + 1
        if class_name in self.interactive:
            self._waiting_tokens[replica_id] = self._waiting_tokens.get(replica_id, 0) + num_prompt_tokens
        for h in prefix:
            placed.prefixes[h] = None
            placed.prefixes.move_to_end(h)
        while len(placed.prefixes) > PREFIX_MEMORY_BLOCKS:
            placed.prefixes.popitem(last=False)

    def first_token(self, replica_id: str, class_name: str, num_prompt_tokens: int) -> None:
        placed = self._placed.get(replica_id)
        if placed is None or placed.waiting.get(class_name, 0) <= 0:
            return
        placed.waiting[class_name] -= 1
        if class_name in self.interactive:
            self._waiting_tokens[replica_id] = max(0, self._waiting_tokens.get(replica_id, 0) - num_prompt_tokens)

    def ended(self, replica_id: str, class_name: str, num_prompt_tokens: int, had_first_token: bool,
              user: str = "") -> None:
        placed = self._placed.get(replica_id)
        if placed is None:
            return
        if not had_first_token:
            self.first_token(replica_id, class_name, num_prompt_tokens)
        placed.live[class_name] = max(0, placed.live.get(class_name, 0) - 1)
        left = placed.users.get(user, 0) - 1
        if left > 0:
            placed.users[user] = left
        else:  # a user with nothing live there is no entry (every name ever seen stayed)
            placed.users.pop(user, None)

    def forget(self, replica_id: str) -> None:
        """A replica that left: its cache is gone with it (one that comes back starts cold)."""
        self._placed.pop(replica_id, None)
        self._waiting_tokens.pop(replica_id, None)
        self._gone.add(replica_id)

    def placed_live(self, replica_id: str) -> dict[str, int]:
        placed = self._placed.get(replica_id)
        return dict(placed.live) if placed else {}


def prompt_prefix(model: str, prompt_ids: Sequence[int], block_size: int = 16) -> list[BlockHash]:
    """The chained hashes of the prompt's full blocks, as a replica's prefix cache names them."""
    chain: list[BlockHash] = []
    parent = root_hash(model)
    for i in range(len(prompt_ids) // block_size):
        parent = block_hash(parent, list(prompt_ids[i * block_size:(i + 1) * block_size]), model)
        chain.append(parent)
    return chain
