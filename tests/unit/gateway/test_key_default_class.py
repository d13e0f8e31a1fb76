"""An API key's default class routes the requests of its kind where no header names a class. Merged into the
header's place, a class a policy change removed failed every request of the key with "unknown class"
naming a header the client never sent, and a voice key's /v1/embeddings asked voice for vectors."""

from __future__ import annotations

from pathlib import Path

from homeai.api.routing import RequestContext, route_request
from homeai.gateway.gateway import Gateway
from homeai.policy.loader import load_policy
from homeai.policy.store import PolicyHolder

DEFAULT_POLICY = Path(__file__).resolve().parents[3] / "policies" / "default.yaml"


def ctx(key_class: str | None) -> RequestContext:
    return RequestContext(user="default", class_name=None, priority_level=None, timeout_us=None,
                          key_class=key_class)


def test_a_keys_class_routes_its_kind_and_a_removed_one_falls_back_to_the_users_default() -> None:
    policy = load_policy(DEFAULT_POLICY)
    gateway = Gateway(PolicyHolder(policy))
    assert route_request(gateway, None, ctx("voice"), "llm").class_name == "voice"
    assert route_request(gateway, None, ctx("voice"), "embedding").class_name == "embedding"
    renamed = policy.model_copy(update={
        "classes": {("assistant" if k == "chat" else k): v for k, v in policy.classes.items()},
        "aliases": {k: a for k, a in policy.aliases.items() if a.class_name != "chat"},
        "users": {**policy.users, "default": policy.users["default"].model_copy(
            update={"default_class": "assistant"})}})
    gateway.policy_holder.swap(renamed)
    assert route_request(gateway, None, ctx("chat"), "llm").class_name == "assistant"
