"""Policy-optimisation algorithms as small modules behind one ``Algorithm`` interface, found by name."""

from typing import Any

from .._advantages import group_advantages
from ._base import Algorithm, LossInputs, LossOutput, masked_sum, per_sequence
from ._grpo import DAPO, GRPO
from ._gspo import GSPO
from ._importance import behaviour_ratio, mis_keep, mismatch_metrics, token_tis
from ._kl import k3
from ._sft import SFT

__all__ = [
    "ALGORITHMS",
    "DAPO",
    "GRPO",
    "GSPO",
    "SFT",
    "Algorithm",
    "LossInputs",
    "LossOutput",
    "behaviour_ratio",
    "get_algorithm",
    "group_advantages",
    "k3",
    "masked_sum",
    "mis_keep",
    "mismatch_metrics",
    "per_sequence",
    "token_tis",
]

ALGORITHMS: dict[str, type[Algorithm]] = {"dapo": DAPO, "grpo": GRPO, "gspo": GSPO, "sft": SFT}


def get_algorithm(name: str, **params: Any) -> Algorithm:
    try:
        cls = ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}; known: {', '.join(sorted(ALGORITHMS))}") from None
    return cls(**params)
