"""The model pool without a model: fake engines, a hand-moved clock, the device loop's join and leave
played by the test. A load runs on a thread of its own and its waiters share it; a model that does not
fit makes idle, unpinned models leave (least recently used first) and never a pinned or busy one (then
ModelCapacityError names it); keep_alive unloads an idle model, 0 at once, a pinned one never."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any

import pytest
import yaml
from waiting import wait_until

from homeai.engine.errors import ModelCapacityError, ModelLoadError
from homeai.gateway.model_pool import UNLOAD_GRACE_S, ModelPool
from homeai.policy.loader import parse_policy
from homeai.policy.schema import Policy

MB = 2**20


class FakeEngine:
    def __init__(self, name: str) -> None:
        self.name = name
        self.busy = False

    def is_idle(self) -> bool:
        return not self.busy


class Rig:
    """A pool whose loads wait for the test (``release_load``) and whose device loop is the test."""

    def __init__(self, budget_mb: int | None, gate_loads: bool = False) -> None:
        self.now = 100.0
        self.on_device: dict[str, FakeEngine] = {}
        self.freed: list[str] = []
        self.loads: list[str] = []
        self.gate = threading.Event()
        if not gate_loads:
            self.gate.set()
        self.fail: set[str] = set()
        self.pool = ModelPool(budget_mb * MB if budget_mb else None, self.load, self.attach, self.detach, self.free,
                              lambda e: (300 * MB, 100 * MB), fixed_bytes=50 * MB, clock=lambda: self.now)
        self.pool.start()

    def load(self, name: str) -> Any:
        self.gate.wait(10)
        if name in self.fail:
            raise OSError("disk on fire")
        self.loads.append(name)
        return FakeEngine(name)

    def attach(self, name: str, engine: Any) -> Future[bool]:
        self.on_device[name] = engine
        done: Future[bool] = Future()
        done.set_result(True)
        return done

    def detach(self, name: str) -> Future[bool]:
        done: Future[bool] = Future()
        engine = self.on_device.get(name)
        left = engine is not None and engine.is_idle()
        if left:
            del self.on_device[name]
        done.set_result(left)
        return done

    def free(self, engine: Any) -> None:
        self.freed.append(engine.name)

    def configure(self, policy: Policy) -> list[str]:
        return self.pool.configure(policy, {name: 400 * MB for name in policy.llm_models()})

    def later(self, seconds: float) -> None:
        self.now += seconds
        self.pool._wake.set()


def policy(models: dict[str, dict[str, Any]]) -> Policy:
    classes = {f"c{i}": {"kind": "llm", "model": name, "priority": i} for i, name in enumerate(models)}
    return parse_policy(yaml.safe_dump({"classes": classes, "models": models}), "pool-test")


@pytest.fixture
def rig() -> Any:
    rigs: list[Rig] = []

    def make(budget_mb: int | None, gate_loads: bool = False) -> Rig:
        rigs.append(Rig(budget_mb, gate_loads))
        return rigs[-1]

    yield make
    for r in rigs:
        r.gate.set()
        r.pool.stop()


def test_start_loads_pinned_and_start_models_an_on_demand_one_loads_off_the_caller(rig: Any) -> None:
    r = rig(None, gate_loads=True)
    to_load = r.configure(policy({"voice": {"pinned": True}, "chat": {"load": "on_demand"}}))
    assert to_load == ["voice"]
    first = r.pool.acquire("chat")
    second = r.pool.acquire("chat")
    assert second is first and not first.done()  # loading in its own thread; both requests wait for it
    assert r.pool.snapshot()["chat"]["state"] == "loading"
    r.gate.set()
    assert first.result(10).name == "chat" and r.on_device.keys() == {"chat"}
    snap = r.pool.snapshot()["chat"]
    assert snap["loaded"] and snap["resident_bytes"] == 400 * MB and snap["num_loads"] == 1


def test_a_load_makes_idle_unpinned_models_leave_least_recently_used_first(rig: Any) -> None:
    r = rig(1000)  # 50 MB of encoders + two 400 MB models fit, not three
    r.configure(policy({"voice": {"pinned": True}, "chat": {}, "code": {"load": "on_demand"}}))
    r.pool.load_now(["voice", "chat"])
    r.later(UNLOAD_GRACE_S)
    assert r.pool.acquire("code").result(10).name == "code"
    assert r.freed == ["chat"] and r.on_device.keys() == {"voice", "code"}  # voice is pinned: it stayed
    assert r.pool.snapshot()["chat"]["state"] == "unloaded"


def test_a_model_that_cannot_fit_is_refused_naming_it_and_nothing_pinned_or_busy_leaves(rig: Any) -> None:
    r = rig(1000)
    r.configure(policy({"voice": {"pinned": True}, "chat": {}, "code": {"load": "on_demand"}}))
    r.pool.load_now(["voice", "chat"])
    r.later(UNLOAD_GRACE_S)
    r.pool.lease("chat")  # a request streams from chat
    with pytest.raises(ModelCapacityError) as info:
        r.pool.acquire("code")
    assert "'code'" in str(info.value) and "'voice'" in str(info.value) and "'chat'" in str(info.value)
    assert r.freed == [] and r.on_device.keys() == {"voice", "chat"}
    r.pool.release("chat")
    r.later(UNLOAD_GRACE_S)
    r.on_device["chat"].busy = True  # queued work on the device counts as busy too
    with pytest.raises(ModelCapacityError):
        r.pool.acquire("code")


def test_keep_alive_unloads_an_idle_model_and_a_request_loads_it_again(rig: Any) -> None:
    r = rig(None)
    r.configure(policy({"voice": {"pinned": True}, "chat": {"keep_alive": "5m"}}))
    r.pool.load_now(["voice", "chat"])
    r.pool.lease("chat")
    r.later(600)
    r.pool.release("chat")  # its keep_alive counts from the end of its last request
    r.later(299)
    assert r.pool.snapshot()["chat"]["loaded"]
    r.later(2)
    wait_until(lambda: r.freed == ["chat"], what="chat unloaded after its keep_alive")
    assert r.pool.snapshot()["voice"]["loaded"] and r.pool.snapshot()["voice"]["expires_at"] is None
    r.pool.keep_alive("voice", 0, unload_now=True)  # the gateway never sends this for a pinned model; still:
    r.later(1)
    assert r.pool.snapshot()["voice"]["loaded"]
    assert r.pool.acquire("chat").result(10).name == "chat"
    r.pool.keep_alive("chat", 0, unload_now=True)  # Ollama's unload: keep_alive 0 and no prompt
    wait_until(lambda: r.freed == ["chat", "chat"], what="chat unloaded at once")
    assert r.loads == ["voice", "chat", "chat"]


def test_a_failed_load_answers_its_waiters_and_the_next_request_tries_again(rig: Any) -> None:
    r = rig(None)
    r.configure(policy({"chat": {"load": "on_demand"}}))
    r.fail.add("chat")
    with pytest.raises(ModelLoadError, match="disk on fire"):
        r.pool.acquire("chat").result(10)
    assert r.pool.snapshot()["chat"]["last_error"] == "OSError: disk on fire"
    r.fail.clear()
    assert r.pool.acquire("chat").result(10).name == "chat"


def test_a_model_the_policy_no_longer_names_leaves_once_idle(rig: Any) -> None:
    r = rig(None)
    r.configure(policy({"voice": {}, "chat": {}}))
    r.pool.load_now(["voice", "chat"])
    assert r.configure(policy({"voice": {}})) == []
    r.later(UNLOAD_GRACE_S)
    wait_until(lambda: r.freed == ["chat"], what="chat unloaded")


def test_keep_alive_0_from_a_request_keeps_the_model_until_that_request_has_it(rig: Any) -> None:
    """A request's keep_alive 0 makes the model leave once idle, but not between the request's load check
    and its tokenizing (before it holds a lease): the grace after the last routing covers that."""
    r = rig(None)
    r.configure(policy({"chat": {"keep_alive": "5m"}}))
    r.pool.load_now(["chat"])
    r.pool.keep_alive("chat", 0)  # the request routed to it now, with keep_alive 0
    assert r.pool._expired(r.now) == [] and r.pool.snapshot()["chat"]["loaded"]
    r.later(UNLOAD_GRACE_S)  # that request never took its lease (it failed validation, say): now it goes
    wait_until(lambda: r.freed == ["chat"], what="chat unloaded once the grace passed")


def test_a_pinned_model_a_new_policy_drops_leaves_once_idle(rig: Any) -> None:
    """The dropped model kept its old settings, pinned among them: it never left the device and counted
    against the memory budget for good."""
    r = rig(None)
    r.pool.load_now(r.configure(policy({"voice": {"pinned": True}, "chat": {}})))
    assert r.on_device.keys() == {"voice", "chat"}
    r.configure(policy({"chat": {}}))
    assert not r.pool.snapshot()["voice"]["pinned"]
    r.later(UNLOAD_GRACE_S)
    wait_until(lambda: r.freed == ["voice"], what="voice unloaded once idle")
    assert r.on_device.keys() == {"chat"}
