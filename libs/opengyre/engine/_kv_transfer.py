"""Moving one sequence's KV cache between CPU engines: export it from one, import it into another, so a
continuation there computes only what the first engine had not (no prefill of the positions it already ran).

**Wire format** (``KV_MEDIA_TYPE``): one safetensors file (the project's checkpoint format and Hugging Face's
tensor framing: an 8-byte little-endian header length, a JSON header naming each tensor's dtype, shape and byte
range, then the raw bytes), holding

- ``keys``, ``values``: the model's dtype, ``[layers, kv_heads, n, head_dim]`` (post-rotary keys, as the engine
  attends over them), positions ``0 .. n-1`` of the sequence;
- ``token_ids``: int64 ``[n]``, the tokens those positions hold;
- ``pending_ids``: int64 ``[m]``, tokens the source sampled but had not yet run through the model (a running
  sequence's last sampled token): a continuation feeds ``token_ids + pending_ids`` as its prompt;

and in the header's ``__metadata__`` (strings) the identity of what computed it, checked on import as LMCache
checks its ``CacheEngineKey`` (format, model, world size) before it reuses a chunk: ``format`` (``KV_FORMAT``),
``weights_sha256`` (the digest ``save_checkpoint`` records), ``weight_version``, ``dtype``, ``layers``,
``kv_heads``, ``head_dim``, ``world_size`` (1: the CPU engine holds every head), plus ``model_name`` and ``rid``
for the reader. An import into an engine whose identity differs in any field is refused (409) and names the
fields; KV of other weights would give a continuation that silently differs.

The imported KV goes into the target's prefix cache, so the next request starting with those tokens reuses
it (``cached_tokens`` says how many; the engine's ``prefill_tokens`` counts what it computed).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from ._runner import KVCache

if TYPE_CHECKING:
    from ._engine import CpuEngine

__all__ = ["KV_FORMAT", "KV_MEDIA_TYPE", "KVExport", "KVTransferError", "export_kv", "import_kv", "kv_identity"]

KV_FORMAT = "opengyre-kv/1"
KV_MEDIA_TYPE = "application/vnd.opengyre.kv+safetensors"
# The fields two engines must agree on for one's KV to be the other's.
_IDENTITY = ("format", "weights_sha256", "weight_version", "dtype", "layers", "kv_heads", "head_dim", "world_size")
_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}


class KVTransferError(Exception):
    """An export or import the engine refuses: ``status`` is the HTTP status it answers with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class KVExport:
    keys: torch.Tensor  # [layers, kv_heads, n, head_dim]
    values: torch.Tensor
    token_ids: list[int]
    pending_ids: list[int]
    meta: dict[str, str]

    def encode(self) -> bytes:
        tensors = {
            "keys": self.keys,
            "values": self.values,
            "token_ids": torch.tensor(self.token_ids, dtype=torch.int64),
            "pending_ids": torch.tensor(self.pending_ids, dtype=torch.int64),
        }
        return save_tensors(tensors, metadata=self.meta)

    @classmethod
    def decode(cls, blob: bytes) -> KVExport:
        meta = _metadata(blob)
        try:
            t = load_tensors(blob)
        except (SafetensorError, ValueError) as exc:
            raise KVTransferError(f"the KV export is not a readable safetensors file: {exc}") from None
        missing = {"keys", "values", "token_ids", "pending_ids"} - set(t)
        if missing:
            raise KVTransferError(f"the KV export lacks tensor(s) {', '.join(sorted(missing))}")
        extra = set(t) - {"keys", "values", "token_ids", "pending_ids"}
        if extra:
            raise KVTransferError(f"the KV export has unknown tensor(s) {', '.join(sorted(extra))}")
        ids, pending = t["token_ids"], t["pending_ids"]
        if ids.dtype != torch.int64 or pending.dtype != torch.int64 or ids.dim() != 1 or pending.dim() != 1:
            raise KVTransferError("token_ids and pending_ids must be int64 vectors")
        return cls(t["keys"], t["values"], ids.tolist(), pending.tolist(), meta)


def _metadata(blob: bytes) -> dict[str, str]:
    """The safetensors header's ``__metadata__`` (the tensors are read by safetensors itself)."""
    if len(blob) < 8:
        raise KVTransferError("the KV export is empty or truncated (no safetensors header)")
    (size,) = struct.unpack("<Q", blob[:8])
    if size > len(blob) - 8:
        raise KVTransferError("the KV export is truncated (its header runs past the end)")
    try:
        header = json.loads(blob[8 : 8 + size])
    except ValueError as exc:
        raise KVTransferError(f"the KV export's header is not JSON: {exc}") from None
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise KVTransferError("the KV export has no __metadata__ (the identity of the engine that computed it)")
    return meta


def kv_identity(engine: CpuEngine) -> dict[str, str]:
    """What an engine's KV depends on (engine thread: the weights digest is computed there, once per version)."""
    r = engine.runner
    return {
        "format": KV_FORMAT,
        "weights_sha256": engine.weights_sha256(),
        "weight_version": engine.weight_version,
        "dtype": _DTYPES.get(r.dtype, str(r.dtype)),
        "layers": str(r.n_layers),
        "kv_heads": str(r.kv_heads),
        "head_dim": str(r.head_dim),
        "world_size": "1",
    }


def export_kv(engine: CpuEngine, *, rid: str | None = None, token_ids: Sequence[int] | None = None) -> KVExport:
    """The KV of the running request ``rid``, or of the longest cached prefix of ``token_ids`` (engine thread:
    between two steps, so it is whole). Raises KVTransferError (404) when the engine holds neither."""
    sched = engine.scheduler
    cache: KVCache | None
    if rid is not None:
        req = sched.running(rid)
        if req is None or req.cache is None or req.cache.length == 0:
            raise KVTransferError(f"no running request {rid!r} with KV on this engine", 404)
        cache, seq = req.cache, [*req.input_ids, *req.output_ids]
        n = cache.length
    else:
        assert token_ids is not None
        n, cache = sched.prefix_cache.peek(token_ids)
        if cache is None:
            raise KVTransferError(
                f"no cached KV for a prefix of these {len(token_ids)} tokens (at least "
                f"{sched.prefix_cache.min_match} must match)",
                404,
            )
        seq = list(token_ids[:n])
    keys = torch.stack([k[:, :n] for k in cache.keys])
    values = torch.stack([v[:, :n] for v in cache.values])
    meta = {**kv_identity(engine), "model_name": engine.config.model_name, "rid": rid or "", "tokens": str(n)}
    sched.kv_exports += 1
    return KVExport(keys, values, seq[:n], seq[n:], meta)


def import_kv(engine: CpuEngine, kv: KVExport) -> int:
    """Put ``kv`` in the engine's prefix cache (engine thread); returns the positions it covers."""
    own = kv_identity(engine)
    differ = [f"{f}: {kv.meta.get(f)!r} in the export, {own[f]!r} here" for f in _IDENTITY if kv.meta.get(f) != own[f]]
    if differ:
        raise KVTransferError("the KV export was computed by another model or weights: " + "; ".join(differ), 409)
    r, n = engine.runner, len(kv.token_ids)
    want = (r.n_layers, r.kv_heads, n, r.head_dim)
    for name, t in (("keys", kv.keys), ("values", kv.values)):
        if tuple(t.shape) != want or t.dtype != r.dtype:
            raise KVTransferError(f"{name} is {t.dtype} {tuple(t.shape)}; this engine's KV is {r.dtype} {want}")
    ids = [*kv.token_ids, *kv.pending_ids]
    if any(t < 0 or t >= r.vocab_size for t in ids):
        raise KVTransferError(f"token ids must be in [0, {r.vocab_size})")
    if len(ids) >= engine.context_length:
        raise KVTransferError(f"{len(ids)} tokens do not fit the context length ({engine.context_length})")
    pc = engine.scheduler.prefix_cache
    if not pc.accepts(n):
        raise KVTransferError(f"{n} positions: the prefix cache keeps {pc.min_match} to {pc.max_tokens} tokens")
    with torch.inference_mode():  # the runner's caches are inference tensors
        cache = KVCache(
            keys=[kv.keys[i].contiguous().clone() for i in range(r.n_layers)],
            values=[kv.values[i].contiguous().clone() for i in range(r.n_layers)],
            length=n,
        )
    pc.insert(kv.token_ids, cache)
    engine.scheduler.kv_imports += 1
    engine.scheduler.kv_imported_tokens += n
    return n
