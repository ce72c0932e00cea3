"""Training backends behind one interface: ``torch`` (the shared Llama) and ``megatron`` (megatron-core).

The megatron backend is imported on demand: megatron-core is slow to import and not needed by the default.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from transformers import LlamaConfig

from ._base import Backend
from ._mcore_weights import hf_to_mcore, mcore_to_hf
from ._torch import TorchBackend

if TYPE_CHECKING:
    from ._megatron import MegatronBackend

__all__ = ["BACKENDS", "Backend", "MegatronBackend", "TorchBackend", "build_backend", "hf_to_mcore", "mcore_to_hf"]

BACKENDS = ("torch", "megatron")


def __getattr__(name: str) -> Any:
    if name == "MegatronBackend":
        from ._megatron import MegatronBackend

        return MegatronBackend
    raise AttributeError(name)


def build_backend(
    name: str, config: LlamaConfig, hf_state: dict[str, Any] | None = None, seed: int = 0, *, tp: int = 1, pp: int = 1
) -> Backend:
    """A backend of ``name`` holding ``hf_state`` (or the seeded initial weights of ``config``); megatron takes
    tensor- and pipeline-parallel sizes (the process group must then hold ``tp * pp`` ranks)."""
    if name == "torch" and tp * pp != 1:
        raise ValueError("the torch backend is single-process: tp and pp must be 1")
    torch_backend = TorchBackend.from_config(config, seed)
    if hf_state is not None:
        torch_backend.load_hf_state_dict(hf_state)
    if name == "torch":
        return torch_backend
    if name == "megatron":
        from ._megatron import MegatronBackend

        return MegatronBackend(config, torch_backend.hf_state_dict(), tp=tp, pp=pp)
    raise ValueError(f"unknown backend {name!r}; known: {', '.join(BACKENDS)}")
