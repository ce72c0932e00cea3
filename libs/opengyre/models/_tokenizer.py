"""The shipped byte-level ChatML tokenizer (no downloads): ids 0..255 are bytes, then special tokens."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from transformers import PreTrainedTokenizerFast

__all__ = ["TOKENIZER_DIR", "load_tokenizer"]

TOKENIZER_DIR = Path(__file__).parent / "assets" / "byte-chatml"


@lru_cache(maxsize=4)
def load_tokenizer(path: str | None = None) -> PreTrainedTokenizerFast:
    """The tokenizer at ``path`` (a HF tokenizer folder), by default the shipped byte-level one."""
    tok: PreTrainedTokenizerFast = PreTrainedTokenizerFast.from_pretrained(str(path or TOKENIZER_DIR))
    return tok
