"""JSON Schema shape, diff, key paths; the store's atomic swap and refusing reloads; the CLI."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from homeai.cli.policy_cmds import main as policy_main
from homeai.policy.loader import PolicyError, diff_policies, key_path, load_policy, parse_policy, policy_json_schema
from homeai.policy.schema import Policy
from homeai.policy.store import PolicyHolder

DEFAULT = Path(__file__).resolve().parents[3] / "policies" / "default.yaml"


def _resolve(schema: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in schema:
        return root["$defs"][schema["$ref"].split("/")[-1]]
    objects = [s for s in schema.get("anyOf", []) if "$ref" in s or s.get("type") == "object"]
    return _resolve(objects[0], root) if objects else schema


def _check(data: Any, schema: dict[str, Any], root: dict[str, Any], path: str) -> None:
    """A small structural check: every key of the file is described by the schema."""
    schema = _resolve(schema, root)
    if not isinstance(data, dict):
        return
    props = schema.get("properties")
    if props is not None:
        assert schema.get("additionalProperties") is False, path
        for key, value in data.items():
            assert key in props, f"{path}.{key} is not in the schema"
            _check(value, props[key], root, f"{path}.{key}")
    elif isinstance(schema.get("additionalProperties"), dict):
        for key, value in data.items():
            _check(value, schema["additionalProperties"], root, f"{path}.{key}")


def test_json_schema_has_a_valid_shape_and_describes_default_yaml() -> None:
    schema = policy_json_schema()
    json.loads(json.dumps(schema))  # plain JSON
    assert schema["$schema"].startswith("https://json-schema.org/")
    assert schema["type"] == "object" and schema["additionalProperties"] is False
    assert {"version", "classes", "users", "aliases", "scheduler"} <= set(schema["properties"])
    assert schema["required"] == ["classes"]
    for name, sub in schema["$defs"].items():
        assert sub["type"] == "object" and sub["additionalProperties"] is False, name
    queue = schema["$defs"]["QueuePolicy"]["properties"]
    assert queue["timeout_action"]["enum"] == ["REJECT", "DELAY"]
    assert "class" in schema["$defs"]["AliasPolicy"]["properties"]
    _check(json.loads(json.dumps(yaml.safe_load(DEFAULT.read_text()))), schema, schema, "")


def test_diff_lists_changed_added_and_removed_key_paths() -> None:
    a = load_policy(DEFAULT)
    text = DEFAULT.read_text().replace("max_queue_delay_microseconds: 0 ", "max_queue_delay_microseconds: 3000 ", 1)
    text = text.replace("  chat: {class: chat}", "  helper: {class: chat}")
    text = text.replace("users:\n", "users:\n  carol: {weight: 3.0}\n", 1)
    b = parse_policy(text)
    assert diff_policies(a, b) == [
        "classes.voice.max_queue_delay_microseconds: 0 -> 3000",
        "users.carol: added",
        "aliases.chat: removed",
        "aliases.helper: added",
    ]
    assert diff_policies(a, a) == []


def test_key_path_formats_list_indices_and_numeric_mapping_keys() -> None:
    data = {"classes": {"v": {"preferred_batch_size": [1, 2], "priority_queue_policy": {2: {}}}}}
    assert key_path(("classes", "v", "preferred_batch_size", 1), data) == "classes.v.preferred_batch_size[1]"
    assert key_path(("classes", "v", "priority_queue_policy", 2, "x"), data) == (
        "classes.v.priority_queue_policy.2.x"
    )


def small(delay_us: int) -> Policy:
    return Policy.model_validate(
        {"classes": {"c": {"kind": "llm", "model": "m", "max_queue_delay_microseconds": delay_us}}}
    )


def test_holder_swaps_atomically_and_notifies_in_order() -> None:
    holder = PolicyHolder(small(1), source="a.yaml")
    seen: list[tuple[int, int]] = []
    unsubscribe = holder.subscribe(lambda p, v: seen.append((v, p.classes["c"].max_queue_delay_microseconds)))
    holder.subscribe(lambda p, v: 1 / 0)  # a broken listener does not stop the swap or the others
    assert holder.swap(small(2)) == 2
    assert holder.current.classes["c"].max_queue_delay_microseconds == 2 and holder.version == 2
    unsubscribe()
    holder.swap(small(3))
    assert seen == [(2, 2)]
    with pytest.raises(TypeError):
        holder.swap({"classes": {}})  # type: ignore[arg-type]


def test_concurrent_swaps_are_serialized_and_counted() -> None:
    holder = PolicyHolder(small(0))
    versions: list[int] = []
    holder.subscribe(lambda p, v: versions.append(v))
    policies = [small(i) for i in range(1, 5)]

    def swapper(p: Policy) -> None:
        for _ in range(100):
            holder.swap(p)

    threads = [threading.Thread(target=swapper, args=(p,)) for p in policies]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert holder.version == 401 and versions == list(range(2, 402))
    assert holder.current in policies


def test_cli_validate_schema_and_diff(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert policy_main(["policy", "validate", str(DEFAULT)]) == 0
    assert "ok (5 classes" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text("classes:\n  voice: {kind: llm, model: m, max_batch_size: 0}\n")
    assert policy_main(["policy", "validate", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "bad.yaml" in err and "classes.voice.max_batch_size" in err
    assert policy_main(["policy", "schema"]) == 0
    assert json.loads(capsys.readouterr().out)["title"] == "HomeAI policy"
    other = tmp_path / "other.yaml"
    other.write_text(DEFAULT.read_text().replace("max_num_seqs: 64", "max_num_seqs: 32"))
    assert policy_main(["policy", "diff", str(DEFAULT), str(other)]) == 0
    assert capsys.readouterr().out.strip() == "scheduler.max_num_seqs: 64 -> 32"
    assert policy_main(["policy", "diff", str(DEFAULT), str(bad)]) == 1


def test_llm_classes_may_name_several_llms_of_the_repository() -> None:
    """Several LLMs share the device (each with its own KV cache and class scheduler, one batcher)."""
    text = ("classes:\n"
            "  voice: {kind: llm, model: small, priority: 0}\n"
            "  chat: {kind: llm, model: large, priority: 1}\n"
            "  search: {kind: embedding, model: encoder, priority: 1}\n")
    policy = parse_policy(text, known_models={"small", "large", "encoder"})
    assert {c.model for c in policy.classes.values() if c.kind == "llm"} == {"small", "large"}


def with_changes(**classes: dict[str, Any]) -> str:
    data = yaml.safe_load(DEFAULT.read_text())
    for name, fields in classes.items():
        data["classes"][name].update(fields)
    return yaml.safe_dump(data)


@pytest.mark.parametrize(("fields", "where"), [
    ({"targets": {"ttft_ms": float("inf"), "itl_ms": 100}}, "classes.voice.targets.ttft_ms"),  # a 500 for every step
    ({"latency_margin": float("nan")}, "classes.voice.latency_margin"),
    ({"priority_levels": 1_000_000}, "classes.voice.priority_levels"),  # seconds and gigabytes to build
])
def test_values_that_validated_and_then_broke_the_server_are_refused_naming_the_key(fields: dict[str, Any],
                                                                                    where: str) -> None:
    with pytest.raises(PolicyError) as err:
        parse_policy(with_changes(voice=fields), source="p.yaml")
    assert where in str(err.value), str(err.value)


def test_keep_alive_is_a_finite_time_or_forever() -> None:
    data = yaml.safe_load(DEFAULT.read_text())
    for bad in (".inf", ".nan", "99999999999h"):  # /api/ps turned it into a date: a 500
        data["models"]["smollm2-135m-instruct"] = {"keep_alive": bad}
        with pytest.raises(PolicyError, match="keep_alive"):
            parse_policy(yaml.safe_dump(data).replace(f"'{bad}'", bad), source="p.yaml")


def test_yaml_1_2_floats_are_numbers() -> None:
    """PyYAML reads 5e-2 (no dot) as a string; the strict schema then said "not a number"."""
    policy = parse_policy(DEFAULT.read_text().replace("arrival_step_fraction: 0.05", "arrival_step_fraction: 5e-2"),
                          source="p.yaml")
    assert policy.classes["voice"].arrival_fraction == 0.05


def test_a_file_that_is_not_utf8_is_a_policy_error(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_bytes(b"classes:\n  x: \xff\n")
    with pytest.raises(PolicyError, match="not UTF-8 text: byte 0xff"):
        load_policy(path)
