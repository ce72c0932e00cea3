"""Constrained decoding: each step, only tokens that keep the output a prefix of a match of the expression.

The CPU engine's answer to SGLang's ``regex`` and ``json_schema`` sampling parameters (the latter through
``_schema_regex``). A token is allowed when the output text with the token's text appended can still be
completed to a full match (``regex`` partial matching); an end-of-sequence token only once the text is a
full match. Special tokens and tokens that are not whole characters are never allowed inside a constraint.
"""

from __future__ import annotations

from collections.abc import Iterable

import regex
import torch

from opengyre.chat import ChatCodec

__all__ = ["TokenConstraint", "TokenVocabulary"]


class TokenVocabulary:
    """Each usable token's text, grouped by first character (built once per engine, checked per step)."""

    def __init__(self, codec: ChatCodec, vocab_size: int) -> None:
        self.size = vocab_size
        self.by_first: dict[str, list[tuple[int, str]]] = {}
        for tid in range(vocab_size):
            if tid in codec.special_ids:
                continue
            text = codec.decode([tid], skip_special=False)
            if text and "\ufffd" not in text:
                self.by_first.setdefault(text[0], []).append((tid, text))


class TokenConstraint:
    def __init__(self, pattern: regex.Pattern[str], vocab: TokenVocabulary, eos_ids: Iterable[int]) -> None:
        self.pattern = pattern
        self.vocab = vocab
        self.eos_ids = sorted(eos_ids)
        self.text = ""

    def complete(self) -> bool:
        return self.pattern.fullmatch(self.text) is not None

    def _viable(self, text: str) -> bool:
        return self.pattern.fullmatch(text, partial=True) is not None

    def allowed(self) -> torch.Tensor:
        """A boolean mask over the vocabulary of the tokens that may come next."""
        mask = torch.zeros(self.vocab.size, dtype=torch.bool)
        ids: list[int] = []
        for first, tokens in self.vocab.by_first.items():
            if not self._viable(self.text + first):  # one check rules out every token starting so
                continue
            ids.extend(tid for tid, t in tokens if len(t) == 1 or self._viable(self.text + t))
        if self.complete() or not ids:  # a dead end cannot happen for a sound expression; end rather than loop
            ids.extend(self.eos_ids)
        mask[ids] = True
        return mask

    def advance(self, token_text: str) -> None:
        self.text += token_text
