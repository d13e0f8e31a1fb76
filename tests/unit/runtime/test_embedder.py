"""The embedder against sentence-transformers, and its batching invariants (sorting, padding, order)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from homeai.runtime.embedder import Embedder

pytestmark = pytest.mark.slow

MODEL = "all-minilm-l6-v2"

TEXTS = [
    "Turn off the kitchen lights.",
    "",
    "What's the weather like tomorrow morning in Seoul, and should I bring an umbrella to work?",
    "hi",
    " ".join(["The household server batches embedding requests from many clients."] * 6),
    "Remind me to water the plants.",
    "Dynamic batching trades a little queueing delay for much higher accelerator throughput.",
]


@pytest.fixture(scope="module")
def folder(pulled_models: dict[str, Path]) -> Path:
    return pulled_models[MODEL]


@pytest.fixture(scope="module")
def embedder(folder: Path) -> Embedder:
    return Embedder.load(folder, torch.device("cpu"))


def _cosines(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cosine_similarity(a, b, dim=1)


def test_shape_dtype_and_unit_norm(embedder: Embedder) -> None:
    vectors = embedder.embed(TEXTS)
    assert embedder.dim == 384 and embedder.max_length == 256
    assert vectors.shape == (len(TEXTS), 384)
    assert vectors.dtype == torch.float32 and vectors.device.type == "cpu"
    torch.testing.assert_close(vectors.norm(dim=1), torch.ones(len(TEXTS)), atol=1e-5, rtol=0)


def test_batch_equals_one_at_a_time(embedder: Embedder) -> None:
    batched = embedder.embed(TEXTS)
    single = torch.cat([embedder.embed([t]) for t in TEXTS])
    assert bool((_cosines(batched, single) >= 0.9999).all())


def test_small_sub_batches_keep_order(embedder: Embedder) -> None:
    """Length sorting splits the batch across sub-batches; every row must come back where it went in."""
    reference = embedder.embed(TEXTS)
    for batch_size in (1, 2, 3):
        assert bool((_cosines(embedder.embed(TEXTS, batch_size=batch_size), reference) >= 0.9999).all())
    shuffled = [TEXTS[i] for i in (4, 0, 6, 1, 3, 5, 2)]
    expected = reference[[4, 0, 6, 1, 3, 5, 2]]
    assert bool((_cosines(embedder.embed(shuffled, batch_size=2), expected) >= 0.9999).all())


def test_matches_sentence_transformers(folder: Path, embedder: Embedder) -> None:
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(folder), device="cpu")
    expected = torch.from_numpy(reference.encode(TEXTS, normalize_embeddings=True))
    assert bool((_cosines(embedder.embed(TEXTS), expected) >= 0.9999).all())


def test_token_arrays_equal_text_input(embedder: Embedder) -> None:
    ids = embedder.tokenize(TEXTS)
    assert all(
        x[0] == embedder.tokenizer.cls_token_id and x[-1] == embedder.tokenizer.sep_token_id for x in ids
    )
    torch.testing.assert_close(embedder.embed(token_ids=ids), embedder.embed(TEXTS))


def test_truncation(embedder: Embedder) -> None:
    long_text = "household " * 1000
    assert embedder.count_tokens([long_text, "hi", ""]) == [256, 3, 2]
    ids = embedder.tokenize([long_text])[0]
    assert len(ids) == 256 and ids[-1] == embedder.tokenizer.sep_token_id
    longer = embedder.embed([long_text + "and much more text at the end"])
    torch.testing.assert_close(embedder.embed([long_text]), longer)


def test_max_length_override(folder: Path) -> None:
    short = Embedder.load(folder, torch.device("cpu"), max_length=16)
    assert short.max_length == 16 and short.count_tokens(["word " * 100]) == [16]
    with pytest.raises(ValueError, match="max_length"):
        Embedder.load(folder, torch.device("cpu"), max_length=10_000)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "exactly one"),
        ({"texts": ["a"], "token_ids": [[101, 102]]}, "exactly one"),
        ({"texts": []}, "non-empty"),
        ({"token_ids": []}, "non-empty"),
        ({"texts": ["a", 3]}, "strings"),
        ({"token_ids": [[101, 102], []]}, "empty"),
        ({"token_ids": [[101, 10**6, 102]]}, r"\[0, 30522\)"),
        ({"token_ids": [[101, -1, 102]]}, r"\[0, 30522\)"),
        ({"token_ids": [list(range(300))]}, "max_length"),
        ({"token_ids": [101, 102]}, "list of lists"),
        ({"texts": ["a"], "batch_size": 0}, "batch_size"),
    ],
)
def test_bad_input_raises(embedder: Embedder, kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        embedder.embed(**kwargs)


def test_cut_and_uncut_tokenizing_from_many_threads_at_once(embedder: Embedder) -> None:
    """The serving path tokenizes cut (``tokenize``) and uncut (``tokenize(truncate=False)``, to refuse long inputs)
    from worker threads; a shared fast tokenizer raised "Already borrowed" then (found by the soak)."""
    long_text = ["the kitchen garden needs water every morning " * 40] * 4
    errors: list[BaseException] = []

    def hammer(cut: bool) -> None:
        for _ in range(100):
            try:
                if cut:
                    assert all(len(ids) == embedder.max_length for ids in embedder.tokenize(long_text))
                else:
                    assert all(len(ids) > embedder.max_length for ids in embedder.tokenize(long_text, truncate=False))
            except BaseException as exc:  # collected: an exception in a thread would not fail the test
                errors.append(exc)

    threads = [threading.Thread(target=hammer, args=(i % 2 == 0,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_bf16_close_to_fp32(folder: Path, embedder: Embedder) -> None:
    """Half precision on the accelerator should keep vectors close (checked on CPU, where bf16 runs)."""
    half = Embedder.load(folder, torch.device("cpu"), dtype=torch.bfloat16)
    vectors = half.embed(TEXTS)
    assert vectors.dtype == torch.float32
    assert bool((_cosines(vectors, embedder.embed(TEXTS)) >= 0.99).all())


@pytest.mark.gpu
def test_cuda_fp16_matches_cpu(folder: Path, embedder: Embedder) -> None:
    gpu = Embedder.load(folder, torch.device("cuda"), dtype=torch.float16)
    assert bool((_cosines(gpu.embed(TEXTS, batch_size=3), embedder.embed(TEXTS)) >= 0.999).all())


def test_refuses_a_model_type_it_does_not_run(tmp_path: Path) -> None:
    folder = tmp_path / "some-roberta"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "roberta", "architectures": ["RobertaModel"]}))
    with pytest.raises(ValueError, match=r"some-roberta.*'roberta'.*RobertaModel"):
        Embedder.load(folder, torch.device("cpu"))


def test_import_leaves_transformers_modeling_out() -> None:
    """transformers' modeling stack (AutoModel, PreTrainedModel) costs ~100 MB resident for the server's life.
    (transformers.modeling_gguf_pytorch_utils is the fast tokenizer's GGUF reader, not a model.)"""
    code = (
        "import sys, homeai.runtime.embedder; "
        "print(sorted(m for m in sys.modules if m.startswith(('transformers.modeling_utils', 'transformers.models.'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


async def test_a_short_query_never_waits_on_the_event_loop_for_the_tokenizer(embedder: Embedder) -> None:
    """Another thread (an indexing batch, a 2,048-input request) holds the tokenizer; a search query's
    tokenization must not block the event loop on it. Before: the query tokenized inline and waited on the
    lock (1.58 s behind 2,048 long texts), and every stream, voice included, stopped meanwhile."""
    import asyncio

    from homeai.api.embedding_admission import embedding_rows

    held, release = threading.Event(), threading.Event()
    outcome: list[bool] = []

    def hold() -> None:
        with embedder._tokenizer_lock:
            held.set()
            outcome.append(release.wait(10.0))  # False: the loop never came back to release it

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()
    query = asyncio.ensure_future(embedding_rows(embedder, ["kitchen lights"], True, embedder.max_length))
    await asyncio.sleep(0.01)  # the loop runs on while the query waits for the tokenizer
    release.set()
    rows = await query
    holder.join()
    assert outcome == [True]
    assert rows == embedder.tokenize(["kitchen lights"])
    assert embedder.tokenize_if_free(["kitchen lights"]) == rows  # free again: here, at once
