"""A satellite cell's process: ``python -m opengyre.trainer._cell_main HOST PORT PREFIX`` (started by ``CellHub``).

It joins the core's two-rank gloo group, builds the backend and algorithm it is told to, and serves steps
until told to leave: per step the core's weights, then micro-batches (answered with proximal logprobs and the
loss's results), then its summed gradients. See ``_cell_process``.
"""

from __future__ import annotations

import dataclasses
import json
import sys

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, TCPStore  # the public names, typed
from transformers import LlamaConfig

from ._cell_process import TIMEOUT, micro_batch_from_wire, recv_obj, recv_state, send_obj, send_state
from ._step import accumulate, proximal
from ._streaming import snapshot_digest
from .algorithms import get_algorithm
from .backends import build_backend


def main(host: str, port: int, prefix: str) -> None:
    store = TCPStore(host, port, is_master=False, timeout=TIMEOUT)
    pg = dist.ProcessGroupGloo(PrefixStore(prefix, store), 1, 2, TIMEOUT)
    spec = recv_obj(pg, 0)
    torch.set_num_threads(int(spec["threads"]))  # a cell's share of the machine's cores
    model = LlamaConfig.from_dict(json.loads(spec["model"]))
    backend = build_backend(spec["backend"], model)
    algorithm = get_algorithm(spec["algorithm"], **json.loads(spec["params"]))
    reference = None
    if spec["reference"]:
        reference = build_backend("torch", model, recv_state(pg, 0))
    while (order := recv_obj(pg, 0)) != "leave":
        if order != "join":
            raise SystemExit(f"cell {prefix}: unknown order {order!r}")
        backend.load_hf_state_dict(recv_state(pg, 0))
        backend.zero_grad()
        send_obj(pg, 0, snapshot_digest(backend.hf_state_dict()))
        while (wire := recv_obj(pg, 0)) is not None:
            mb = micro_batch_from_wire(wire)
            prox = proximal(backend, mb)
            result = accumulate(backend, algorithm, mb, prox, reference)
            answer = {"logprobs": prox.logprobs, "prox_metrics": prox.metrics, "n_targets": prox.n_targets}
            send_obj(pg, 0, {**answer, "result": dataclasses.asdict(result)})
        send_state(pg, 0, backend.hf_grads())


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
