"""The random-weight model folder a GPU check serves (``homeai.bench.random_model``): it loads and steps as
a pulled model does, registers through `homeai pull FOLDER`, and its policy keeps the default's LLM classes."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch
import yaml
from safetensors import safe_open

from homeai.api.settings import DEFAULT_POLICY
from homeai.bench.random_model import llm_only_policy, write_random_model
from homeai.bench.serve_bench import serve_arguments
from homeai.bench.speed_bench import RandomWeights, _Stack
from homeai.policy.schema import Policy
from homeai.repository.pull import pull
from homeai.repository.sources import entry_for
from homeai.runtime.llama import LlamaModel
from homeai.runtime.llama_config import LlamaConfig

TINY = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2,
                   num_kv_heads=1, head_dim=32, max_position_embeddings=256, tie_word_embeddings=True)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory, pulled_models: dict[str, Path]) -> Path:
    out = tmp_path_factory.mktemp("random") / "tiny-random"
    return write_random_model(TINY, out, pulled_models["smollm2-135m-instruct"])


def test_the_folder_loads_with_the_shape_and_weights_it_was_given(folder: Path) -> None:
    assert LlamaConfig.from_folder(folder) == TINY
    assert (folder / "tokenizer.json").is_file() and (folder / "tokenizer_config.json").is_file()
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        assert set(f.keys()) == set(RandomWeights(TINY))
        name = "model.layers.1.mlp.down_proj.weight"
        # the speed bench's tensors, stored as bfloat16
        assert torch.equal(f.get_tensor(name), RandomWeights(TINY)[name].to(torch.bfloat16))


def test_the_model_steps_through_a_prompt_and_its_decodes(folder: Path) -> None:
    stack = _Stack(LlamaModel.from_folder(folder, torch.device("cpu"), torch.float32, "none"), 2, 64)
    stack.add(20, 3)
    stack.add(5, 3)
    sampled = 0
    while len(stack.sched.seqs):
        sampled += stack.step()[0]
    assert sampled == 6


def test_pull_registers_the_folder(folder: Path, tmp_path: Path) -> None:
    entry = entry_for(str(folder), name="tiny-random")
    assert entry.source.kind == "hf_folder" and entry.max_model_len == 256
    assert pull(entry, tmp_path, progress=False) == folder


def test_the_policy_keeps_the_default_llm_classes_on_the_model() -> None:
    base = yaml.safe_load(DEFAULT_POLICY.read_text())
    policy = Policy.model_validate(llm_only_policy(base, "tiny-random"))
    llm = {n for n, c in base["classes"].items() if c["kind"] == "llm"}
    assert set(policy.classes) == llm
    assert {c.model for c in policy.classes.values()} == {"tiny-random"}
    assert policy.classes["voice"].targets == Policy.model_validate(base).classes["voice"].targets
    assert all(u.default_class in llm for u in policy.users.values())
    assert set(policy.models) == {"tiny-random"}


def test_bench_serve_passes_policy_and_cache_size_to_the_server(tmp_path: Path) -> None:
    args = argparse.Namespace(policy=Path("p.yaml"), kv_cache_mb=4096)
    assert serve_arguments(args) == ["--policy", str(Path("p.yaml").resolve()), "--kv-cache-mb", "4096"]
    assert serve_arguments(argparse.Namespace(policy=None, kv_cache_mb=None)) == []
