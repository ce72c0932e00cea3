"""What a satellite cell costs to join and to leave a running step, against one micro-step on the core.

    .venv/bin/python svc-trainer/bench/satellite_join.py [--model tiny|small] [--rows 4] [--seq 128] [--iters 5]

Per iteration, in this process and the satellite processes it starts (``CellHub``, one torch thread each):

- **cold join**: ``CellHub.start`` (process spawn, imports, the two-rank gloo group, the backend built) plus the
  first ``join`` (the step-start weights cross, the digest comes back) — what a cell entering
  ``training-satellite`` waits before it claims;
- **warm join**: ``join`` again on the same process (the weights only: every later step);
- **leave**: the cell told to leave between micro-steps, until its summed gradients are in the core's hands;
- **close**: the process told to end, until it has exited.

The baseline is one micro-step on the core (proximal logprobs, loss and backward) of the same micro-batch, timed in
the same process; each figure is printed with its ratio to it (medians over ``--iters``). Then one step over
``--micro-batches`` micro-batches on the core alone and with one process satellite (same data).
"""

from __future__ import annotations

import argparse
import functools
import random
import statistics
import time
from collections.abc import Callable

import torch

from opengyre.models import model_config
from opengyre.trainer import (
    CellHub,
    Learner,
    MicroBatch,
    MicroStepBuffer,
    ProcessSatellite,
    TrainingSample,
    pack_samples,
    streaming_step,
)
from opengyre.trainer.algorithms import GSPO
from opengyre.trainer.backends import build_backend

PARAMS = {"eps_low": 0.2, "eps_high": 0.2}


def samples(rows: int, seq: int, seed: int, vocab: int) -> list[TrainingSample]:
    rng = random.Random(seed)
    out = []
    for i in range(rows):
        targets = tuple(t >= seq // 4 for t in range(seq))  # a prompt quarter, then generated tokens
        out.append(
            TrainingSample(
                execution_id=f"e{seed}-{i}",
                leaf="l",
                tokens=tuple(rng.randrange(vocab) for _ in range(seq)),
                targets=targets,
                behaviour_logprobs=tuple(-rng.random() * 3 if m else 0.0 for m in targets),
                advantage=rng.uniform(-1, 1),
                token_weight=1.0 / (rows * sum(targets)),
                temperatures=(1.0,) * seq,
            )
        )
    return out


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def leave_between_micro_steps(sat: ProcessSatellite) -> float:
    """Seconds from the cell told to leave between micro-steps until its summed gradients are in the core's
    hands (``work`` returns: the empty claim, the end-of-step order, the gradients crossing)."""
    sat.leave()
    return timed(functools.partial(sat.work, MicroStepBuffer()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--micro-batches", type=int, default=8)
    args = ap.parse_args()
    if min(args.rows, args.seq, args.iters, args.micro_batches) < 1:
        ap.error("--rows, --seq, --iters and --micro-batches must be >= 1")
    torch.set_num_threads(1)  # the core's share, as each satellite's (threads=1)
    cfg = model_config(args.model)
    core = Learner(build_backend("torch", cfg, seed=0), GSPO(**PARAMS), lr=1e-4)
    mbs: list[MicroBatch] = [
        mb for i in range(args.micro_batches) for mb in pack_samples(samples(args.rows, args.seq, i, 256), 10**9)
    ]
    n_params = sum(v.numel() for v in core.backend.hf_state_dict().values())
    print(
        f"model {args.model} ({n_params:,} parameters, {4 * n_params / 1e6:.1f} MB of fp32 weights), micro-batch "
        f"{args.rows} x {args.seq} tokens, 1 torch thread per process, {args.iters} iterations"
    )

    def micro_step() -> None:
        core.accumulate(mbs[0], core.proximal(mbs[0]))

    micro_step()  # warm-up
    base = statistics.median(timed(micro_step) for _ in range(args.iters))
    core.backend.zero_grad()
    hub = CellHub()
    snapshot = core.backend.hf_state_dict()
    cold: list[float] = []
    warm: list[float] = []
    leave: list[float] = []
    close: list[float] = []
    for i in range(args.iters):
        t0 = time.perf_counter()
        sat = hub.start(f"bench-{i}", "torch", cfg, "gspo", PARAMS, threads=1)
        sat.join(snapshot)
        cold.append(time.perf_counter() - t0)
        leave.append(leave_between_micro_steps(sat))
        warm.append(timed(functools.partial(sat.join, snapshot)))
        leave_between_micro_steps(sat)
        close.append(timed(sat.close))
    print(f"| what | median s | range s | / one micro-step ({base * 1e3:.1f} ms) |")
    print("| --- | --- | --- | --- |")
    for name, ts in (("cold join", cold), ("warm join", warm), ("leave", leave), ("close", close)):
        med = statistics.median(ts)
        print(f"| {name} | {med:.3f} | {min(ts):.3f}–{max(ts):.3f} | {med / base:.1f} |")

    sat = hub.start("bench-step", "torch", cfg, "gspo", PARAMS, threads=1)
    try:

        def step(with_satellite: bool) -> float:
            buffer = MicroStepBuffer()
            for mb in mbs:
                buffer.put(mb)
            buffer.close()
            return timed(lambda: streaming_step(core, buffer, [sat] if with_satellite else []))

        step(True)  # warm-up: the satellite's first step
        one = statistics.median(step(False) for _ in range(args.iters))
        two = statistics.median(step(True) for _ in range(args.iters))
    finally:
        sat.close()
    print(
        f"one step over {len(mbs)} micro-batches: core alone {one:.3f} s, core + 1 process satellite {two:.3f} s "
        f"(x{one / two:.2f} the core alone's speed; the processes share this machine's cores)"
    )


if __name__ == "__main__":
    main()
