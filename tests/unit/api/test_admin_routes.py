"""Admin, auth, observability routes and the policy watcher, on a tiny app around the routers.

A real Store on tmp SQLite, a real PolicyHolder, a fake gateway with ``snapshot()``: no model.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from waiting import DEFAULT_TIMEOUT_S, await_until

from homeai.api import policy_watcher
from homeai.api.admin_routes import admin_router
from homeai.api.app import protection
from homeai.api.drain import Drain
from homeai.api.errors import exception_handler
from homeai.api.observability_routes import _stats_events, observability_router
from homeai.api.policy_apply import apply_policy_text, running_text
from homeai.api.policy_startup import startup_holder
from homeai.api.policy_watcher import check_policy_file, start_policy_watcher
from homeai.api.services import DEPENDENCIES, Services, app_state, services_of
from homeai.api.settings import Settings
from homeai.policy.loader import load_policy
from homeai.policy.store import PolicyHolder
from homeai.store.db import Store

DEFAULT_POLICY = Path(__file__).resolve().parents[3] / "policies" / "default.yaml"
DEFAULT_TEXT = DEFAULT_POLICY.read_text(encoding="utf-8")


@dataclass
class FakeGateway:
    started_s: float = 1.0
    loop: object = field(default_factory=object)  # a started gateway has its device loop

    def engine_health(self) -> dict[str, Any]:
        return {"failing": False}

    def snapshot(self) -> dict[str, Any]:
        return {"classes": {"chat": {"queued": 2, "running": 1, "depth_by_level": {1: 2},
                                     "fairness": {"alice": 40.0, "bob": 10.0}}},
                "device": {"smollm2": {"kv_usage": 0.125, "kv_blocks": 64, "steps": 9, "preemptions": 0,
                                       "last_batch_tokens": 12, "last_batch_seqs": 3}}}

    def served_models(self) -> list[str]:
        return ["smollm2"]


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(DEFAULT_TEXT, encoding="utf-8")
    return path


@pytest.fixture
def holder(policy_file: Path) -> PolicyHolder:
    return PolicyHolder(load_policy(policy_file), source=str(policy_file))


def make_app(holder: PolicyHolder, store: Store, settings: Settings | None = None, **fields: Any) -> Litestar:
    services = Services(settings or Settings(), holder, **{"store": store, "gateway": FakeGateway(),
                                                          "stats_interval_s": 0.01, **fields})
    return Litestar(route_handlers=[admin_router, observability_router], state=app_state(services),
                    dependencies=DEPENDENCIES, exception_handlers={Exception: exception_handler})


@pytest.fixture
async def client(holder: PolicyHolder, store: Store) -> AsyncIterator[AsyncTestClient[Litestar]]:
    async with AsyncTestClient(app=make_app(holder, store)) as c:
        yield c


def with_change(old: str, new: str) -> str:
    assert old in DEFAULT_TEXT
    return DEFAULT_TEXT.replace(old, new, 1)


CHAT_BATCH_32 = with_change("    max_batch_size: 16\n", "    max_batch_size: 32\n")
VOICE_QUEUE_BAD = with_change("      max_queue_size: 16 ", "      max_queue_size: -1 ")


def line_of(text: str, needle: str) -> int:
    """1-based line of the first line of ``text`` containing ``needle``."""
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def tab_on_line(text: str, number: int) -> str:
    """``text`` with line ``number`` indented by a tab: a YAML syntax error on that line."""
    lines = text.splitlines(keepends=True)
    lines[number - 1] = "\t" + lines[number - 1].lstrip()
    return "".join(lines)


async def test_get_policy_is_the_file_text(client: AsyncTestClient[Litestar]) -> None:
    r = await client.get("/admin/policy")
    assert r.status_code == 200 and r.text == DEFAULT_TEXT
    assert r.headers["content-type"].startswith("application/yaml")


async def test_invalid_policy_is_422_with_key_path_and_nothing_changes(
        client: AsyncTestClient[Litestar], holder: PolicyHolder, store: Store) -> None:
    before = holder.current
    r = await client.put("/admin/policy", content=VOICE_QUEUE_BAD)
    assert r.status_code == 422
    error = r.json()["error"]
    assert "invalid policy" in error["message"]
    paths = [e["path"] for e in error["errors"]]
    assert "classes.voice.default_queue_policy.max_queue_size" in paths
    assert holder.current is before and holder.version == 1
    assert (await client.get("/admin/policy")).text == DEFAULT_TEXT
    assert await store.policy_versions.count() == 0
    r = await client.put("/admin/policy", content=b"classes: [unclosed")
    assert r.status_code == 422 and "YAML" in r.json()["error"]["errors"][0]["message"]


async def test_put_422_gives_each_error_its_line(client: AsyncTestClient[Litestar], holder: PolicyHolder) -> None:
    """The server knew the lines (PolicyError.lines) and used to drop them from the 422, so the TUI had
    to guess them."""
    r = await client.put("/admin/policy", content=VOICE_QUEUE_BAD)
    assert r.status_code == 422
    assert r.json()["error"]["errors"] == [
        {"path": "classes.voice.default_queue_policy.max_queue_size",
         "message": "Input should be greater than or equal to 0 (got -1)",
         "line": line_of(VOICE_QUEUE_BAD, "max_queue_size: -1")}]
    r = await client.put("/admin/policy", content=tab_on_line(DEFAULT_TEXT, 21))
    assert r.status_code == 422
    [error] = r.json()["error"]["errors"]
    assert (error["path"], error["line"]) == ("", 21) and "line 21" in error["message"]
    r = await client.put("/admin/policy", content=b"")  # a whole-file error without a line
    assert r.status_code == 422 and r.json()["error"]["errors"][0]["line"] is None
    assert holder.version == 1


async def test_validate_is_a_dry_run(holder: PolicyHolder, store: Store, policy_file: Path) -> None:
    """POST /admin/policy/validate: 200 with what applying would change for a valid policy, 422 with each
    error's path, message and line for an invalid one; either way the running policy, its text, the
    history and the policy file stay as they were."""
    before = holder.current

    async def nothing_changed() -> None:
        assert holder.current is before and holder.version == 1
        assert (await c.get("/admin/policy")).text == DEFAULT_TEXT
        assert await store.policy_versions.count() == 0
        assert policy_file.read_text(encoding="utf-8") == DEFAULT_TEXT

    async with AsyncTestClient(app=make_app(holder, store, policy_path=policy_file)) as c:
        r = await c.post("/admin/policy/validate", content=CHAT_BATCH_32, headers={"Content-Type": "application/yaml"})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["valid"] is True and body["changed"] is True
        assert body["diff"] == ["classes.chat.max_batch_size: 16 -> 32"]
        assert {"voice", "chat"} <= set(body["policy"]["classes"])
        await nothing_changed()
        same = (await c.post("/admin/policy/validate", content=DEFAULT_TEXT)).json()
        assert same["valid"] is True and same["changed"] is False and same["diff"] == []

        bad = VOICE_QUEUE_BAD.replace("    max_running: 8 ", "    max_runnin: 8 ", 1)
        r = await c.post("/admin/policy/validate", content=bad, headers={"Content-Type": "text/yaml"})
        assert r.status_code == 422, r.text
        assert {(e["path"], e["line"]) for e in r.json()["error"]["errors"]} == {
            ("classes.voice.default_queue_policy.max_queue_size", line_of(bad, "max_queue_size: -1")),
            ("classes.voice.max_runnin", line_of(bad, "max_runnin: 8"))}
        assert all(e["message"] for e in r.json()["error"]["errors"])
        await nothing_changed()

        r = await c.post("/admin/policy/validate", content=tab_on_line(DEFAULT_TEXT, 21),
                         headers={"Content-Type": "text/plain"})
        assert r.status_code == 422
        assert [(e["path"], e["line"]) for e in r.json()["error"]["errors"]] == [("", 21)]
        assert (await c.post("/admin/policy/validate", content=b"\xff\xfe")).status_code == 400
        await nothing_changed()


async def test_validate_takes_yaml_and_needs_an_admin(holder: PolicyHolder, store: Store, tmp_path: Path) -> None:
    """Behind the app's own guards, as served: PUT's YAML types, and an admin key once keys exist."""
    settings = Settings(data_dir=tmp_path, job_roots=(tmp_path,), allowed_hosts=(), origins=())
    services = Services(settings, holder, store=store, drain=Drain(30.0))
    app = Litestar(route_handlers=[admin_router], **protection(settings), state=app_state(services),
                   dependencies=DEPENDENCIES)
    async with AsyncTestClient(app=app, base_url="http://127.0.0.1:8000") as c:
        for headers in ({"Content-Type": "application/yaml"}, {"Content-Type": "text/yaml; charset=utf-8"},
                        {"Content-Type": "text/plain"}, {}):
            r = await c.post("/admin/policy/validate", content=CHAT_BATCH_32, headers=headers)
            assert r.status_code == 200, (headers, r.text)
        r = await c.post("/admin/policy/validate", content=CHAT_BATCH_32,
                         headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert r.status_code == 415
        admin_key, _ = await store.keys.create("dad", is_admin=True)
        user_key, _ = await store.keys.create("kid-tablet", user="kids", default_class="voice")
        assert (await c.post("/admin/policy/validate", content=CHAT_BATCH_32)).status_code == 401
        r = await c.post("/admin/policy/validate", content=CHAT_BATCH_32,
                         headers={"Authorization": f"Bearer {user_key}"})
        assert r.status_code == 403
        r = await c.post("/admin/policy/validate", content=CHAT_BATCH_32,
                         headers={"Authorization": f"Bearer {admin_key}"})
        assert r.status_code == 200 and r.json()["diff"] == ["classes.chat.max_batch_size: 16 -> 32"]
    assert holder.version == 1 and await store.policy_versions.count() == 0


async def test_put_applies_records_and_rolls_back(client: AsyncTestClient[Litestar], holder: PolicyHolder) -> None:
    r = await client.put("/admin/policy", content=CHAT_BATCH_32)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["changed"] and body["diff"] == ["classes.chat.max_batch_size: 16 -> 32"]
    assert holder.current.classes["chat"].max_batch_size == 32 and holder.version == 2
    assert (await client.get("/admin/policy")).text == CHAT_BATCH_32
    history = (await client.get("/admin/policy/history")).json()
    assert [v["version"] for v in history["versions"]] == [2, 1] and history["current"] == 2
    assert history["versions"][0]["applied_by"] == "anonymous"
    assert history["versions"][1]["applied_by"] == "system"  # the running policy before the change
    one = (await client.get("/admin/policy/history/1")).json()
    assert one["yaml"] == DEFAULT_TEXT
    # the same text again changes nothing
    again = (await client.put("/admin/policy", content=CHAT_BATCH_32)).json()
    assert not again["changed"] and holder.version == 2
    # rollback without a body: the previous version
    r = await client.post("/admin/policy/rollback")
    assert r.status_code == 200, r.text
    assert r.json()["rolled_back_to"] == 1 and r.json()["diff"] == ["classes.chat.max_batch_size: 32 -> 16"]
    assert holder.current.classes["chat"].max_batch_size == 16
    assert (await client.get("/admin/policy")).text == DEFAULT_TEXT
    # rollback to a named version
    r = await client.post("/admin/policy/rollback", json={"version": 2})
    assert r.status_code == 200 and holder.current.classes["chat"].max_batch_size == 32
    history = (await client.get("/admin/policy/history", params={"limit": 10})).json()
    assert [v["version"] for v in history["versions"]] == [4, 3, 2, 1]
    assert history["versions"][0]["note"] == "rollback to 2"


async def test_rollback_errors(client: AsyncTestClient[Litestar]) -> None:
    assert (await client.post("/admin/policy/rollback")).status_code == 409  # only the startup version
    assert (await client.post("/admin/policy/rollback", json={"version": 99})).status_code == 404
    assert (await client.post("/admin/policy/rollback", json={"version": "x"})).status_code == 400
    assert (await client.post("/admin/policy/rollback", content=b"{nope")).status_code == 400
    assert (await client.post("/admin/policy/rollback", json={"version": 10**30})).status_code == 400
    assert (await client.get("/admin/policy/history/99")).status_code == 404
    assert (await client.get(f"/admin/policy/history/{10**30}")).status_code == 400


async def test_a_class_naming_an_unknown_model_is_reported_at_the_class(
        client: AsyncTestClient[Litestar], holder: PolicyHolder) -> None:
    """This used to be reported at ``aliases.voice.model`` (the alias pinned the old model)."""
    text = DEFAULT_TEXT.replace("model: smollm2-135m-instruct", "model: no-such-model", 1)
    r = await client.put("/admin/policy", content=text)
    assert r.status_code == 422, r.text
    assert [e["path"] for e in r.json()["error"]["errors"]] == ["classes.voice.model"]
    assert holder.version == 1


async def test_rollback_honours_the_version_query(client: AsyncTestClient[Litestar], holder: PolicyHolder) -> None:
    """``?version=999`` once rolled back one version (the query was ignored); now it names the target."""
    assert (await client.put("/admin/policy", content=CHAT_BATCH_32)).status_code == 200
    assert (await client.put("/admin/policy", content=DEFAULT_TEXT)).status_code == 200  # versions 1, 2, 3
    r = await client.post("/admin/policy/rollback", params={"version": 999})
    assert r.status_code == 404 and "999" in r.json()["error"]["message"]
    assert holder.current.classes["chat"].max_batch_size == 16 and holder.version == 3  # nothing changed
    for bad in ("x", "0", str(10**30)):
        assert (await client.post("/admin/policy/rollback", params={"version": bad})).status_code == 400, bad
    r = await client.post("/admin/policy/rollback", params={"version": 2}, json={"version": 1})
    assert r.status_code == 400
    r = await client.post("/admin/policy/rollback", params={"version": 2})
    assert r.status_code == 200 and r.json()["rolled_back_to"] == 2  # not the previous one (3)
    assert holder.current.classes["chat"].max_batch_size == 32


async def test_admin_needs_an_admin_key_once_keys_exist(client: AsyncTestClient[Litestar], store: Store,
                                                        holder: PolicyHolder) -> None:
    admin_key, _ = await store.keys.create("dad", is_admin=True)
    user_key, _ = await store.keys.create("kid-tablet", user="kids", default_class="voice")
    assert (await client.get("/admin/policy")).status_code == 401
    assert (await client.get("/admin/policy", headers={"Authorization": "Bearer hai_wrong"})).status_code == 401
    r = await client.put("/admin/policy", content=CHAT_BATCH_32, headers={"Authorization": f"Bearer {user_key}"})
    assert r.status_code == 403 and holder.version == 1
    r = await client.put("/admin/policy", content=CHAT_BATCH_32, headers={"X-API-Key": admin_key})
    assert r.status_code == 200 and holder.version == 2
    history = (await client.get("/admin/policy/history", headers={"Authorization": f"Bearer {admin_key}"})).json()
    assert history["versions"][0]["applied_by"] == "dad"
    await store.keys.revoke("dad")
    await store.keys.revoke("kid-tablet")
    assert (await client.get("/admin/policy")).status_code == 200  # no keys left: open again on loopback


async def test_non_loopback_bind_requires_a_key(holder: PolicyHolder, store: Store) -> None:
    async with AsyncTestClient(app=make_app(holder, store, Settings(host="0.0.0.0"))) as c:
        assert (await c.get("/admin/policy")).status_code == 401
        assert (await c.get("/healthz")).status_code == 200  # health stays open
        key, _ = await store.keys.create("admin", is_admin=True)
        assert (await c.get("/admin/policy", headers={"Authorization": f"Bearer {key}"})).status_code == 200


async def test_applied_policy_is_written_to_policy_path(holder: PolicyHolder, store: Store,
                                                        policy_file: Path) -> None:
    async with AsyncTestClient(app=make_app(holder, store, policy_path=policy_file)) as c:
        r = await c.put("/admin/policy", content=CHAT_BATCH_32)
        assert r.json()["written_to"] == str(policy_file)
    assert policy_file.read_text(encoding="utf-8") == CHAT_BATCH_32
    assert await check_policy_file(holder, policy_file, store) is None  # the watcher sees nothing new


async def test_putting_the_running_text_ends_a_fallback_and_mends_the_file(store: Store, tmp_path: Path) -> None:
    """Started on an invalid policy file, the server runs its fallback and says degraded. Putting back the
    text it runs (GET, then PUT) was a no-op: still degraded, and the invalid file stayed for the next start."""
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text("classes: [not, a, mapping\n", encoding="utf-8")
    holder, refusal = startup_holder(policy_file)
    assert refusal is not None
    app = make_app(holder, store, policy_path=policy_file, policy_refusal=refusal)
    async with AsyncTestClient(app=app) as client:
        assert (await client.get("/readyz")).json()["status"] == "degraded"
        running = (await client.get("/admin/policy")).text
        r = await client.put("/admin/policy", content=running.encode(), headers={"Content-Type": "application/yaml"})
        assert r.status_code == 200 and r.json()["written_to"] == str(policy_file), r.text
        assert (await client.get("/readyz")).json()["status"] == "ready"
        assert (await client.get("/v1/stats")).json()["policy"]["status"] == "ok"
    assert policy_file.read_text(encoding="utf-8") == running


async def test_a_reload_read_before_an_admin_write_does_not_undo_it(holder: PolicyHolder, store: Store,
                                                                   policy_file: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen in the TUI test: PUT B, then a rollback to A while the watcher's poll read the file still holding
    B; the reload waited for the lock the rollback held and then applied B over it."""
    await apply_policy_text(holder, store, CHAT_BATCH_32, "admin", persist_to=policy_file)  # file and policy: B
    recording, release = asyncio.Event(), asyncio.Event()
    record = store.policy_versions.record

    async def slow_record(*args: Any, **kwargs: Any) -> Any:  # the rollback, inside the lock, before its write
        recording.set()
        await release.wait()
        return await record(*args, **kwargs)

    monkeypatch.setattr(store.policy_versions, "record", slow_record)
    rollback = asyncio.create_task(apply_policy_text(holder, store, DEFAULT_TEXT, "admin", persist_to=policy_file))
    await recording.wait()
    assert running_text(holder) == DEFAULT_TEXT and policy_file.read_text(encoding="utf-8") == CHAT_BATCH_32
    reload = asyncio.create_task(check_policy_file(holder, policy_file, store))  # reads B, waits for the lock
    await asyncio.sleep(0.05)
    release.set()
    assert (await rollback).changed
    assert await reload is None  # the file holds A again: nothing to apply
    assert running_text(holder) == DEFAULT_TEXT and policy_file.read_text(encoding="utf-8") == DEFAULT_TEXT


async def test_metrics_stats_health(client: AsyncTestClient[Litestar], store: Store) -> None:
    recorder = services_of(client.app).metrics
    recorder.request_started("r1", "llm", "chat", "alice", "smollm2", 5)
    recorder.tokens("r1", 1)
    recorder.finished("r1", "ok", 1)
    recorder.rejected("voice", "queue_full")
    text = (await client.get("/metrics")).text
    assert 'homeai_requests_total{class_name="chat",status="ok"} 1.0' in text
    assert 'homeai_waiting{class_name="chat"} 2.0' in text
    assert 'homeai_kv_cache_usage_ratio{model="smollm2"} 0.125' in text
    stats = (await client.get("/v1/stats")).json()
    assert stats["classes"]["chat"]["queued"] == 2 and stats["classes"]["chat"]["running"] == 1
    assert stats["classes"]["voice"]["rejections"] == {"queue_full": 1}
    assert stats["classes"]["voice"]["targets"] == {"ttft_ms": 300.0, "itl_ms": 100.0}
    assert stats["users"]["alice"]["fairness"] == {"chat": 40.0}
    assert stats["device"]["smollm2"]["kv_usage"] == 0.125
    assert stats["recent"][0]["request_id"] == "r1"
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    ready = await client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    await store.close()
    assert (await client.get("/readyz")).json()["status"] == "degraded"


async def test_readyz_before_start(holder: PolicyHolder, store: Store) -> None:
    async with AsyncTestClient(app=make_app(holder, store, gateway=FakeGateway(started_s=0.0))) as c:
        r = await c.get("/readyz")
        assert r.status_code == 503 and r.json()["status"] == "starting"


async def test_stats_stream_events(client: AsyncTestClient[Litestar]) -> None:
    events = _stats_events(services_of(client.app), 0.01)
    first, second = await anext(events), await anext(events)
    await events.aclose()
    assert first.event == "stats" and "classes" in json.loads(str(second.data))
    r = await client.get("/v1/stats/stream", params={"count": 3})  # the test transport reads to the end
    assert r.headers["content-type"].startswith("text/event-stream")
    data = [json.loads(line[len("data: "):]) for line in r.text.splitlines() if line.startswith("data: ")]
    assert len(data) == 3 and all("classes" in d for d in data)
    assert r.text.count("event: stats") == 3


@asynccontextmanager
async def watching(holder: PolicyHolder, path: Path, store: Store | None,
                   **timing: float) -> AsyncIterator[asyncio.Task[None]]:
    """The file watcher for the length of the block, cancelled (and seen cancelled) after it."""
    task = start_policy_watcher(holder, path, store, **timing)
    try:
        yield task
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def edit(path: Path, text: str) -> None:
    """Replace the file at once (no half-written state to see) with a later mtime than the last: the
    watcher sees exactly one change, whatever the clock's granularity (these texts have the same size)."""
    before = path.stat()
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(text, encoding="utf-8")
    os.utime(partial, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000))
    partial.replace(path)


async def test_watcher_refuses_invalid_then_applies_valid(holder: PolicyHolder, store: Store, policy_file: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    checked: asyncio.Queue[bool | None] = asyncio.Queue()  # the watcher's verdict on each change it saw

    async def recording_check(*args: Any, **kwargs: Any) -> bool | None:
        verdict = await check_policy_file(*args, **kwargs)
        checked.put_nowait(verdict)
        return verdict

    monkeypatch.setattr(policy_watcher, "check_policy_file", recording_check)
    async with watching(holder, policy_file, store, interval_s=0.02) as task:
        await asyncio.sleep(0)  # one loop turn: the watcher has taken the file's first signature
        edit(policy_file, VOICE_QUEUE_BAD)
        assert await asyncio.wait_for(checked.get(), DEFAULT_TIMEOUT_S) is False  # seen, and refused
        assert holder.version == 1 and running_text(holder) == DEFAULT_TEXT
        edit(policy_file, CHAT_BATCH_32)
        assert await asyncio.wait_for(checked.get(), DEFAULT_TIMEOUT_S) is True
        assert holder.version == 2 and checked.empty()
        assert holder.current.classes["chat"].max_batch_size == 32
        assert running_text(holder) == CHAT_BATCH_32
        versions = await store.policy_versions.history()
        assert [v.applied_by for v in versions] == ["file", "system"]
        assert not task.done()


async def test_a_file_refused_for_a_model_not_pulled_applies_once_it_is(tmp_path: Path,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    """The watcher checked a file again only when it changed: refused because its model was not pulled, it
    stayed refused after the pull, while the file and the running policy disagreed (a restart switched)."""
    from homeai.api.policy_apply import remember_text, use_catalog
    from homeai.policy.catalog import CatalogModel, ModelCatalog
    from homeai.policy.loader import parse_policy

    before, after = "classes:\n  chat: {kind: llm, model: m}\n", "classes:\n  chat: {kind: llm, model: big}\n"
    path = tmp_path / "policy.yaml"
    path.write_text(before)
    holder = PolicyHolder(parse_policy(before), source=str(path))
    remember_text(holder, before)
    pulled = {"big": False}
    use_catalog(holder, lambda: ModelCatalog({"m": CatalogModel("m", "llm", True, 1),
                                              "big": CatalogModel("big", "llm", pulled["big"], 1)}))
    async with watching(holder, path, None, interval_s=0.01, retry_s=0.05):
        await asyncio.sleep(0)
        edit(path, after)
        await await_until(lambda: "refused" in caplog.text)
        await asyncio.sleep(0.2)  # checked again a few times: still refused, and quietly
        refusals = [r for r in caplog.records if r.getMessage().startswith("policy file change refused")]
        assert holder.current.classes["chat"].model == "m" and len(refusals) == 1
        pulled["big"] = True  # the user does what the message said: `homeai pull big`
        await await_until(lambda: holder.current.classes["chat"].model == "big")


async def test_a_file_written_in_pieces_is_applied_whole_not_its_first_half(tmp_path: Path) -> None:
    """An editor that truncates the file and writes it in two pieces: the first piece, cut at a line break,
    is valid YAML without the classes after the cut, and the watcher applied it (indexing, summarize, every
    user and alias removed; their queued requests rejected) before the whole file came."""
    path = tmp_path / "policy.yaml"
    path.write_text(DEFAULT_TEXT, encoding="utf-8")
    holder = PolicyHolder(load_policy(path), source=str(path))
    swaps: list[list[str]] = []
    holder.subscribe(lambda p, _v: swaps.append(sorted(p.classes)))
    edited = DEFAULT_TEXT.replace("max_queue_size: 16", "max_queue_size: 32")
    cut = edited.index("  # Background document indexing")
    async with watching(holder, path, None, interval_s=0.02, settle_s=0.3):
        await asyncio.sleep(0.05)
        with path.open("w", encoding="utf-8") as f:
            f.write(edited[:cut])
            f.flush()
            await asyncio.sleep(0.15)  # a few polls see the first piece alone
            f.write(edited[cut:])
        await await_until(lambda: holder.current.classes["voice"].default_queue_policy.max_queue_size == 32)
        assert swaps == [sorted(load_policy(DEFAULT_POLICY).classes)]  # one swap: the whole file


async def test_a_file_that_could_not_be_read_is_read_again_without_an_edit(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A file replaced with permissions the server's account cannot read (`sudo mv` of a 0600 file) and then
    made readable (`chmod`, which changes neither its mtime nor its size) stayed unread until the next edit."""
    path = tmp_path / "policy.yaml"
    path.write_text(DEFAULT_TEXT, encoding="utf-8")
    holder = PolicyHolder(load_policy(path), source=str(path))
    readable = {"now": False}
    read_text = Path.read_text

    def guarded(self: Path, *args: Any, **kwargs: Any) -> str:
        if self == path and not readable["now"]:
            raise PermissionError(13, "Permission denied")
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", guarded)
    async with watching(holder, path, None, interval_s=0.01, retry_s=0.05, settle_s=0.02):
        await asyncio.sleep(0.03)
        edit(path, DEFAULT_TEXT.replace("max_queue_size: 16", "max_queue_size: 32"))
        await asyncio.sleep(0.2)  # seen, and could not be read
        assert holder.current.classes["voice"].default_queue_policy.max_queue_size == 16
        readable["now"] = True  # chmod 644: no edit
        await await_until(lambda: holder.current.classes["voice"].default_queue_policy.max_queue_size == 32)


async def test_a_put_made_on_an_older_policy_is_refused_not_undoing_the_change_between(
        holder: PolicyHolder, store: Store, policy_file: Path) -> None:
    """The TUI loaded the policy, the file was edited (or another admin applied), then Ctrl+S put the TUI's
    older text: the edit in between was silently undone and the file overwritten. With the ETag GET gave as
    If-Match, that PUT is a 412 and nothing changes."""
    app = make_app(holder, store, policy_path=policy_file)
    async with AsyncTestClient(app=app) as client:
        loaded = await client.get("/admin/policy")
        etag = loaded.headers["ETag"]
        assert etag == '"1"'
        file_edit = with_change("max_queue_size: 16", "max_queue_size: 32")
        edit(policy_file, file_edit)
        assert await check_policy_file(holder, policy_file, store) is True  # the watcher applied it: swap 2
        r = await client.put("/admin/policy", content=CHAT_BATCH_32, headers={"If-Match": etag})
        assert r.status_code == 412 and r.json()["error"]["code"] == "policy_changed" and r.headers["ETag"] == '"2"'
        assert "changed since it was read" in r.json()["error"]["message"]
        assert policy_file.read_text(encoding="utf-8") == file_edit and holder.version == 2
        r = await client.put("/admin/policy", content=CHAT_BATCH_32, headers={"If-Match": "W/\"nope\""})
        assert r.status_code == 400 and r.json()["error"]["param"] == "If-Match"
        fresh = await client.get("/admin/policy")
        r = await client.put("/admin/policy", content=with_change("max_batch_size: 16", "max_batch_size: 32")
                             .replace("max_queue_size: 16", "max_queue_size: 32"),
                             headers={"If-Match": fresh.headers["ETag"]})
        assert r.status_code == 200 and r.headers["ETag"] == '"3"'
        assert holder.current.classes["voice"].default_queue_policy.max_queue_size == 32  # the file's edit kept
