"""A folder's fast tokenizer (its tokenizer.json) as ``PreTrainedTokenizerFast``, without AutoTokenizer.

AutoTokenizer imports the tokenizer classes of every architecture it might dispatch to: ~95 MB resident
for the life of the server. Every folder we serve has a tokenizer.json (GGUF and Ollama pulls write one,
sentence-transformers folders ship one), which the generic fast class reads completely: vocabulary,
normalizer, pre-tokenizer, post-processor, added and special tokens, and the chat template.
"""

from __future__ import annotations

import logging
from pathlib import Path

from transformers import PreTrainedTokenizerFast
from transformers.utils import logging as hf_logging


def load_fast_tokenizer(folder: Path) -> PreTrainedTokenizerFast:
    """The tokenizer of ``folder`` (which must hold a tokenizer.json)."""
    if not (Path(folder) / "tokenizer.json").is_file():
        raise ValueError(f"{folder}: no fast tokenizer (tokenizer.json) found")
    # transformers warns that tokenizer_config.json names another class (GPT2Tokenizer, BertTokenizer):
    # the generic fast class is chosen on purpose, so that one warning is noise.
    previous = hf_logging.get_verbosity()
    hf_logging.set_verbosity(logging.ERROR)
    try:
        return PreTrainedTokenizerFast.from_pretrained(str(folder))
    finally:
        hf_logging.set_verbosity(previous)
