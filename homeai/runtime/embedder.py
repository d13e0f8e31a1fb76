"""BERT-family sentence encoder: one forward per length-sorted sub-batch, mean pooling, L2 norm.

The batcher hands `Embedder.embed` a batch it already formed; this module only makes that batch cheap
to run. Items are sorted by token count (as infinity does) so that each sub-batch is padded to the
length of its own longest item, not of the longest item in the whole request set, and the results are
put back in the caller's order. The tensor path has no per-item Python loop: ids are concatenated once
and scattered into the padded matrix with a mask. The encoder is our own (homeai.runtime.bert), not
transformers' AutoModel, whose modeling imports alone cost ~100 MB resident.
"""

from __future__ import annotations

import itertools
import json
import threading
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerFast

from homeai.runtime.bert import BertEncoder
from homeai.runtime.fast_tokenizer import load_fast_tokenizer

DEFAULT_BATCH_SIZE = 32
_POOLING_MODES = ("mean", "cls")


@dataclass(slots=True)
class _Packed:
    """All items of one embed call as one flat id tensor plus per-item lengths (CPU, int64)."""

    flat_ids: torch.Tensor  # [sum(lengths)]
    lengths: torch.Tensor  # [N]
    offsets: torch.Tensor  # [N] start of each item in flat_ids


class Embedder:
    """A sentence-embedding model loaded from a plain Hugging Face folder (sentence-transformers layout).

    Reads `sentence_bert_config.json` (max_seq_length) and `1_Pooling/config.json` when present, so
    that its vectors match `SentenceTransformer(folder).encode(normalize_embeddings=True)`.
    """

    def __init__(
        self,
        model: BertEncoder,
        tokenizer: PreTrainedTokenizerFast,
        device: torch.device,
        max_length: int,
        pooling: str = "mean",
    ) -> None:
        if pooling not in _POOLING_MODES:
            raise ValueError(f"pooling must be one of {_POOLING_MODES}, got {pooling!r}")
        self.model = model
        self.tokenizer = tokenizer
        # A fast tokenizer is reconfigured (truncation on/off) by each call and is not safe to share
        # between threads ("Already borrowed"): callers tokenize from worker threads, so one at a time.
        self._tokenizer_lock = threading.Lock()
        # len() of a fast tokenizer rebuilds its vocabulary (~20 ms for a 30-50k one): counted once, here
        self.tokenizer_size = len(tokenizer)
        self.device = device
        self.pooling = pooling
        self._max_length = max_length
        self._dim = int(model.config.hidden_size)
        self._vocab_size = int(model.config.vocab_size)
        self._pad_id = int(tokenizer.pad_token_id or 0)

    # ---- loading -----------------------------------------------------------------------------------

    @classmethod
    def load(
        cls,
        folder: Path,
        device: torch.device,
        dtype: torch.dtype = torch.float32,
        max_length: int | None = None,
    ) -> Embedder:
        """Load weights and the fast tokenizer from `folder` onto `device` in `dtype`, ready for inference."""
        folder = Path(folder)
        model = BertEncoder.from_folder(folder, torch.device(device), dtype)  # ValueError if not BERT
        tokenizer = load_fast_tokenizer(folder)
        model_max = _model_max_length(folder, model, tokenizer)
        if max_length is None:
            max_length = model_max
        elif not 2 <= max_length <= model_max:
            raise ValueError(f"max_length must be in [2, {model_max}] for {folder.name}, got {max_length}")
        return cls(model, tokenizer, torch.device(device), max_length, _pooling_mode(folder))

    # ---- properties --------------------------------------------------------------------------------

    @property
    def dim(self) -> int:
        """Width of each output vector."""
        return self._dim

    @property
    def max_length(self) -> int:
        """Most tokens (special tokens included) one item may have; longer texts are truncated."""
        return self._max_length

    # ---- tokenizing --------------------------------------------------------------------------------

    def tokenize(self, texts: list[str], truncate: bool = True, max_length: int | None = None) -> list[list[int]]:
        """Token ids with [CLS]/[SEP], truncated to `max_length` (what `embed` runs; ``max_length``: fewer, a
        class's limit), or uncut (to refuse what would be cut: a row longer than `max_length` must not be
        embedded)."""
        _check_texts(texts)
        with self._tokenizer_lock:
            return self._encode(texts, truncate, max_length)

    def tokenize_if_free(self, texts: list[str], truncate: bool = True, max_length: int | None = None,
                         ) -> list[list[int]] | None:
        """``tokenize`` now, or None while another thread holds the tokenizer: the event loop must not wait
        for an indexing batch's or a long request's tokenization (every stream stops meanwhile)."""
        _check_texts(texts)
        if not self._tokenizer_lock.acquire(blocking=False):
            return None
        try:
            return self._encode(texts, truncate, max_length)
        finally:
            self._tokenizer_lock.release()

    def _encode(self, texts: list[str], truncate: bool, max_length: int | None) -> list[list[int]]:
        limit = min(max_length, self._max_length) if max_length else self._max_length
        if truncate:
            encoded = self.tokenizer(texts, add_special_tokens=True, truncation=True, max_length=limit)
        else:
            encoded = self.tokenizer(texts, add_special_tokens=True, truncation=False)
        return encoded["input_ids"]

    def count_tokens(self, texts: list[str]) -> list[int]:
        """Tokens each text costs after truncation (for usage reports and fairness counters)."""
        return [len(ids) for ids in self.tokenize(texts)]

    # ---- embedding ---------------------------------------------------------------------------------

    def embed(
        self,
        texts: list[str] | None = None,
        token_ids: list[list[int]] | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
    ) -> torch.Tensor:
        """Unit-length embeddings, float32 on the CPU, shape [N, dim], in input order.

        Give exactly one of `texts` or `token_ids`. Token arrays (as OpenAI's API allows) are taken as
        complete model input: nothing is added (no [CLS]/[SEP]) and nothing is cut, so an array longer
        than `max_length`, an empty one, or an id outside the vocabulary raises ValueError (an unchecked
        bad id would be a device-side assert that poisons the whole CUDA context).
        """
        if (texts is None) == (token_ids is None):
            raise ValueError("give exactly one of texts or token_ids")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        ids = self.tokenize(texts) if texts is not None else token_ids
        packed = self._pack(ids)  # type: ignore[arg-type]
        order = torch.argsort(packed.lengths, stable=True)
        out = torch.empty(len(order), self._dim, dtype=torch.float32)
        with torch.inference_mode():
            for start in range(0, len(order), batch_size):
                rows = order[start : start + batch_size]
                out[rows] = self._forward(packed, rows)
        return out

    def _pack(self, ids: list[list[int]]) -> _Packed:
        """Validate token arrays and flatten them into one tensor (validation is vectorised too)."""
        if not isinstance(ids, list) or not ids:
            raise ValueError("input must be a non-empty list")
        try:
            lengths = torch.tensor([len(x) for x in ids], dtype=torch.int64)
        except TypeError:
            raise ValueError("token_ids must be a list of lists of integers") from None
        if int(lengths.min()) < 1:
            raise ValueError("a token array is empty")
        if int(lengths.max()) > self._max_length:
            bad = int(torch.argmax(lengths))
            raise ValueError(
                f"token array {bad} has {int(lengths[bad])} tokens, more than max_length {self._max_length}"
            )
        try:
            flat = torch.tensor(list(itertools.chain.from_iterable(ids)), dtype=torch.int64)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise ValueError(f"token arrays must hold integers: {exc}") from None
        if int(flat.min()) < 0 or int(flat.max()) >= self._vocab_size:
            raise ValueError(f"token ids must be in [0, {self._vocab_size})")
        offsets = torch.cumsum(lengths, 0) - lengths
        return _Packed(flat, lengths, offsets)

    def _forward(self, packed: _Packed, rows: torch.Tensor) -> torch.Tensor:
        """Pad the chosen items to their own longest length, run the encoder, pool and normalise."""
        lengths = packed.lengths[rows]
        width = int(lengths.max())
        positions = torch.arange(width)
        mask = positions[None, :] < lengths[:, None]  # [B, width]
        gather = (packed.offsets[rows][:, None] + positions[None, :]).clamp_(max=len(packed.flat_ids) - 1)
        input_ids = torch.where(mask, packed.flat_ids[gather], self._pad_id)
        input_ids = input_ids.to(self.device, non_blocking=True)
        attention_mask = mask.to(self.device, dtype=torch.int64, non_blocking=True)
        no_padding = int(lengths.min()) == width  # known on the CPU: no device sync to find out
        hidden = self.model(input_ids, None if no_padding else attention_mask)
        hidden = hidden.float()
        if self.pooling == "cls":
            pooled = hidden[:, 0]
        else:
            weights = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * weights).sum(1) / weights.sum(1).clamp_min(1e-9)
        return torch.nn.functional.normalize(pooled, p=2.0, dim=1).cpu()


def _check_texts(texts: list[str]) -> None:
    if not isinstance(texts, list) or not texts:
        raise ValueError("texts must be a non-empty list of strings")
    if not all(isinstance(t, str) for t in texts):
        raise ValueError("texts must all be strings")


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def _model_max_length(folder: Path, model: BertEncoder, tokenizer: PreTrainedTokenizerFast) -> int:
    """sentence-transformers' max_seq_length if set, else the smaller of tokenizer and position limits."""
    limit = model.config.max_position_embeddings
    st_max = _read_json(folder / "sentence_bert_config.json").get("max_seq_length")
    if st_max:
        return min(int(st_max), limit)
    tok_max = tokenizer.model_max_length
    return min(int(tok_max), limit) if tok_max and tok_max < 10**9 else limit


def _pooling_mode(folder: Path) -> str:
    """Mean pooling unless the sentence-transformers pooling config asks for CLS (others unsupported)."""
    cfg = _read_json(folder / "1_Pooling" / "config.json")
    if not cfg or cfg.get("pooling_mode_mean_tokens"):
        return "mean"
    if cfg.get("pooling_mode_cls_token"):
        return "cls"
    raise ValueError(f"{folder}: unsupported pooling config {cfg}")
