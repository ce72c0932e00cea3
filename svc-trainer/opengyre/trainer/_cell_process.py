"""A satellite training cell in its own process, joined to the core over a torch.distributed (gloo) group.

A training cell that joins mid-step is a separate process (on a GPU cluster another node's GPUs; on CPU another
process): it cannot share the core's tensors. Each satellite process forms a two-rank gloo group with the core
(rank 0) through the core's ``TCPStore`` when it is started — one group per satellite, so satellites join and
leave at any time without re-forming a world the others are in. Per step, over that group:

1. the core sends its step-start weights (the authoritative copy; fixed until the update, so the copy is
   exact) and the satellite answers with the digest of what it loaded;
2. the core's thread for this satellite claims micro-batches from the step's buffer and sends them; the
   satellite computes the step-start (proximal) logprobs and the loss and backward of each, and answers with
   both — claims stay atomic in the one buffer, a fast cell simply gets more;
3. when the buffer is drained (or the cell is told to leave), the satellite sends its summed gradients, which
   the core adds to its own before the step's single update.

Everything crosses as tensors or as ``torch.save`` of plain containers, read back with ``weights_only=True``
(no pickled code from a peer). The satellite keeps no optimizer: the core applies the update.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import json
import subprocess
import sys
import threading
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, TCPStore  # the public names, typed
from transformers import LlamaConfig

from ._packing import MicroBatch
from ._step import MicroResult, Proximal
from ._streaming import MicroStepBuffer

__all__ = ["TIMEOUT", "CellHub", "ProcessSatellite"]

TIMEOUT = datetime.timedelta(seconds=120)
_MB_FIELDS = [f.name for f in dataclasses.fields(MicroBatch)]


def send_obj(pg: Any, peer: int, obj: Any) -> None:
    buf = io.BytesIO()
    torch.save(obj, buf)
    data = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
    pg.send([torch.tensor([data.numel()], dtype=torch.int64)], peer, 0).wait()
    pg.send([data], peer, 0).wait()


def recv_obj(pg: Any, peer: int) -> Any:
    n = torch.zeros(1, dtype=torch.int64)
    pg.recv([n], peer, 0).wait()
    data = torch.empty(int(n.item()), dtype=torch.uint8)
    pg.recv([data], peer, 0).wait()
    return torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=True)


def send_state(pg: Any, peer: int, state: Mapping[str, torch.Tensor]) -> None:
    """Names, shapes and dtypes first, then each tensor as it is (no copy through pickle)."""
    send_obj(pg, peer, [(k, list(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in state.items()])
    for v in state.values():
        pg.send([v.detach().contiguous()], peer, 0).wait()


def recv_state(pg: Any, peer: int) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for k, shape, dtype in recv_obj(pg, peer):
        t = torch.empty(shape, dtype=getattr(torch, dtype))
        pg.recv([t], peer, 0).wait()
        out[k] = t
    return out


def micro_batch_to_wire(mb: MicroBatch) -> dict[str, Any]:
    return {k: getattr(mb, k) for k in _MB_FIELDS}


def micro_batch_from_wire(d: Mapping[str, Any]) -> MicroBatch:
    fields: dict[str, Any] = {k: d[k] for k in _MB_FIELDS}
    fields["execution_ids"] = tuple(fields["execution_ids"])
    return MicroBatch(**fields)


class CellHub:
    """The core's side: one ``TCPStore`` on loopback that satellite processes rendezvous through."""

    def __init__(self) -> None:
        self.store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)
        self._next = 0
        self._lock = threading.Lock()

    def start(
        self,
        name: str,
        backend: str,
        model: LlamaConfig,
        algorithm: str,
        params: Mapping[str, Any] | None = None,
        *,
        reference: Mapping[str, torch.Tensor] | None = None,
        threads: int = 1,
    ) -> ProcessSatellite:
        """Start a satellite process holding a ``backend`` of ``model`` and ``algorithm`` (with the frozen
        ``reference`` weights when the algorithm has a KL term), computing on ``threads`` CPU threads; it is
        joined to the core's group at once and waits for a step (``StreamingStep.join``)."""
        if threads < 1:
            raise ValueError(f"a cell needs at least one thread, got {threads}")
        with self._lock:
            prefix = f"cell-{self._next}"
            self._next += 1
        argv = [sys.executable, "-m", "opengyre.trainer._cell_main", "127.0.0.1", str(self.store.port), prefix]
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
        try:
            pg = dist.ProcessGroupGloo(PrefixStore(prefix, self.store), 0, 2, TIMEOUT)
            spec = {"backend": backend, "model": model.to_json_string(), "algorithm": algorithm, "threads": threads}
            send_obj(pg, 1, {**spec, "params": json.dumps(dict(params or {})), "reference": reference is not None})
            if reference is not None:
                send_state(pg, 1, reference)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        return ProcessSatellite(name, proc, pg)


class ProcessSatellite:
    """The core's handle on one satellite process (what ``StreamingStep.join`` drives, as an in-process
    ``Satellite``): ``join`` sends the weights, ``work`` feeds it micro-batches, ``grads`` are its sum."""

    def __init__(self, name: str, proc: subprocess.Popen[bytes], pg: Any) -> None:
        self.name = name
        self.proc = proc
        self._pg = pg
        self.joined_digest = ""
        self.results: list[tuple[MicroBatch, Proximal, MicroResult]] = []
        self._grads: dict[str, torch.Tensor] = {}
        self._leave = threading.Event()
        self._buffer: MicroStepBuffer | None = None
        # Set once ``work`` has returned (gradients in hand, or failed): the process may then be closed.
        self.worked = threading.Event()

    def join(self, snapshot: Mapping[str, torch.Tensor]) -> None:
        self.results, self._grads = [], {}
        send_obj(self._pg, 1, "join")
        send_state(self._pg, 1, snapshot)
        self.joined_digest = str(recv_obj(self._pg, 1))

    def leave(self) -> None:
        """Take no more micro-batches in this step (the one in hand is finished; its gradients still count)."""
        self._leave.set()
        if self._buffer is not None:
            self._buffer.wake()  # it may be waiting for a micro-batch: it leaves now, not with the next one

    def work(self, buffer: MicroStepBuffer) -> None:
        self._buffer = buffer
        try:
            while (mb := buffer.claim(self.name, self._leave)) is not None:
                send_obj(self._pg, 1, micro_batch_to_wire(mb))
                out = recv_obj(self._pg, 1)
                prox = Proximal(out["logprobs"], dict(out["prox_metrics"]), int(out["n_targets"]))
                self.results.append((mb, prox, MicroResult(**out["result"])))
            send_obj(self._pg, 1, None)  # the step's end for this cell: send the gradients
            self._grads = recv_state(self._pg, 1)
            self._leave.clear()  # the next step it joins, it works in again
        finally:
            self.worked.set()

    def grads(self) -> Mapping[str, torch.Tensor]:
        return self._grads

    def close(self) -> None:
        """End the process (between steps): it leaves the training cells."""
        if self.proc.poll() is None:
            try:
                send_obj(self._pg, 1, "leave")
                self.proc.wait(60)
            except Exception:
                self.proc.kill()
                self.proc.wait()
