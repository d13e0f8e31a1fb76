"""How a node tells the front door what it offers, in Ray's own terms: custom resources.

``homeai node join --device cuda:0 --models a,b`` starts Ray on the node with the resources
``homeai_device`` (one replica fits), ``homeai.device/cuda:0`` and ``homeai.model/a``, ``homeai.model/b``,
and the label ``homeai-node=<name>``. Resources rather than labels because label values cannot hold a
model's name (dots, colons); both are what ``ray.nodes()`` reports, so the front door needs no side channel.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

REPLICA_RESOURCE = "homeai_device"
DEVICE_PREFIX = "homeai.device/"
MODEL_PREFIX = "homeai.model/"
NAME_LABEL = "homeai-node"


@dataclass(frozen=True, slots=True)
class NodeSpec:
    node_id: str
    name: str
    address: str
    device: str
    models: tuple[str, ...]  # empty: every LLM model of the policy


def node_resources(device: str, models: list[str]) -> dict[str, float]:
    return {REPLICA_RESOURCE: 1.0, f"{DEVICE_PREFIX}{device}": 1.0, **{f"{MODEL_PREFIX}{m}": 1.0 for m in models}}


def label_value(name: str) -> str:
    """A node name as a Ray label value holds it (letters, digits, ``-_.``; at most 63)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", name).strip("-_.")[:63] or "node"


def spec_of(node: Mapping[str, Any]) -> NodeSpec | None:
    """The node as ``ray.nodes()`` reports it; None for a node that offers no replica (the front door's)."""
    resources: Mapping[str, float] = node.get("Resources") or {}
    if not resources.get(REPLICA_RESOURCE):
        return None
    device = next((k.removeprefix(DEVICE_PREFIX) for k in resources if k.startswith(DEVICE_PREFIX)), "cpu")
    models = tuple(sorted(k.removeprefix(MODEL_PREFIX) for k in resources if k.startswith(MODEL_PREFIX)))
    labels: Mapping[str, str] = node.get("Labels") or {}
    node_id = str(node.get("NodeID", ""))
    return NodeSpec(node_id, labels.get(NAME_LABEL) or node_id[:8], str(node.get("NodeManagerAddress", "")),
                    device, models)
