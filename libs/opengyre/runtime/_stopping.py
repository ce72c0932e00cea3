"""A service process that was asked to stop ends, even when what its shutdown waits on no longer answers.

A service's orderly stop closes its gRPC server, its projections and its NATS connection. With the nats-server
stopped (SIGSTOP, a frozen VM, a half-open connection) those closes wait for ever, and a service whose supervisor
died with it was found still running minutes later (4.7 GB of trainer). After the grace the process exits by
itself, as if the supervisor had escalated to SIGKILL: nothing acked is lost (the log is the truth; every fold is
idempotent on restart), so there is nothing a longer wait could save.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading

__all__ = ["EXIT_STOP_HUNG", "STOP_GRACE_ENV", "exit_after", "exit_if_stop_hangs", "stop_grace_s"]

STOP_GRACE_ENV = "OPENGYRE_STOP_GRACE_S"
# Longer than the supervisor's own wait before SIGKILL (15 s): with a live supervisor the supervisor acts first.
_DEFAULT_GRACE_S = 20.0
# What a process killed by SIGTERM reports (128 + the signal): the stop was asked for, it just was not orderly.
EXIT_STOP_HUNG = 128 + int(signal.SIGTERM)


def stop_grace_s(env: dict[str, str] | None = None) -> float:
    """The grace from ``$OPENGYRE_STOP_GRACE_S`` (seconds, > 0), else 20 s; a bad value is refused."""
    raw = (os.environ if env is None else env).get(STOP_GRACE_ENV)
    if raw is None or raw == "":
        return _DEFAULT_GRACE_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{STOP_GRACE_ENV}={raw!r}: must be a number of seconds > 0")
    return value


async def exit_if_stop_hangs(stop: asyncio.Event, name: str, grace_s: float) -> None:
    """Once ``stop`` is set, give the process ``grace_s`` to end; then end it (``os._exit``, no clean-up).

    For a process's entry point only (``service run``), never in a process that hosts other work (a test)."""
    await stop.wait()
    exit_after(grace_s, name)


def exit_after(grace_s: float, name: str) -> None:
    """End this process ``grace_s`` from now unless it has ended by then (a daemon timer thread)."""

    def _exit() -> None:
        # os.write, not logging: the logging lock may be held by the thread that hangs.
        why = "something it waits on no longer answers"
        os.write(2, f"{name}: did not stop within {grace_s:g} s of being asked to ({why}); exiting\n".encode())
        os._exit(EXIT_STOP_HUNG)

    timer = threading.Timer(grace_s, _exit)
    timer.daemon = True  # an orderly stop ends the process before the timer fires
    timer.start()
