"""A request routed to a class that a policy change removes while it awaits (an on-demand model's load, its
tokenizer, its grammar) gets a 400 naming the change; the admission read the class by name and answered a
500 ``KeyError``."""

from __future__ import annotations

from pathlib import Path

import pytest

from homeai.api.errors import to_api_error
from homeai.core.types import SamplingParams
from homeai.gateway.gateway import Gateway, Route
from homeai.policy.loader import load_policy
from homeai.policy.store import PolicyHolder
from homeai.scheduling.class_scheduler import UnknownClassError

DEFAULT_POLICY = Path(__file__).resolve().parents[3] / "policies" / "default.yaml"


def test_a_class_removed_after_routing_is_a_400_naming_the_change() -> None:
    policy = load_policy(DEFAULT_POLICY)
    gateway = Gateway(PolicyHolder(policy))
    route = Route(model="smollm2-135m-instruct", class_name="chat")
    params = SamplingParams(max_tokens=5000)
    gateway.apply_class_limits(route, [1, 2, 3], params)
    assert params.max_tokens == policy.classes["chat"].max_output_tokens
    without_chat = policy.model_copy(update={"classes": {k: v for k, v in policy.classes.items() if k != "chat"},
                                             "aliases": {}})
    gateway.policy_holder.swap(without_chat)
    with pytest.raises(UnknownClassError) as removed:
        gateway.apply_class_limits(route, [1, 2, 3], SamplingParams())
    answer = to_api_error(removed.value)
    assert answer.status_code == 400 and "removed by a policy change" in answer.message
