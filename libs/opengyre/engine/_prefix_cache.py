"""A small prefix cache: the KV of finished sequences, reused by requests that start with the same tokens.

Agent turns extend the previous prompt + output token for token (that is what TITO guarantees), so the
longest-common-prefix hit is nearly the whole prompt and only the new turn needs a prefill.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Sequence

import torch

from ._runner import KVCache

__all__ = ["PrefixCache"]


def _lcp(a: torch.Tensor, b: torch.Tensor) -> int:
    n = min(a.numel(), b.numel())
    if n == 0:
        return 0
    diff = (a[:n] != b[:n]).nonzero()
    return n if diff.numel() == 0 else int(diff[0, 0])


class PrefixCache:
    def __init__(self, max_tokens: int, min_match: int = 16) -> None:
        self.max_tokens = max_tokens
        self.min_match = min_match
        self._entries: OrderedDict[int, tuple[torch.Tensor, KVCache]] = OrderedDict()
        self._ids = itertools.count()
        self.tokens = 0
        self.hits = 0
        self.hit_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Forget everything (new weights make every cached key and value stale)."""
        self._entries.clear()
        self.tokens = 0

    def _longest(self, ids: Sequence[int]) -> tuple[int, int]:
        """The longest cached prefix of ``ids``: its length and its entry's key (-1: none)."""
        want = torch.tensor(list(ids), dtype=torch.int32)
        best, best_key = 0, -1
        for key, (tokens, _) in self._entries.items():
            n = _lcp(tokens, want)
            if n > best:
                best, best_key = n, key
        return best, best_key

    def lookup(self, ids: Sequence[int]) -> tuple[int, KVCache | None]:
        """The longest cached prefix of ``ids`` (leaving at least one token to compute) and a private copy of it."""
        if not self._entries or len(ids) <= self.min_match:
            return 0, None
        best, best_key = self._longest(ids)
        best = min(best, len(ids) - 1)
        if best < self.min_match:
            return 0, None
        self._entries.move_to_end(best_key)
        self.hits += 1
        self.hit_tokens += best
        return best, self._entries[best_key][1].truncated_copy(best)

    def peek(self, ids: Sequence[int]) -> tuple[int, KVCache | None]:
        """The longest cached prefix of ``ids`` (all of them may be) and the entry holding it, uncopied: read it
        on the engine thread, before the next step. Not a hit: nothing is reused here (a KV export reads it)."""
        if not self._entries or not ids:
            return 0, None
        best, best_key = self._longest(ids)
        if best < self.min_match:
            return 0, None
        return best, self._entries[best_key][1]

    def accepts(self, n: int) -> bool:
        """Whether a sequence of ``n`` cached tokens would be kept."""
        return self.min_match <= n <= self.max_tokens

    def insert(self, ids: Sequence[int], cache: KVCache) -> None:
        """Keep ``cache`` (which now belongs to the prefix cache) for the tokens it covers."""
        n = min(len(ids), cache.length)
        if not self.accepts(n):
            return
        tokens = torch.tensor(list(ids[:n]), dtype=torch.int32)
        # An entry that is a prefix of the new one is superseded by it.
        for key in [k for k, (t, _) in self._entries.items() if t.numel() <= n and _lcp(t, tokens) == t.numel()]:
            self.tokens -= self._entries.pop(key)[0].numel()
        self._entries[next(self._ids)] = (tokens, cache)
        self.tokens += n
        while self.tokens > self.max_tokens and self._entries:
            _, (t, _) = self._entries.popitem(last=False)
            self.tokens -= t.numel()
