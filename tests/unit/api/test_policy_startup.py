"""An invalid policy.yaml in the data directory no longer stops the server from starting.

The start-up path is exercised as ``create_app`` and ``store_lifespan`` run it (``startup_holder``, then
``fall_back_to_stored`` on the open store), and /readyz and /v1/stats are read from the real routers.
Item 8's ``classes.<name>.model`` report is here too: it is the check that start-up and every apply run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from homeai.api.observability_routes import observability_router
from homeai.api.policy_apply import apply_policy_text, repository_models, running_text
from homeai.api.policy_startup import PACKAGED_DEFAULT, PolicyRefusal, fall_back_to_stored, startup_holder
from homeai.api.services import DEPENDENCIES, Services, app_state
from homeai.api.settings import DEFAULT_POLICY, Settings
from homeai.policy.loader import PolicyError, parse_policy
from homeai.policy.store import PolicyHolder
from homeai.store.db import Store

DEFAULT_TEXT = DEFAULT_POLICY.read_text(encoding="utf-8")
BATCH_8 = DEFAULT_TEXT.replace("    max_batch_size: 16\n", "    max_batch_size: 8\n", 1)
INVALID = DEFAULT_TEXT.replace("      max_queue_size: 16 ", "      max_queue_size: -1 ", 1)


@dataclass
class StartedGateway:
    started_s: float = 1.0
    loop: object = field(default_factory=object)  # a started gateway has its device loop

    def engine_health(self) -> dict[str, Any]:
        return {"failing": False}

    def snapshot(self) -> dict[str, Any]:
        return {"classes": {}, "device": {}}


def ready_app(holder: PolicyHolder, store: Store, refusal: PolicyRefusal, data_dir: Path) -> Litestar:
    services = Services(Settings(data_dir=data_dir), holder, policy_refusal=refusal, store=store,
                        gateway=StartedGateway())
    return Litestar(route_handlers=[observability_router], state=app_state(services), dependencies=DEPENDENCIES)


def test_fixtures_differ_as_intended() -> None:
    assert BATCH_8 != DEFAULT_TEXT and INVALID != DEFAULT_TEXT
    with pytest.raises(PolicyError):
        parse_policy(INVALID)


def test_a_valid_file_starts_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(BATCH_8, encoding="utf-8")
    holder, refusal = startup_holder(path)
    assert refusal is None and holder.current.classes["chat"].max_batch_size == 8
    assert running_text(holder) == BATCH_8


async def test_invalid_file_falls_back_to_the_last_valid_stored_version(tmp_path: Path, store: Store) -> None:
    await store.policy_versions.record(DEFAULT_TEXT, "startup")
    await store.policy_versions.record(BATCH_8, "dad")
    await store.policy_versions.record(INVALID, "an older schema")  # stored, no longer valid: skipped
    path = tmp_path / "policy.yaml"
    path.write_text(INVALID, encoding="utf-8")
    holder, refusal = startup_holder(path)
    assert refusal is not None and refusal.running == PACKAGED_DEFAULT
    assert [p for p, _ in refusal.errors] == ["classes.voice.default_queue_policy.max_queue_size"]
    await fall_back_to_stored(holder, store, refusal)
    assert refusal.running == "stored policy version 2" and refusal.is_current(holder)
    assert holder.current.classes["chat"].max_batch_size == 8 and running_text(holder) == BATCH_8
    async with AsyncTestClient(app=ready_app(holder, store, refusal, tmp_path)) as client:
        r = await client.get("/readyz")
        assert r.status_code == 200 and r.json()["status"] == "degraded"
        assert "max_queue_size" in r.json()["reason"] and "stored policy version 2" in r.json()["reason"]
        stats = (await client.get("/v1/stats")).json()
        assert stats["policy"]["status"] == "fallback" and stats["policy"]["file"] == str(path)
        # a valid policy applied later (a fixed file, a PUT, a rollback) ends the degraded state
        await apply_policy_text(holder, store, DEFAULT_TEXT, "dad")
        assert (await client.get("/readyz")).json()["status"] == "ready"
        assert (await client.get("/v1/stats")).json()["policy"] == {"status": "ok"}


async def test_unreadable_file_and_empty_store_run_the_packaged_default(tmp_path: Path, store: Store) -> None:
    path = tmp_path / "policy.yaml"
    path.write_bytes(b"\xff\xfe not utf-8")
    holder, refusal = startup_holder(path)
    assert refusal is not None
    await fall_back_to_stored(holder, store, refusal)
    assert refusal.running == PACKAGED_DEFAULT and running_text(holder) == DEFAULT_TEXT
    holder2, refusal2 = startup_holder(tmp_path / "missing.yaml")
    assert refusal2 is not None and "cannot read file" in refusal2.reason
    assert running_text(holder2) == DEFAULT_TEXT


def test_a_class_naming_an_unknown_model_is_reported_at_the_class() -> None:
    known = repository_models()
    assert known is not None and "smollm2-135m-instruct" in known
    text = DEFAULT_TEXT.replace("model: smollm2-135m-instruct", "model: no-such-model", 1)
    with pytest.raises(PolicyError) as err:
        parse_policy(text, "p.yaml", known)
    assert [p for p, _ in err.value.errors] == ["classes.voice.model"]
    assert "no-such-model" in err.value.errors[0][1] and "model repository" in err.value.errors[0][1]
    with pytest.raises(PolicyError) as both:  # other errors are still reported next to it
        parse_policy(text.replace("      max_queue_size: 16 ", "      max_queue_size: -1 ", 1), "p.yaml", known)
    assert [p for p, _ in both.value.errors] == ["classes.voice.model",
                                                 "classes.voice.default_queue_policy.max_queue_size"]


async def test_readyz_gives_its_reasons_only_to_a_caller_who_may_read_statistics(tmp_path: Path,
                                                                                  store: Store) -> None:
    """/readyz is public: on a keyed server a stranger read the policy file's path, its errors (which quote
    household user names), the engine's last error and the models. Found by a security review."""
    path = tmp_path / "policy.yaml"
    path.write_text(INVALID, encoding="utf-8")
    holder, refusal = startup_holder(path)
    assert refusal is not None
    await fall_back_to_stored(holder, store, refusal)
    await store.keys.create("root", is_admin=True)
    grafana, _ = await store.keys.create("grafana", scopes=["metrics"])
    async with AsyncTestClient(app=ready_app(holder, store, refusal, tmp_path)) as client:
        r = await client.get("/readyz")
        assert r.status_code == 200 and r.json() == {"status": "degraded", "store": "ok"}
        r = await client.get("/readyz", headers={"Authorization": "Bearer not-a-key"})
        assert r.json() == {"status": "degraded", "store": "ok"}
        r = await client.get("/readyz", headers={"Authorization": f"Bearer {grafana}"})
        assert "max_queue_size" in r.json()["reason"] and r.json()["policy"]["file"] == str(path)
