"""The reference fold the contract tests compare every projection with: the aggregate's pure ``evolve`` over a
sequence, keyed by aggregate id, recording which seqs it refused and why."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from opengyre.projection import Rejected

E = TypeVar("E")
V = TypeVar("V")


@dataclass
class Reference(Generic[V]):
    views: dict[str, V] = field(default_factory=dict)
    refused: list[int] = field(default_factory=list)
    reasons: set[str] = field(default_factory=set)


def fold_reference(
    evolve: Callable[[V | None, E, int], V], key: Callable[[E], str], events: Sequence[E]
) -> Reference[V]:
    ref: Reference[V] = Reference()
    for seq, e in enumerate(events, 1):
        try:
            ref.views[key(e)] = evolve(ref.views.get(key(e)), e, seq)
        except Rejected as exc:
            ref.refused.append(seq)
            ref.reasons.add(exc.reason)
    return ref
