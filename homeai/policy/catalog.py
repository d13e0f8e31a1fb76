"""What a policy is checked against beyond its own fields: the model repository and the device's memory.

A ``ModelCatalog`` (built where torch and the repository are at hand: ``homeai.gateway.footprint``) says
for each model of the repository its kind, whether it is pulled, and how many bytes its weights take as
this device would serve them. ``catalog_problems`` then refuses, at ``classes.<name>.model``:

- a model that is not in the repository, or of the other kind (an embedding model for an LLM class);
- a model that is not pulled (a running server never downloads; ``homeai serve`` pulls at start);
- models that cannot fit the memory budget (``scheduler.memory_mb``, or ``memory_fraction`` of the
  device): those loaded at start (pinned or ``load: start``, and the encoders) together, and each
  on-demand model beside the pinned ones and the encoders (which nothing evicts).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from homeai.policy.schema import Policy

MB = 2**20


@dataclass(frozen=True, slots=True)
class CatalogModel:
    name: str
    kind: str  # "llm" | "embedding"
    pulled: bool
    weights_bytes: int | None  # as served on this device; None: unknown (not pulled)


@dataclass(frozen=True)
class ModelCatalog:
    """The repository's models and the device's memory, as a policy is validated against them. A
    collection of model names, so it stands wherever the names alone would."""

    models: Mapping[str, CatalogModel]
    device_memory_bytes: int | None = None
    default_kv_cache_mb: int = 256
    require_pulled: bool = True
    device: str = "cpu"
    notes: list[str] = field(default_factory=list)

    def __contains__(self, name: object) -> bool:
        return name in self.models

    def __iter__(self) -> Iterator[str]:
        return iter(self.models)

    def __len__(self) -> int:
        return len(self.models)

    def kv_bytes(self, policy: Policy, name: str) -> int:
        mp = policy.models.get(name)
        return ((mp.kv_cache_mb if mp is not None and mp.kv_cache_mb else None) or self.default_kv_cache_mb) * MB

    def footprint_bytes(self, policy: Policy, name: str, kind: str) -> int | None:
        """Weights (and an LLM's KV cache) of ``name`` as ``policy`` would load it; None: unknown."""
        model = self.models.get(name)
        if model is None or model.weights_bytes is None:
            return None
        return model.weights_bytes + (self.kv_bytes(policy, name) if kind == "llm" else 0)


def catalog_problems(policy: Policy, catalog: ModelCatalog) -> dict[str, tuple[str, str]]:
    """class name -> (``classes.<name>.model``, message) for every class whose model the repository, the
    pulled models or the memory budget cannot serve (see the module docstring); the first problem wins."""
    found: dict[str, tuple[str, str]] = {}

    def refuse(model: str, message: str) -> None:
        for cname, cp in policy.classes.items():
            if cp.model == model and cname not in found:
                found[cname] = (f"classes.{cname}.model", message)

    for cname, cp in policy.classes.items():
        entry = catalog.models.get(cp.model)
        if entry is not None and entry.kind != cp.kind:  # not in the repository: the loader reports it
            found[cname] = (f"classes.{cname}.model", f"model {cp.model!r} is an {entry.kind} model; a class of "
                                                      f"kind {cp.kind} cannot serve it")
        elif entry is not None and catalog.require_pulled and not entry.pulled:
            refuse(cp.model, f"model {cp.model!r} is not pulled: run `homeai pull {cp.model}` first")
    models = _models_by_importance(policy)
    budget = policy.scheduler.memory_budget_bytes(catalog.device_memory_bytes)
    if budget is None:
        return found
    where = f"the memory budget is {budget / MB:.0f} MB ({policy.scheduler.describe_budget()})"
    size = {name: catalog.footprint_bytes(policy, name, kind) for name, kind in models}
    fixed = [(n, k) for n, k in models if k == "embedding" or policy.model_policy(n).pinned]
    at_start = [(n, k) for n, k in models if k == "embedding" or policy.model_policy(n).load == "start"]
    held: list[str] = []
    total = 0
    for name, _ in at_start:  # what loads at start, the most important classes' models first
        need = size[name] or 0
        if total + need > budget:
            refuse(name, f"model {name!r} ({_mb(need)}{_parts(catalog, policy, name)}) does not fit beside "
                         f"{_names(held)} ({_mb(total)}) at start: {where}")
            continue
        total += need
        held.append(name)
    fixed_total = sum(size[n] or 0 for n, _ in fixed)
    for name, _ in models:
        if policy.model_policy(name).load != "on_demand":
            continue
        need = size[name] or 0
        if fixed_total + need > budget:
            refuse(name, f"model {name!r} ({_mb(need)}{_parts(catalog, policy, name)}) cannot load beside the "
                         f"pinned models and encoders {_names([n for n, _ in fixed])} ({_mb(fixed_total)}): {where}")
    return found


def _models_by_importance(policy: Policy) -> list[tuple[str, str]]:
    """(model, kind) of every class, the most important class's model first (background after all)."""
    ranked = sorted((c.priority + (1000 if c.background else 0), c.kind, c.model) for c in policy.classes.values())
    out: dict[str, str] = {}
    for _, kind, model in ranked:
        out.setdefault(model, kind)
    return list(out.items())


def _mb(n: int) -> str:
    return f"{n / MB:.0f} MB"


def _names(names: list[str]) -> str:
    return ", ".join(repr(n) for n in names) if names else "nothing"


def _parts(catalog: ModelCatalog, policy: Policy, name: str) -> str:
    model = catalog.models.get(name)
    if model is None or model.weights_bytes is None or model.kind != "llm":
        return ""
    return f": weights {_mb(model.weights_bytes)} + KV {_mb(catalog.kv_bytes(policy, name))}"
