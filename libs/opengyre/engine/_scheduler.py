"""Continuous batching on one worker thread: admit, chunked prefill, one batched decode step, repeat.

Requests join and leave the running batch between steps; HTTP handlers (on the asyncio loop) submit work
and receive per-step updates through thread-safe callbacks, so the model never runs on the event loop.
Control operations (weight reloads) run on the same thread between steps, never in the middle of one.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from ._constraint import TokenConstraint
from ._prefix_cache import PrefixCache
from ._runner import KVCache, ModelRunner
from ._sampling import SamplingParams, sample_next

__all__ = ["EngineRequest", "RequestRecord", "Scheduler", "StepUpdate"]

log = logging.getLogger(__name__)

T = TypeVar("T")

FinishReason = dict[str, Any]


@dataclass(frozen=True, slots=True)
class StepUpdate:
    """What one scheduler step added to a request (ids and logprobs are deltas)."""

    new_ids: tuple[int, ...]
    new_logprobs: tuple[float, ...]
    new_top: tuple[list[list[Any]], ...] | None
    finish: FinishReason | None
    cached_tokens: int
    weight_version: str
    input_logprobs: tuple[float | None, ...] | None = None


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """The engine's own account of one request: what it consumed and what it produced."""

    rid: str
    input_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    output_logprobs: tuple[float, ...]
    finish_reason: FinishReason
    weight_version: str
    cached_tokens: int
    created: float
    finished: float


@dataclass(eq=False)
class EngineRequest:
    rid: str
    input_ids: list[int]
    params: SamplingParams
    on_update: Callable[[StepUpdate], None]
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    # --- state, owned by the scheduler thread ---
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    cache: KVCache | None = None
    prefilled: int = 0
    cached_tokens: int = 0
    finish: FinishReason | None = None
    generator: torch.Generator | None = None
    counts: torch.Tensor | None = None
    created: float = field(default_factory=time.time)
    aborted: bool = False
    constraint: TokenConstraint | None = None  # constrained decoding (regex / json_schema)


class Scheduler:
    def __init__(
        self,
        runner: ModelRunner,
        *,
        eos_ids: frozenset[int],
        decode_tail: Callable[[list[int]], str],
        weight_version: str = "default",
        max_running: int = 256,
        prefill_chunk: int = 1024,
        context_length: int = 32768,
        prefix_cache_tokens: int = 262144,
        request_log_size: int = 100_000,
    ) -> None:
        self.runner = runner
        self.eos_ids = eos_ids
        self._decode_tail = decode_tail
        self.weight_version = weight_version
        self.max_running = max_running
        self.prefill_chunk = prefill_chunk
        self.context_length = context_length
        self.prefix_cache = PrefixCache(prefix_cache_tokens)
        self.request_log: collections.deque[RequestRecord] = collections.deque(maxlen=request_log_size)
        self.steps = 0
        self.prefill_tokens = 0  # prompt positions this engine computed (a prefix-cache hit computes none)
        self.kv_exports = 0  # sequences' KV exported and imported (``_kv_transfer``)
        self.kv_imports = 0
        self.kv_imported_tokens = 0
        self._cond = threading.Condition()
        self._inbox: list[EngineRequest] = []
        self._aborts: list[tuple[str, bool]] = []
        self._controls: list[tuple[Callable[[], Any], Future[Any]]] = []
        self._waiting: collections.deque[EngineRequest] = collections.deque()
        self._prefilling: list[EngineRequest] = []
        self._decoding: list[EngineRequest] = []
        self._stop = False
        self.paused = False  # /pause_generation in_place or retract: requests stay, no step runs
        self._thread = threading.Thread(target=self._loop, name="opengyre-engine", daemon=True)

    # --- called from any thread ---------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._thread.join(timeout=10)

    def submit(self, req: EngineRequest) -> None:
        with self._cond:
            self._inbox.append(req)
            self._cond.notify()

    def abort(self, rid: str, abort_all: bool = False) -> None:
        """Abort requests whose rid starts with ``rid`` (SGLang's prefix match), or all of them."""
        with self._cond:
            self._aborts.append((rid, abort_all))
            self._cond.notify()

    def call(self, fn: Callable[[], T]) -> Future[T]:
        """Run ``fn`` on the engine thread between two steps."""
        fut: Future[T] = Future()
        with self._cond:
            self._controls.append((fn, fut))
            self._cond.notify()
        return fut

    def set_paused(self, paused: bool) -> None:
        with self._cond:
            self.paused = paused
            self._cond.notify()

    def running(self, rid: str) -> EngineRequest | None:
        """The request ``rid`` while the engine holds it (engine thread only: between two steps)."""
        for req in (*self._prefilling, *self._decoding):
            if req.rid == rid:
                return req
        return None

    @property
    def load(self) -> int:
        return len(self._waiting) + len(self._prefilling) + len(self._decoding) + len(self._inbox)

    # --- the engine thread --------------------------------------------------------------------------

    def _busy(self) -> bool:
        return not self.paused and bool(self._waiting or self._prefilling or self._decoding)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not (self._stop or self._inbox or self._aborts or self._controls or self._busy()):
                    self._cond.wait()
                if self._stop:
                    break
                inbox, self._inbox = self._inbox, []
                aborts, self._aborts = self._aborts, []
                controls, self._controls = self._controls, []
            self._waiting.extend(inbox)
            for rid, abort_all in aborts:
                self._abort(rid, abort_all)
            for fn, fut in controls:
                try:
                    fut.set_result(fn())
                except BaseException as exc:
                    fut.set_exception(exc)
            if self.paused:
                continue
            try:
                self._step()
            except Exception as exc:  # a bug must not leave clients hanging: fail the requests in flight
                log.exception("engine step failed")
                for req in [*self._waiting, *self._prefilling, *self._decoding]:
                    self._finish(req, {"type": "abort", "message": f"engine error: {exc}", "status_code": 500})
                self._waiting.clear()
                self._prefilling.clear()
                self._decoding.clear()
        for req in [*self._waiting, *self._prefilling, *self._decoding]:
            self._finish(req, {"type": "abort", "message": "engine shutting down", "status_code": 503})

    def _abort(self, rid: str, abort_all: bool) -> None:
        if not abort_all and not rid:
            return  # SGLang ignores an empty rid without abort_all
        for queue in (self._waiting, self._prefilling, self._decoding):
            for req in list(queue):
                if abort_all or req.rid.startswith(rid):
                    req.aborted = True
                    queue.remove(req)
                    self._finish(req, {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None})

    def _admit(self) -> None:
        while self._waiting and len(self._prefilling) + len(self._decoding) < self.max_running:
            req = self._waiting.popleft()
            try:
                self._set_up_sampling(req)
            except Exception as exc:  # this request's own setup (a seed the generator cannot take): fail it alone
                log.warning("request %s: sampling setup failed: %s", req.rid, exc)
                msg = f"the request's sampling could not be set up: {exc}"
                self._finish(req, {"type": "abort", "message": msg, "status_code": 400})
                continue
            if req.params.max_new_tokens == 0:
                self._finish(req, {"type": "length", "length": 0})
                continue
            hit, cache = (0, None)
            if req.logprob_start_len < 0:  # prompt logprobs need logits for every position: no reuse
                hit, cache = self.prefix_cache.lookup(req.input_ids)
            req.cache = cache if cache is not None else self.runner.new_cache()
            req.prefilled = hit
            req.cached_tokens = hit
            self._prefilling.append(req)

    def _set_up_sampling(self, req: EngineRequest) -> None:
        if req.params.seed is not None:
            req.generator = torch.Generator().manual_seed(req.params.seed)
        if req.params.penalised:
            req.counts = torch.zeros(self.runner.vocab_size)

    def _step(self) -> None:
        self._admit()
        budget = self.prefill_chunk
        updates: list[tuple[EngineRequest, StepUpdate]] = []
        packed: list[tuple[EngineRequest, int]] = []  # prefilled together, in one forward pass
        for req in list(self._prefilling):
            if budget <= 0:
                break  # the budget ran out inside a prompt; the next step continues it
            assert req.cache is not None
            n = min(budget, len(req.input_ids) - req.prefilled)
            budget -= n
            if req.logprob_start_len < 0:
                packed.append((req, n))
                continue
            # Prompt logprobs: this request alone, on the trainer's kernels (see ModelRunner.prefill).
            start = req.prefilled
            logits = self.runner.prefill(req.cache, req.input_ids[start : start + n], all_logits=True)
            self.prefill_tokens += n
            lp = torch.log_softmax(logits, dim=-1)
            nxt = req.input_ids[start + 1 : start + n + 1]
            vals = lp[: len(nxt)].gather(-1, torch.tensor(nxt).unsqueeze(-1)).squeeze(-1).tolist() if nxt else []
            input_lps = ((None,) if start == 0 else ()) + tuple(float(v) for v in vals)
            updates.append((req, self._update(req, (), (), None, input_lps)))
            self._prefilled(req, n, logits[-1], updates)
        if packed:
            chunks = [req.input_ids[req.prefilled : req.prefilled + n] for req, n in packed]
            last = self.runner.prefill_many([req.cache for req, _ in packed if req.cache is not None], chunks)
            self.prefill_tokens += sum(n for _, n in packed)
            for j, (req, n) in enumerate(packed):
                self._prefilled(req, n, last[j], updates)
        # Requests that just finished prefill already sampled their first token this step.
        fresh = {id(r) for r, u in updates if u.new_ids}
        batch = [
            r
            for r in self._decoding
            if r.finish is None and r.output_ids and r.cache is not None and id(r) not in fresh
        ]
        if batch:
            caches = [r.cache for r in batch if r.cache is not None]
            logits = self.runner.decode(caches, [r.output_ids[-1] for r in batch])
            for j, req in enumerate(batch):
                updates.append((req, self._sample(req, logits[j])))
        self.steps += 1
        self._decoding = [r for r in self._decoding if r.finish is None]
        for req, upd in updates:
            req.on_update(upd)

    def _prefilled(
        self, req: EngineRequest, n: int, logits: torch.Tensor, updates: list[tuple[EngineRequest, StepUpdate]]
    ) -> None:
        """``n`` more prompt tokens of ``req`` are in its cache; at the prompt's end it samples its first token."""
        req.prefilled += n
        if req.prefilled < len(req.input_ids):
            return
        self._prefilling.remove(req)
        self._decoding.append(req)
        updates.append((req, self._sample(req, logits)))

    def _update(
        self,
        req: EngineRequest,
        ids: tuple[int, ...],
        lps: tuple[float, ...],
        top: tuple[list[list[Any]], ...] | None,
        input_lps: tuple[float | None, ...] | None = None,
    ) -> StepUpdate:
        return StepUpdate(
            new_ids=ids,
            new_logprobs=lps,
            new_top=top,
            finish=req.finish,
            cached_tokens=req.cached_tokens,
            weight_version=self.weight_version,
            input_logprobs=input_lps,
        )

    def _sample(self, req: EngineRequest, logits: torch.Tensor) -> StepUpdate:
        p = req.params
        ban: frozenset[int] = frozenset()
        if len(req.output_ids) < p.min_new_tokens:
            ban = self.eos_ids | p.stop_token_ids
        allow = req.constraint.allowed() if req.constraint is not None else None
        tok, lps = sample_next(logits, p, req.generator, counts=req.counts, ban=ban, allow=allow)
        if req.constraint is not None and tok not in self.eos_ids:
            req.constraint.advance(self._decode_tail([tok]))
        lp = float(lps[tok])
        top = None
        if req.top_logprobs_num > 0:
            vals, idx = torch.topk(lps, min(req.top_logprobs_num, lps.numel()))
            top = ([[float(v), int(i), None] for v, i in zip(vals.tolist(), idx.tolist(), strict=True)],)
        req.output_ids.append(tok)
        req.output_logprobs.append(lp)
        if req.counts is not None:
            req.counts[tok] += 1
        n = len(req.output_ids)
        if (not p.ignore_eos and tok in self.eos_ids) or tok in p.stop_token_ids:
            req.finish = {"type": "stop", "matched": tok}
        elif p.stop and (hit := self._stop_string(req)) is not None:
            req.finish = {"type": "stop", "matched": hit}
        elif n >= p.max_new_tokens:
            req.finish = {"type": "length", "length": p.max_new_tokens}
        elif len(req.input_ids) + n >= self.context_length:
            req.finish = {"type": "length", "length": n}
        upd = self._update(req, (tok,), (lp,), top)
        if req.finish is not None:
            self._record(req)
        return upd

    def _stop_string(self, req: EngineRequest) -> str | None:
        longest = max(len(s) for s in req.params.stop)
        tail = self._decode_tail(req.output_ids[-(longest + 8) :])
        for s in req.params.stop:
            if s in tail:
                return s
        return None

    def _finish(self, req: EngineRequest, reason: FinishReason) -> None:
        req.finish = reason
        self._record(req)
        req.on_update(self._update(req, (), (), None))

    def _record(self, req: EngineRequest) -> None:
        assert req.finish is not None
        self.request_log.append(
            RequestRecord(
                rid=req.rid,
                input_ids=tuple(req.input_ids),
                output_ids=tuple(req.output_ids),
                output_logprobs=tuple(req.output_logprobs),
                finish_reason=req.finish,
                weight_version=self.weight_version,
                cached_tokens=req.cached_tokens,
                created=req.created,
                finished=time.time(),
            )
        )
        cache, req.cache = req.cache, None
        if cache is None:
            return
        # An aborted request's KV is kept too (as SGLang's radix cache keeps it): a drained engine's requests are
        # aborted, and their KV is what a migration to the next engine exports (``_kv_transfer``).
        keep = self.prefix_cache.accepts(cache.length)
        self.runner.release(cache, keep=keep)
        if keep:
            covered = req.input_ids + req.output_ids
            self.prefix_cache.insert(covered[: cache.length], cache)
