"""Policies the repository or the device's memory cannot serve, refused where they are made: PUT
/admin/policy and /admin/policy/validate answer 422 naming ``classes.<name>.model`` (a model not pulled,
models that do not fit the memory budget), and a start with such a file serves the last good policy and
says why. The catalog is a fake (no model is loaded): the running gateway registers its own the same way.
"""

from __future__ import annotations

from pathlib import Path

from litestar import Litestar
from litestar.testing import AsyncTestClient

from homeai.api.admin_routes import admin_router
from homeai.api.errors import exception_handler
from homeai.api.policy_apply import use_catalog
from homeai.api.policy_startup import PACKAGED_DEFAULT, startup_holder
from homeai.api.services import DEPENDENCIES, Services, app_state
from homeai.api.settings import Settings
from homeai.policy.catalog import CatalogModel, ModelCatalog
from homeai.policy.loader import load_policy
from homeai.policy.store import PolicyHolder
from homeai.store.db import Store

MB = 2**20
DEFAULT_POLICY = Path(__file__).resolve().parents[3] / "policies" / "default.yaml"
DEFAULT_TEXT = DEFAULT_POLICY.read_text(encoding="utf-8")
SMOLLM, MINILM = "smollm2-135m-instruct", "all-minilm-l6-v2"
# chat on a second entry of the same GGUF: served beside voice's model
TWO_LLMS = DEFAULT_TEXT.replace(f"  chat:\n    kind: llm\n    model: {SMOLLM}\n",
                                f"  chat:\n    kind: llm\n    model: {SMOLLM}-f32\n", 1)
CHAT_LINE = 1 + TWO_LLMS.splitlines().index(f"    model: {SMOLLM}-f32")


def catalog(f32_pulled: bool = True, f32_mb: int = 520, memory_mb: int = 8000,
            require_pulled: bool = True) -> ModelCatalog:
    models = {SMOLLM: CatalogModel(SMOLLM, "llm", True, 97 * MB),
              f"{SMOLLM}-f32": CatalogModel(f"{SMOLLM}-f32", "llm", f32_pulled, f32_mb * MB if f32_pulled else None),
              MINILM: CatalogModel(MINILM, "embedding", True, 87 * MB)}
    return ModelCatalog(models, memory_mb * MB, 256, require_pulled)


def app_with(holder: PolicyHolder, store: Store, data_dir: Path) -> Litestar:
    services = Services(Settings(data_dir=data_dir), holder, store=store)
    return Litestar(route_handlers=[admin_router], state=app_state(services), dependencies=DEPENDENCIES,
                    exception_handlers={Exception: exception_handler})


async def test_put_and_validate_refuse_a_model_not_pulled_and_models_that_do_not_fit(store: Store,
                                                                                     tmp_path: Path) -> None:
    holder = PolicyHolder(load_policy(DEFAULT_POLICY))
    current = {"catalog": catalog(f32_pulled=False)}
    use_catalog(holder, lambda: current["catalog"])
    async with AsyncTestClient(app=app_with(holder, store, tmp_path)) as client:
        for path in ("/admin/policy/validate", "/admin/policy"):
            r = await client.request("POST" if path.endswith("validate") else "PUT", path, content=TWO_LLMS)
            assert r.status_code == 422, r.text
            [error] = r.json()["error"]["errors"]
            assert error["path"] == "classes.chat.model" and error["line"] == CHAT_LINE
            assert "not pulled" in error["message"] and f"homeai pull {SMOLLM}-f32" in error["message"]
        current["catalog"] = catalog(memory_mb=1000)  # 97 + 256 + 87, then 520 + 256 more: 1216 MB > 800 MB
        r = await client.put("/admin/policy", content=TWO_LLMS)
        assert r.status_code == 422, r.text
        [error] = r.json()["error"]["errors"]
        assert error["path"] == "classes.chat.model"
        assert "does not fit" in error["message"] and "the memory budget is 800 MB" in error["message"]
        assert holder.version == 1  # nothing changed
        current["catalog"] = catalog()
        assert (await client.put("/admin/policy", content=TWO_LLMS)).status_code == 200
        assert holder.current.llm_models() == [SMOLLM, f"{SMOLLM}-f32"]


def test_a_start_with_a_file_that_cannot_fit_runs_the_default_and_says_why(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(TWO_LLMS, encoding="utf-8")
    holder, refusal = startup_holder(path, catalog(memory_mb=1000, require_pulled=False))
    assert refusal is not None and refusal.running == PACKAGED_DEFAULT
    assert refusal.errors[0][0] == "classes.chat.model" and "does not fit" in refusal.reason
    assert holder.current.llm_models() == [SMOLLM]
    holder, refusal = startup_holder(path, catalog(f32_pulled=False, require_pulled=False))
    assert refusal is None  # a start pulls what the policy names before it loads it
