"""Our BERT encoder against transformers' BertModel: the real MiniLM, both checkpoint key layouts, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import BertConfig as HFBertConfig
from transformers import BertForMaskedLM, BertModel

from homeai.runtime.bert import BertEncoder

PADDED_BATCH = [
    "hi",
    "Turn off the kitchen lights, and the hallway ones too, before everyone goes to bed tonight.",
    "When is the dentist?",
]


def _tiny_config(hidden_act: str = "gelu") -> HFBertConfig:
    return HFBertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=64, hidden_act=hidden_act, layer_norm_eps=1e-7)


def _padded_ids(vocab_size: int, lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1, vocab_size, (len(lengths), max(lengths)), generator=gen)
    mask = (torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]).long()
    return ids * mask, mask


def _assert_same_on_real_tokens(ours: torch.Tensor, reference: torch.Tensor, mask: torch.Tensor) -> None:
    """Padded positions are never pooled, so only real tokens must agree."""
    real = mask.bool()
    torch.testing.assert_close(ours[real], reference[real], atol=1e-5, rtol=0)


@pytest.mark.slow
def test_minilm_last_hidden_states_match_transformers(pulled_models: dict[str, Path]) -> None:
    from homeai.runtime.fast_tokenizer import load_fast_tokenizer

    folder = pulled_models["all-minilm-l6-v2"]
    encoded = load_fast_tokenizer(folder)(PADDED_BATCH, padding=True, return_tensors="pt")
    ids, mask = encoded["input_ids"], encoded["attention_mask"]
    assert len(set(mask.sum(1).tolist())) == len(PADDED_BATCH)  # every item padded differently
    reference = BertModel.from_pretrained(folder).eval()
    ours = BertEncoder.from_folder(folder, torch.device("cpu"))
    with torch.inference_mode():
        expected = reference(input_ids=ids, attention_mask=mask).last_hidden_state
        got = ours(ids, mask)
    assert got.shape == expected.shape == (len(PADDED_BATCH), ids.shape[1], 384)
    _assert_same_on_real_tokens(got, expected, mask)


@pytest.mark.parametrize("hidden_act", ["gelu", "gelu_new", "relu"])
@pytest.mark.parametrize("checkpoint", [BertModel, BertForMaskedLM], ids=["plain-keys", "bert-prefixed-keys"])
def test_tiny_random_bert_matches_transformers(tmp_path: Path, checkpoint: type, hidden_act: str) -> None:
    """BertModel saves ``embeddings.*``, BertForMaskedLM ``bert.embeddings.*`` (plus head tensors we skip)."""
    torch.manual_seed(0)
    saved = checkpoint(_tiny_config(hidden_act)).eval()
    saved.save_pretrained(tmp_path, safe_serialization=True)
    reference = saved if isinstance(saved, BertModel) else saved.bert
    ids, mask = _padded_ids(99, [5, 17, 1, 9])
    ours = BertEncoder.from_folder(tmp_path, torch.device("cpu"))
    with torch.inference_mode():
        expected = reference(input_ids=ids, attention_mask=mask).last_hidden_state
        _assert_same_on_real_tokens(ours(ids, mask), expected, mask)
        full = torch.ones_like(mask)  # no padding: None and an all-ones mask are the same forward
        torch.testing.assert_close(ours(ids, None), ours(ids, full), atol=0, rtol=0)


def _write_config(folder: Path, **changes: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config = _tiny_config().to_dict() | changes
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"model_type": "roberta", "architectures": ["RobertaModel"]}, r"not-bert.*'roberta'.*RobertaModel"),
        ({"model_type": "distilbert"}, r"not-bert.*'distilbert'"),
        ({"position_embedding_type": "relative_key"}, "relative_key"),
        ({"hidden_act": "quick_gelu"}, "quick_gelu"),
    ],
)
def test_refuses_what_it_does_not_run(tmp_path: Path, changes: dict, match: str) -> None:
    folder = _write_config(tmp_path / "not-bert", **changes)
    with pytest.raises(ValueError, match=match):
        BertEncoder.from_folder(folder, torch.device("cpu"))


def test_refuses_missing_and_misshapen_weights(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = BertModel(_tiny_config())
    tensors = {k: v.contiguous() for k, v in model.state_dict().items()}
    folder = _write_config(tmp_path / "partial")
    with pytest.raises(FileNotFoundError, match="safetensors"):
        BertEncoder.from_folder(folder, torch.device("cpu"))
    save_file({k: v for k, v in tensors.items() if "layer.1.output.dense" not in k}, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match=r"partial.*encoder\.layer\.1\.output\.dense\.weight"):
        BertEncoder.from_folder(folder, torch.device("cpu"))
    tensors["encoder.layer.0.intermediate.dense.bias"] = torch.zeros(5)
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match=r"intermediate\.dense\.bias has shape \(5,\)"):
        BertEncoder.from_folder(folder, torch.device("cpu"))
