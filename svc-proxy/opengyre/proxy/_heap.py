"""The process's startup heap, frozen once: out of the cyclic collector's reach.

The gateway's process imports torch and transformers (the tokenizer) and holds over a million objects before it
serves a call; every full collection walked all of them again, and the allocations of a few hundred calls set one
off. In svc-proxy/bench/proxy_bench.py --cpu that was ~0.19 ms of the ~1.0 ms of gateway CPU per call
(docs/benchmarks.md). Frozen objects are still freed by reference counting; only cycles among them stay.

The young generation is also collected every 10,000 net allocations instead of 700: a call allocates thousands of
short-lived containers, nearly all freed by reference counting first, and a collection every few hundred cost
more than the collector found (in the same bench the gateway's collections took 0.09-0.17 s over 2,764 calls with
700, 0.03-0.04 s with 10,000).
"""

from __future__ import annotations

import gc

__all__ = ["freeze_startup_heap"]

_frozen = False
_YOUNG = 10_000  # allocations (net of deallocations) between collections of the youngest generation


def freeze_startup_heap() -> bool:
    """Collect what is garbage now, then freeze the rest and space the young generation's collections (once per
    process: later calls do nothing, so a process that starts many gateways, a test run, does not freeze each one's
    leftovers). Whether this call froze it."""
    global _frozen
    if _frozen:
        return False
    _frozen = True
    gc.collect()
    gc.freeze()
    young, older, oldest = gc.get_threshold()
    gc.set_threshold(max(_YOUNG, young), older, oldest)
    return True
