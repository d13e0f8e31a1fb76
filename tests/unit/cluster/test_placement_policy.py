"""The policy's cluster section: which LLMs a node serves and how many replicas a model gets, validated
like the rest of the policy."""

from __future__ import annotations

from collections import Counter

import pytest
import yaml

from homeai.cluster.membership import models_for
from homeai.cluster.node_spec import NodeSpec
from homeai.policy.loader import PolicyError, parse_policy
from homeai.policy.schema import Policy

CLASSES = {"voice": {"kind": "llm", "model": "small", "priority": 0},
           "chat": {"kind": "llm", "model": "large", "priority": 1},
           "embedding": {"kind": "embedding", "model": "minilm", "priority": 2}}


def policy(cluster: dict[str, object] | None = None) -> Policy:
    doc: dict[str, object] = {"classes": CLASSES}
    if cluster is not None:
        doc["cluster"] = cluster
    return parse_policy(yaml.safe_dump(doc), source="test-policy")


def node(name: str, models: tuple[str, ...] = ()) -> NodeSpec:
    return NodeSpec(f"id-{name}", name, "10.0.0.2", "cuda:0", models)


def test_without_a_cluster_section_a_node_serves_what_it_named_or_every_llm() -> None:
    p = policy()
    assert models_for(p, node("nas"), Counter()) == ["small", "large"]
    assert models_for(p, node("nas", ("large", "not-served")), Counter()) == ["large"]


def test_the_policy_names_a_nodes_models_and_caps_replicas() -> None:
    p = policy({"nodes": {"gaming-pc": {"models": ["large"]}}, "replicas": {"small": 1}})
    assert models_for(p, node("gaming-pc", ("small",)), Counter()) == ["large"]  # the policy overrides --models
    assert models_for(p, node("nas"), Counter()) == ["small", "large"]
    assert models_for(p, node("nas"), Counter({"small": 1})) == ["large"]  # small's one replica is taken
    p1 = policy({"replicas": {"small": 1, "large": 1}})
    assert models_for(p1, node("attic"), Counter({"small": 1, "large": 1})) == []  # stands by


def test_a_node_name_with_spaces_matches_its_policy_entry_and_a_typo_stands_by() -> None:
    """Found by a review: ``--name "Gaming PC"`` joins as the label Gaming-PC, so ``cluster.nodes: {"Gaming
    PC": ...}`` never matched; ``--models smolm2`` (a typo) matched nothing and the node served every LLM,
    models it had not pulled included."""
    p = policy({"nodes": {"Gaming PC": {"models": ["large"]}}})
    assert models_for(p, node("Gaming-PC"), Counter()) == ["large"]
    assert models_for(policy(), node("nas", ("smal",)), Counter()) == []  # stands by, with a warning


def test_the_cluster_section_is_validated_with_key_paths() -> None:
    with pytest.raises(PolicyError) as exc:
        policy({"nodes": {"gaming-pc": {"models": ["minilm"]}}, "replicas": {"huge": 2}})
    text = str(exc.value)
    assert "cluster.nodes.gaming-pc.models[0]" in text and "cluster.replicas.huge" in text
    with pytest.raises(PolicyError):
        policy({"replicas": {"small": 0}})
