"""One logical generation that survives engines going away.

The request runs on one engine; if that engine is drained (its request comes back aborted) or breaks, the
rest is re-issued on another engine as ``prompt + tokens so far`` with the remaining budget, after the
KV-migration hook. The caller sees one stream of token deltas: each token exactly once, none lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from opengyre.wire import ApiError, Outcome

from ._client import EngineBadReply, EngineFailed, EngineRejected, EngineReply
from ._pool import EngineHandle, EnginePool, NoCapacity

__all__ = ["Dispatch"]

log = logging.getLogger(__name__)

_background: set[asyncio.Task[None]] = set()


def _abort_in_background(h: EngineHandle, rid: str) -> None:
    """Stop the engine's work on ``rid`` without waiting for it (the engine may be slow or gone)."""
    task = asyncio.get_running_loop().create_task(h.client.abort(rid))
    _background.add(task)
    task.add_done_callback(_background.discard)


class Dispatch:
    def __init__(
        self,
        pool: EnginePool,
        prompt_ids: list[int],
        sampling: dict[str, Any],
        *,
        rid: str,
        affinity: str,
        stream: bool = True,
        max_attempts: int = 8,
        top_logprobs: int = 0,
    ) -> None:
        self.pool = pool
        self.prompt_ids = prompt_ids
        self.sampling = sampling
        self.rid = rid
        self.affinity = affinity
        self.stream = stream
        self.max_attempts = max_attempts
        self.top_logprobs = top_logprobs  # alternatives per output token (0: none asked)
        self.outcome = Outcome(prompt_tokens=len(prompt_ids))
        self.engines: list[str] = []
        self.raw_logprobs = False  # an engine that answered returns raw-logit logprobs (see ``_temperature``)
        self.attempts = 0
        self.t0 = time.perf_counter()
        self.queued_ms = 0.0
        self.ttft_ms = 0.0
        self.total_ms = 0.0
        self._handle: EngineHandle | None = None
        self._rid_now = ""
        self._started = False

    def _next_rid(self) -> str:
        return f"{self.rid}-{self.attempts + 1}"

    async def start(self) -> None:
        """Get the first engine (waiting in the pool's queue); raises NoCapacity before any byte is sent."""
        self._rid_now = self._next_rid()
        self._handle = await self.pool.acquire(self.affinity, self._rid_now)
        self.queued_ms = (time.perf_counter() - self.t0) * 1e3

    async def release_if_unstarted(self) -> None:
        """Give the engine slot back if ``deltas`` never ran (the client left before the first byte)."""
        if self._handle is not None and not self._started:
            self._started = True
            await self.pool.release(self._handle, self._rid_now)

    async def _migrate(self, source: EngineHandle, target: EngineHandle) -> None:
        """The KV-migration hook; a failed migration is a re-prefill (the target gets every token either way)."""
        try:
            await self.pool.migrator.migrate(self._rid_now, source, target, self.prompt_ids + self.outcome.output_ids)
        except Exception:
            log.warning(
                "KV migration of %s from %s to %s failed: the target re-prefills",
                self._rid_now,
                source.engine_id,
                target.engine_id,
                exc_info=True,
            )

    async def deltas(self) -> AsyncIterator[tuple[list[int], list[float]]]:
        assert self._handle is not None, "call start() first"
        if self._started:
            return
        self._started = True
        out = self.outcome
        max_new = int(self.sampling.get("max_new_tokens", 128))
        min_new = int(self.sampling.get("min_new_tokens", 0))
        failed: set[str] = set()
        h: EngineHandle | None = self._handle
        source: EngineHandle | None = None  # the engine the previous attempt left (a re-issue)
        done = False
        try:
            while h is not None:
                self.attempts += 1
                self.engines.append(h.engine_id)
                self.raw_logprobs = self.raw_logprobs or h.client.raw_logprobs
                rid = self._rid_now
                sp = dict(self.sampling)
                sp["max_new_tokens"] = max_new - len(out.output_ids)
                if min_new:
                    sp["min_new_tokens"] = max(0, min_new - len(out.output_ids))
                payload = {
                    "rid": rid,
                    "input_ids": self.prompt_ids + out.output_ids,
                    "sampling_params": sp,
                    "return_logprob": True,
                    "stream": self.stream,
                }
                if self.top_logprobs:
                    payload["top_logprobs_num"] = self.top_logprobs
                reply = EngineReply()
                broke = False
                offset = len(out.output_ids)
                try:
                    if source is not None:
                        await self._migrate(source, h)
                    # Closed as soon as this generator is: the engine's connection (and, for vLLM, its request)
                    # must not wait for the garbage collector when the caller goes away.
                    async with contextlib.aclosing(
                        h.client.generate(payload, reply, incremental=h.incremental)
                    ) as chunks:
                        async for ids, lps in chunks:
                            if ids:
                                if not out.output_ids:
                                    self.ttft_ms = (time.perf_counter() - self.t0) * 1e3
                                out.output_ids.extend(ids)
                                out.output_logprobs.extend(lps)
                                if self.top_logprobs:
                                    got = reply.output_top[len(out.output_ids) - offset - len(ids) :]
                                    out.output_top.extend(got[: len(ids)] + [[]] * (len(ids) - len(got)))
                                yield ids, lps
                except EngineRejected as exc:
                    raise ApiError(
                        exc.status, "invalid_request", f"the engine refused the request: {exc.message}"
                    ) from exc
                except EngineBadReply as exc:
                    # Not retried elsewhere: a fleet that answers without logprobs must be fixed, not papered over.
                    self.pool.report(h, ok=False)
                    raise ApiError(
                        502, "api_error", f"rollout engine {h.engine_id} answered what cannot be recorded: {exc}"
                    ) from exc
                except EngineFailed as exc:
                    log.warning("engine %s failed on %s: %s", h.engine_id, rid, exc)
                    _abort_in_background(h, rid)  # e.g. a read timeout: the engine may still be generating
                    broke = True
                    failed.add(h.engine_id)
                    self.pool.report(h, ok=False)
                finally:
                    await self.pool.release(h, rid)
                out.weight_version = reply.weight_version
                produced = len(out.output_ids) - offset
                spans = reply.weight_spans or ([(reply.weight_version, 0, produced)] if produced else [])
                for version, a, b in spans:  # engine-relative indexes -> this call's output indexes
                    b = min(b, produced)
                    if b <= a:
                        continue
                    if (
                        out.weight_spans
                        and out.weight_spans[-1][0] == version
                        and out.weight_spans[-1][2] == offset + a
                    ):
                        out.weight_spans[-1] = (version, out.weight_spans[-1][1], offset + b)
                    else:
                        out.weight_spans.append((version, offset + a, offset + b))
                out.cached_tokens = (
                    max(out.cached_tokens, reply.cached_tokens) if self.attempts == 1 else out.cached_tokens
                )
                if not broke:
                    self.pool.report(h, ok=True)
                finish = reply.finish
                moved = broke or (finish is not None and finish.get("type") == "abort")
                if not moved:
                    out.finish = finish
                    done = True
                    return
                if len(out.output_ids) >= max_new:
                    out.finish = {"type": "length", "length": max_new}
                    done = True
                    return
                if self.attempts >= self.max_attempts:
                    out.finish = {"type": "abort", "message": "no engine finished the request", "status_code": 503}
                    done = True
                    return
                # Re-issue the rest elsewhere; a broken engine is avoided, a drained one is out of the pool.
                # The KV migration runs at the top of the next attempt, where the new slot is released whatever
                # happens.
                h.rerouted += 1
                self._rid_now = self._next_rid()
                source = h
                try:
                    h = await self.pool.acquire(self.affinity, self._rid_now, exclude=frozenset(failed))
                except NoCapacity as exc:
                    h = None
                    out.finish = {"type": "abort", "message": str(exc), "status_code": 503}
                    done = True
                    return
        finally:
            self.total_ms = (time.perf_counter() - self.t0) * 1e3
            if not done and h is not None and self._rid_now:
                # The caller went away mid-generation: stop the engine's work (without blocking the close).
                _abort_in_background(h, self._rid_now)
