"""The process's startup heap, frozen once: out of the cyclic collector's reach.

The gateway's process imports torch and transformers (the tokenizer) and holds over a million objects before it
serves a call; every full collection walked all of them again, and the allocations of a few hundred calls set one
off. In svc-proxy/bench/proxy_bench.py --cpu that was ~0.19 ms of the ~1.0 ms of gateway CPU per call
(docs/benchmarks.md). Frozen objects are still freed by reference counting; only cycles among them stay.
"""

from __future__ import annotations

import gc

__all__ = ["freeze_startup_heap"]

_frozen = False


def freeze_startup_heap() -> bool:
    """Collect what is garbage now, then freeze the rest (once per process: later calls do nothing, so a process
    that starts many gateways, a test run, does not freeze each one's leftovers). Whether this call froze it."""
    global _frozen
    if _frozen:
        return False
    _frozen = True
    gc.collect()
    gc.freeze()
    return True
