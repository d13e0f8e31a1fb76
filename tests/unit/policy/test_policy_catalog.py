"""A policy against the model repository and the device's memory (``ModelCatalog``): a class naming a
model of the other kind, one not pulled, or models that cannot fit the memory budget is refused at
``classes.<name>.model``, with the line; ``models:`` (residency) is checked field by field."""

from __future__ import annotations

import pytest

from homeai.policy.catalog import CatalogModel, ModelCatalog
from homeai.policy.durations import describe_keep_alive, parse_keep_alive
from homeai.policy.loader import PolicyError, parse_policy

MB = 2**20
TEXT = """\
classes:
  voice: {kind: llm, model: small, priority: 0}
  chat: {kind: llm, model: large, priority: 1}
  search: {kind: embedding, model: encoder, priority: 1}
scheduler: {memory_mb: 1200}
"""


def catalog(large_mb: int = 300, large_pulled: bool = True, **kw: object) -> ModelCatalog:
    models = {"small": CatalogModel("small", "llm", True, 100 * MB), "mid": CatalogModel("mid", "llm", True, 300 * MB),
              "large": CatalogModel("large", "llm", large_pulled, large_mb * MB if large_pulled else None),
              "encoder": CatalogModel("encoder", "embedding", True, 90 * MB)}
    return ModelCatalog(models, device_memory_bytes=8000 * MB, **{"default_kv_cache_mb": 256, **kw})  # type: ignore[arg-type]


def refused(text: str, cat: ModelCatalog) -> PolicyError:
    with pytest.raises(PolicyError) as info:
        parse_policy(text, "p.yaml", cat)
    return info.value


def test_two_llms_that_fit_pass() -> None:
    policy = parse_policy(TEXT, "p.yaml", catalog())  # (100 + 256) + (300 + 256) + 90 = 1002 MB of 1200
    assert policy.llm_models() == ["small", "large"]


def test_models_that_do_not_fit_the_budget_are_refused_at_the_less_important_class() -> None:
    err = refused(TEXT, catalog(large_mb=500))  # 356 + 90 + 756 > 1200 MB
    assert [path for path, _ in err.errors] == ["classes.chat.model"]
    message = err.errors[0][1]
    assert "'large'" in message and "weights 500 MB + KV 256 MB" in message and "memory_mb" in message
    assert err.lines == {"classes.chat.model": 3}
    smaller_kv = TEXT + "models:\n  large: {kv_cache_mb: 64}\n"
    parse_policy(smaller_kv, "p.yaml", catalog(large_mb=500))  # its own smaller KV cache: it fits


def test_an_on_demand_model_must_fit_beside_the_pinned_ones_only() -> None:
    text = TEXT.replace("  search:", "  code: {kind: llm, model: mid, priority: 2}\n  search:") \
        + "models:\n  small: {pinned: true}\n  large: {load: on_demand, keep_alive: 5m}\n"
    # at start: small, mid and the encoder (1002 MB); large (656 MB) loads in mid's place, beside the pinned
    parse_policy(text, "p.yaml", catalog(large_mb=400))
    err = refused(text, catalog(large_mb=500))  # 356 + 90 + 756 > 1200 MB even beside the pinned alone
    assert [path for path, _ in err.errors] == ["classes.chat.model"]
    assert "pinned" in err.errors[0][1]


def test_a_model_not_pulled_or_of_the_other_kind_is_refused_at_its_class() -> None:
    err = refused(TEXT, catalog(large_pulled=False))
    assert err.errors == [("classes.chat.model", "model 'large' is not pulled: run `homeai pull large` first")]
    parse_policy(TEXT, "p.yaml", catalog(large_pulled=False, require_pulled=False))  # a start pulls it
    err = refused(TEXT.replace("model: encoder", "model: small"), catalog())
    assert [path for path, _ in err.errors] == ["classes.search.model"] and "llm model" in err.errors[0][1]


def test_memory_fraction_of_the_device() -> None:
    text = TEXT.replace("memory_mb: 1200", "memory_fraction: 0.1")  # 800 MB of 8000
    assert [p for p, _ in refused(text, catalog()).errors] == ["classes.chat.model"]
    both = TEXT.replace("memory_mb: 1200", "memory_mb: 1200, memory_fraction: 0.5")
    assert [p for p, _ in refused(both, catalog()).errors] == ["scheduler.memory_mb"]


def test_models_section_fields() -> None:
    text = TEXT + ("models:\n  small: {pinned: true, keep_alive: 5m}\n  large: {keep_alive: soon}\n"
                   "  other: {load: on_demand}\n")
    err = refused(text, catalog())
    assert [p for p, _ in err.errors] == ["models.small.keep_alive", "models.large.keep_alive"]
    err = refused(TEXT + "models:\n  other: {load: on_demand}\n", catalog())
    assert [p for p, _ in err.errors] == ["models.other"] and "no llm class" in err.errors[0][1]
    policy = parse_policy(TEXT + "models:\n  small: {pinned: true}\n  large: {keep_alive: 0}\n", "p.yaml", catalog())
    assert policy.model_policy("small").keep_alive_s is None and policy.model_policy("large").keep_alive_s == 0
    assert policy.model_policy("absent").keep_alive_s is None and policy.model_policy("absent").load == "start"


@pytest.mark.parametrize(("value", "seconds"), [("5m", 300.0), ("1h30m", 5400.0), ("300ms", 0.3), (0, 0.0),
                                                 ("0", 0.0), (-1, None), ("-1m", None), ("90", 90.0), (2.5, 2.5)])
def test_keep_alive_as_ollama_takes_it(value: str | int | float, seconds: float | None) -> None:
    assert parse_keep_alive(value) == seconds


def test_keep_alive_refuses_what_ollama_refuses() -> None:
    for bad in ("soon", "5 minutes", "m5", ""):
        with pytest.raises(ValueError, match="keep_alive"):
            parse_keep_alive(bad)
    assert describe_keep_alive(None) == "forever" and describe_keep_alive(300) == "5m"
