"""A cell's trainer worker, ``python -m opengyre.scheduler.worker``: claims micro-steps from the scheduler, trains
them, reports them done; a faster cell simply comes back for more. The local actuator starts one per training
cell and stops it when the cell goes back to rollout (an unfinished claim is then released by the scheduler).

What "train" does is pluggable (``--train module:function``, called with the step and the micro-step's
execution ids in a thread). The real trainer does not plug in here: it follows the cells' roles in the log
(the trainer's ``follow_cell_roles``: a cell in ``training-satellite`` gets a satellite process that joins the
running step, the ``training-core`` cell is the trainer's own process), since the services meet only through
events. ``--stand-in`` is the test and simulation mode, and says so: it trains nothing, it holds each micro-step
for ``--micro-step-s`` seconds so the scheduler's protocol (claims, completion, release on leaving) runs for real.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import logging
import signal
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc

from opengyre.runtime import grpc_channel, token_from_env
from opengyre.v1 import scheduler_pb2 as pb
from opengyre.v1 import scheduler_pb2_grpc

__all__ = ["TrainFn", "main", "run_worker"]

log = logging.getLogger("opengyre.scheduler.worker")

TrainFn = Callable[[int, Sequence[str]], None]
# Refusals a worker outlives: its cell is not (yet, or any more) training, or the scheduler is restarting.
_NOT_NOW = (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNAVAILABLE)


def _load(spec: str) -> TrainFn:
    module, _, attr = spec.partition(":")
    fn = getattr(importlib.import_module(module), attr)
    if not callable(fn):
        raise TypeError(f"{spec} is not callable")
    return fn  # type: ignore[no-any-return]


async def run_worker(
    cell: str,
    scheduler: str,
    *,
    token: str | None,
    stop: asyncio.Event,
    train: TrainFn | None = None,
    micro_step_s: float = 0.2,
    poll_s: float = 0.2,
    ready_file: Path | None = None,
) -> int:
    """Claim and train until ``stop``; returns the number of micro-steps done. ``token``: the scheduler's gRPC
    bearer token (None: every claim is refused, UNAUTHENTICATED). ``train`` None is the stand-in (tests and
    simulation): each micro-step is held ``micro_step_s`` seconds and nothing is trained."""
    done = 0
    async with grpc_channel(scheduler, token) as channel:
        await asyncio.wait_for(channel.channel_ready(), 60)
        stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
        if ready_file is not None:
            await asyncio.to_thread(ready_file.write_text, "ready\n")
        while not stop.is_set():
            try:
                m = await stub.ClaimMicroStep(pb.ClaimMicroStepRequest(cell_id=cell))
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in _NOT_NOW:
                    raise
                m = pb.ClaimMicroStepReply(claimed=False)  # not (yet) a training cell, or the scheduler restarts
            if not m.claimed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), poll_s)
                continue
            if train is not None:
                await asyncio.to_thread(train, m.step, list(m.execution_ids))
            else:
                await asyncio.sleep(micro_step_s)
            try:
                r = await stub.CompleteMicroStep(pb.CompleteMicroStepRequest(cell_id=cell, step=m.step, index=m.index))
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in _NOT_NOW:
                    raise
                # The scheduler no longer holds this claim for us (it restarted, or released it): it hands the
                # micro-step out again; this worker goes on claiming.
                log.warning("cell %s: micro-step %d/%d no longer ours (%s)", cell, m.step, m.index, exc.code().name)
                continue
            done += 1
            if r.step_complete:
                log.info("cell %s finished the last micro-step of step %d", cell, m.step)
    return done


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m opengyre.scheduler.worker", description=__doc__)
    p.add_argument("--cell", required=True)
    p.add_argument("--scheduler", required=True, help="host:port of the scheduler's gRPC")
    p.add_argument("--role", default="satellite", help="core or satellite (informational)")
    p.add_argument("--ready-file", type=Path)
    p.add_argument("--train", help="module:function called with (step, execution_ids)")
    p.add_argument(
        "--stand-in", action="store_true",
        help="tests and simulation only: train nothing, hold each micro-step for --micro-step-s seconds",
    )  # fmt: skip
    p.add_argument("--micro-step-s", type=float, help="with --stand-in: how long a micro-step is held (0.2)")
    args = p.parse_args(argv)
    if (args.train is None) == (not args.stand_in):
        p.error("give one of --train module:function or --stand-in (a stand-in that trains nothing)")
    if args.micro_step_s is not None and not args.stand_in:
        p.error("--micro-step-s is the stand-in's hold time: it needs --stand-in")
    micro_step_s = 0.2 if args.micro_step_s is None else args.micro_step_s
    if micro_step_s < 0:
        p.error("--micro-step-s must be >= 0")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    train = _load(args.train) if args.train else None

    async def go() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        # The actuator that started us hands us the token (OPENGYRE_GRPC_TOKEN), else the stack's data dir has it.
        n = await run_worker(
            args.cell, args.scheduler, token=token_from_env(), stop=stop, train=train,
            micro_step_s=micro_step_s, ready_file=args.ready_file,
        )  # fmt: skip
        what = "stand-in: nothing trained" if train is None else args.train
        log.info("cell %s (%s) stopped after %d micro-step(s) (%s)", args.cell, args.role, n, what)

    asyncio.run(go())


if __name__ == "__main__":
    main()
