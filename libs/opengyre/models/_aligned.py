"""Checkpoint files whose tensors start on 64-byte boundaries, and loading them as views of one file mapping.

The format is safetensors (any safetensors reader loads it): an 8-byte little-endian header length, the JSON
header, the tensors back to back. The header is padded with spaces so the data starts at a multiple of 64, and
tensors whose size is a multiple of 64 bytes (every weight of our models) come first, so each of them starts on a
cache line. ``map_state`` then returns tensors that are views of a copy-on-write mapping of the file
(``torch.frombuffer``, no copy): engine processes started from the same checkpoint share its pages in the page
cache instead of each holding a private copy, and a later in-place reload only copies the pages it writes.
"""

from __future__ import annotations

import json
import mmap
import struct
from pathlib import Path

import torch

__all__ = ["ALIGN", "map_state", "save_aligned"]

ALIGN = 64

_DTYPES: dict[torch.dtype, str] = {
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float64: "F64",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
_BY_NAME = {v: k for k, v in _DTYPES.items()}


def save_aligned(state: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None) -> None:
    """Write ``state`` as a safetensors file with 64-byte-aligned data (see the module's docstring)."""
    tensors = {k: v.detach().contiguous().cpu() for k, v in state.items()}
    for k, t in tensors.items():
        if t.dtype not in _DTYPES:
            raise ValueError(f"tensor {k}: dtype {t.dtype} cannot be written to a checkpoint")
    # Aligned sizes first (in name order, deterministic): each starts where the previous ended, on a boundary.
    order = sorted(tensors, key=lambda k: (tensors[k].nbytes % ALIGN != 0, k))
    header: dict[str, object] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for k in order:
        t = tensors[k]
        header[k] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(8 + len(raw)) % ALIGN)  # safetensors allows trailing spaces in the header
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for k in order:
            f.write(tensors[k].view(torch.uint8).reshape(-1).numpy().data)  # type: ignore[arg-type]


def map_state(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors of a safetensors file as views of a copy-on-write mapping of it, and its metadata.
    ``ValueError`` for a file that is not a whole safetensors file (truncated, a header that does not parse)."""
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if size < 8:
            raise ValueError(f"{path}: {size} bytes, not a safetensors file")
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)  # the mapping outlives the descriptor
    (n,) = struct.unpack_from("<Q", mm, 0)
    if 8 + n > size:
        raise ValueError(f"{path}: a header of {n} bytes in a file of {size}")
    try:
        header = json.loads(bytes(mm[8 : 8 + n]))
    except ValueError as exc:
        raise ValueError(f"{path}: the header does not parse: {exc}") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: the header is not an object")
    meta = header.pop("__metadata__", None) or {}
    base, state = 8 + n, {}
    for k, spec in header.items():
        try:
            dtype = _BY_NAME[spec["dtype"]]
            start, end = (int(x) for x in spec["data_offsets"])
            shape = [int(d) for d in spec["shape"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path}: tensor {k}: a bad header entry ({exc})") from None
        numel = 1
        for d in shape:
            numel *= d
        if not 0 <= start <= end <= size - base or end - start != numel * dtype.itemsize:
            raise ValueError(f"{path}: tensor {k}: bytes {start}..{end} do not fit the file or its shape {shape}")
        flat = (
            torch.frombuffer(mm, dtype=dtype, count=numel, offset=base + start)
            if numel
            else torch.empty(0, dtype=dtype)
        )
        state[k] = flat.reshape(shape)
    return state, {str(k): str(v) for k, v in meta.items()}
