"""Ours: elastic cells plus partial-rollout carry-over. A training step packs the first complete groups,
whichever step they were dispatched for, so a step never waits for the slowest group of its own burst; the
stragglers are trained by a later step (bounded, measured staleness). Cells still move under the watermark."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .._policy import Packing
from ._elastic import ElasticPolicy

__all__ = ["CarryOverPolicy"]


@dataclass
class CarryOverPolicy(ElasticPolicy):
    name: ClassVar[str] = "elastic-carry"
    summary: ClassVar[str] = "elastic + steps pack the first complete groups; stragglers carry over (ours)"
    packing: ClassVar[Packing] = "fifo"
