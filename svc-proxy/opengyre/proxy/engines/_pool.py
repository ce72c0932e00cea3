"""The rollout engine pool: which engines take requests, how many each, and draining.

Engines enter from cell events (or static configuration) and leave by draining: routing stops, their
in-flight requests are aborted, and each request's dispatcher re-issues the rest of it elsewhere (see
``_dispatch``). With no free engine a request waits in a bounded queue, then gets a retryable 429.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import httpx
from prometheus_client.core import GaugeMetricFamily, Metric

from .._metrics import counter, gauge
from ._client import EngineClient, EngineConnection, EngineOptions, RolloutEngine
from ._vllm import VLLM_SCHEME, VllmClient

__all__ = ["EngineHandle", "EnginePool", "KVMigrator", "NoCapacity", "RePrefill"]

log = logging.getLogger(__name__)


class NoCapacity(Exception):
    """No rollout engine could take the request in time (the gateway answers 429 with Retry-After)."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


_EXCEEDED_KEPT = 40_000  # executions remembered as having gone past their own bound (least recent forgotten)


@dataclass(eq=False)
class EngineHandle:
    engine_id: str
    url: str
    client: RolloutEngine
    source: str = "static"  # "static" | "cell" | "grpc"
    state: str = "active"  # active | unhealthy | draining | gone
    inflight: set[str] = field(default_factory=set)
    failures: int = 0  # consecutive failed requests
    incremental: bool = False  # the engine streams deltas (SGLang's --incremental-streaming-output)
    context_length: int | None = None  # what the engine said it serves (None: it did not say)
    served: int = 0
    rerouted: int = 0
    added_at: float = field(default_factory=time.time)


class KVMigrator(Protocol):
    """Moves a request's KV cache from a draining engine to its new one before the request is re-issued.

    Return True when the target now holds the prefix, False to let the target re-prefill it. The RDMA
    transfer of the paper plugs in here; the CPU engine re-prefills (its prefix cache makes that cheap).
    """

    async def migrate(self, rid: str, source: EngineHandle, target: EngineHandle, tokens: Sequence[int]) -> bool: ...


class RePrefill:
    """The default migrator: nothing moves; the target engine recomputes the prefix."""

    def __init__(self) -> None:
        self.calls = 0
        self.tokens = 0

    async def migrate(self, rid: str, source: EngineHandle, target: EngineHandle, tokens: Sequence[int]) -> bool:
        self.calls += 1
        self.tokens += len(tokens)
        return False


class EnginePool:
    def __init__(
        self,
        *,
        max_inflight_per_engine: int = 256,
        max_queue: int = 1024,
        queue_timeout_s: float = 30.0,
        retry_after_s: float = 2.0,
        migrator: KVMigrator | None = None,
        engine_options: EngineOptions | None = None,
        own_excess_inflight: int | None = None,
    ) -> None:
        """``own_excess_inflight``: the requests one execution (the affinity key) may hold at a time, in flight or
        waiting; one past it is refused at once (NoCapacity) and the execution is remembered as having gone past
        its own bound (``exceeded_own``). None: no bound."""
        if own_excess_inflight is not None and own_excess_inflight < 1:
            raise ValueError("own_excess_inflight must be >= 1 (or None)")
        self.engine_options = engine_options or EngineOptions()  # how every engine's connection is made
        self.max_inflight = max_inflight_per_engine
        self.max_queue = max_queue
        self.queue_timeout_s = queue_timeout_s
        self.retry_after_s = retry_after_s
        self.own_excess_inflight = own_excess_inflight
        self._held: collections.Counter[str] = collections.Counter()  # per execution: held or waiting
        self._holder: dict[str, str] = {}  # request id -> its execution
        self._exceeded: collections.OrderedDict[str, None] = collections.OrderedDict()
        self.migrator: KVMigrator = migrator or RePrefill()
        self._engines: dict[str, EngineHandle] = {}
        self._affinity: dict[str, str] = {}
        self._cond = asyncio.Condition()
        self.waiting = 0
        self.rejected = 0
        self.unhealthy_after = 3
        self.probe_interval_s = 1.0
        self._probes: dict[str, asyncio.Task[None]] = {}
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(None, connect=5.0), limits=httpx.Limits(max_connections=4096)
        )

    async def close(self) -> None:
        for t in self._probes.values():
            t.cancel()
        for h in self._engines.values():
            await h.client.close()
        await self._http.aclose()

    # --- membership -------------------------------------------------------------------------------------

    def engines(self) -> list[EngineHandle]:
        return list(self._engines.values())

    def metrics(self) -> Iterator[Metric]:
        """The pool's figures for ``/metrics``: engines by state, in flight per engine, the queue."""
        engines = self.engines()
        by_state = GaugeMetricFamily("opengyre_proxy_engines", "Engines in the pool, by state.", labels=["state"])
        for s in ("active", "unhealthy", "draining"):
            by_state.add_metric([s], sum(1 for h in engines if h.state == s))
        yield by_state
        inflight = GaugeMetricFamily("opengyre_proxy_inflight", "Requests in flight per engine.", labels=["engine"])
        for h in engines:
            inflight.add_metric([h.engine_id], len(h.inflight))
        yield inflight
        yield gauge("opengyre_proxy_queue_waiting", "Requests waiting for capacity.", self.waiting)
        yield counter("opengyre_proxy_queue_rejected_total", "Requests refused for capacity.", self.rejected)

    def get(self, engine_id: str) -> EngineHandle | None:
        return self._engines.get(engine_id)

    async def add(self, engine_id: str, url: str, *, source: str = "static") -> EngineHandle:
        """Route to ``url`` under ``engine_id`` (an existing id is re-pointed and re-activated).

        Raises ValueError for a URL no engine client speaks (``http://`` or ``vllm+http://``).
        """
        h = self._engines.get(engine_id)
        if h is None or h.url != url.rstrip("/"):
            old = h
            vllm = url.startswith(VLLM_SCHEME)  # vllm+http://: vLLM's server
            conn = EngineConnection(url.removeprefix(VLLM_SCHEME), self.engine_options, http=self._http)
            client: RolloutEngine = VllmClient(conn) if vllm else EngineClient(conn)
            h = EngineHandle(engine_id, url.rstrip("/"), client, source)
            h.incremental = await h.client.incremental_streaming()
            h.context_length = await h.client.context_length()
            self._engines[engine_id] = h
            if old is not None:
                await old.client.close()  # its keep-alive connections (requests on it finish first)
        h.state = "active"
        async with self._cond:
            self._cond.notify_all()
        log.info("engine %s at %s is taking requests", engine_id, url)
        return h

    async def drain(self, engine_id: str, *, remove: bool = True, timeout: float = 30.0) -> int:
        """Stop routing to an engine and move its in-flight requests elsewhere; returns how many moved."""
        h = self._engines.get(engine_id)
        if h is None:
            return 0
        h.state = "draining"
        moving = list(h.inflight)
        await asyncio.gather(*(h.client.abort(rid) for rid in moving))
        deadline = time.monotonic() + timeout
        while h.inflight and time.monotonic() < deadline:  # noqa: ASYNC110 -- bounded; in-flight sets signal nothing
            await asyncio.sleep(0.01)
        if remove and h.state == "draining":
            h.state = "gone"
            self._engines.pop(engine_id, None)
            for k in [k for k, v in self._affinity.items() if v == engine_id]:
                del self._affinity[k]
            await h.client.close()  # no keep-alive connection outlives the engine's membership
        log.info("engine %s drained (%d requests moved)", engine_id, len(moving))
        return len(moving)

    # --- routing ----------------------------------------------------------------------------------------

    def _pick(self, affinity: str, exclude: frozenset[str]) -> EngineHandle | None:
        sticky = self._engines.get(self._affinity.get(affinity, ""))
        if (
            sticky
            and sticky.state == "active"
            and sticky.engine_id not in exclude
            and len(sticky.inflight) < self.max_inflight
        ):
            return sticky  # the same engine for an execution keeps its prefix cache warm
        best: EngineHandle | None = None
        for h in self._engines.values():
            if h.state != "active" or h.engine_id in exclude or len(h.inflight) >= self.max_inflight:
                continue
            if best is None or len(h.inflight) < len(best.inflight):
                best = h
        if best is not None:
            self._affinity[affinity] = best.engine_id
        return best

    def held(self, affinity: str) -> int:
        """The requests the execution holds now: in flight on an engine, or waiting for one."""
        return self._held.get(affinity, 0)

    def exceeded_own(self, affinity: str) -> bool:
        """Whether the execution ever asked for more than ``own_excess_inflight`` requests at a time: its capacity
        failures may then be of its own making (a flood), not the fleet's."""
        return affinity in self._exceeded

    async def acquire(self, affinity: str, rid: str, *, exclude: frozenset[str] = frozenset()) -> EngineHandle:
        """An engine for request ``rid`` (tracked as in flight there until ``release``)."""
        bound = self.own_excess_inflight
        if bound is not None and self._held[affinity] >= bound:
            self.rejected += 1
            self._exceeded[affinity] = None
            self._exceeded.move_to_end(affinity)
            while len(self._exceeded) > _EXCEEDED_KEPT:
                self._exceeded.popitem(last=False)
            raise NoCapacity(
                f"this execution holds {self._held[affinity]} requests already (own_excess_inflight={bound})",
                self.retry_after_s,
            )
        self._held[affinity] += 1
        try:
            h = await self._acquire(affinity, exclude)
        except BaseException:
            self._unhold(affinity)
            raise
        h.inflight.add(rid)
        h.served += 1
        self._holder[rid] = affinity
        return h

    def _unhold(self, affinity: str) -> None:
        self._held[affinity] -= 1
        if self._held[affinity] <= 0:
            del self._held[affinity]

    async def _acquire(self, affinity: str, exclude: frozenset[str]) -> EngineHandle:
        h = self._pick(affinity, exclude)
        if h is None:
            if self.waiting >= self.max_queue:
                self.rejected += 1
                raise NoCapacity("the rollout queue is full", self.retry_after_s)
            self.waiting += 1
            try:
                async with self._cond:
                    try:
                        async with asyncio.timeout(self.queue_timeout_s):
                            while (h := self._pick(affinity, exclude)) is None:
                                await self._cond.wait()
                    except TimeoutError:
                        self.rejected += 1
                        raise NoCapacity(
                            f"no rollout engine became free within {self.queue_timeout_s:g}s", self.retry_after_s
                        ) from None
            finally:
                self.waiting -= 1
        return h

    async def release(self, h: EngineHandle, rid: str) -> None:
        h.inflight.discard(rid)
        affinity = self._holder.pop(rid, None)
        if affinity is not None:
            self._unhold(affinity)
        if self.waiting:
            async with self._cond:
                self._cond.notify_all()

    # --- health ---------------------------------------------------------------------------------------

    def report(self, h: EngineHandle, ok: bool) -> None:
        """A request's fate on ``h``: consecutive failures take it out of routing until /health answers."""
        if ok:
            h.failures = 0
            return
        h.failures += 1
        if h.failures >= self.unhealthy_after and h.state == "active":
            h.state = "unhealthy"
            log.warning(
                "engine %s failed %d requests in a row: probing it before routing again", h.engine_id, h.failures
            )
            self._probes[h.engine_id] = asyncio.create_task(self._probe(h), name=f"probe-{h.engine_id}")

    async def _probe(self, h: EngineHandle) -> None:
        try:
            while h.state == "unhealthy" and self._engines.get(h.engine_id) is h:
                if await h.client.health():
                    h.state = "active"
                    h.failures = 0
                    async with self._cond:
                        self._cond.notify_all()
                    log.info("engine %s is healthy again", h.engine_id)
                    return
                await asyncio.sleep(self.probe_interval_s)
        finally:
            self._probes.pop(h.engine_id, None)
