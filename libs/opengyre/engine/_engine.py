"""The CPU engine: the shared policy model, its tokenizer, the scheduler thread, and an asyncio facade."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
import weakref
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import regex
import torch
from transformers import LlamaConfig

from opengyre.chat import ChatCodec
from opengyre.config import HttpLimits
from opengyre.models import load_checkpoint, load_tokenizer, load_weights, resolve_model, weights_digest

from ._constraint import TokenConstraint, TokenVocabulary
from ._runner import ModelRunner
from ._sampling import SamplingParams
from ._scheduler import EngineRequest, RequestRecord, Scheduler, StepUpdate

__all__ = ["CpuEngine", "EngineConfig", "Generation"]


@dataclass(frozen=True)
class EngineConfig:
    preset: str = "tiny"  # a model name for opengyre.models.resolve_model: tiny, small, smollm2-135m, a folder, a .gguf
    checkpoint: Path | None = None  # a folder written by opengyre.models.save_checkpoint (weights of that model)
    model_cache: Path | None = None  # where a pretrained model is converted once (default: <data_dir>/models)
    seed: int = 0
    weight_version: str = "default"
    served_model_name: str | None = None  # default: opengyre-<preset>
    host: str = "127.0.0.1"
    port: int = 0
    api_key: str | None = None
    max_running: int = 256
    prefill_chunk: int = 1024
    context_length: int | None = None  # default: the model's max positions
    prefix_cache_tokens: int = 262144
    threads: int | None = None  # torch intra-op threads (process-wide)
    # Generation's GEMM kernel (``_runner.PROJECTIONS``): onednn (float32), onednn-bf16 (the decoder layers in
    # bfloat16, as GPU RL engines serve), exact (the trainer's own). Prompt logprobs always take exact.
    projections: str = "onednn"
    incremental_streaming_output: bool = False  # SGLang's flag: stream deltas instead of cumulative chunks
    request_log_size: int = 100_000
    # What one HTTP client can make the server hold (keep-alive included; SGLang's uvicorn keeps 5 s). None: the
    # environment's OPENGYRE_HTTP_* (HttpLimits.from_env), what a child engine of a stack is handed.
    http: HttpLimits | None = None

    @property
    def model_name(self) -> str:
        return self.served_model_name or f"opengyre-{self.preset}"


@dataclass
class Generation:
    """Cumulative state of one request, updated as the scheduler reports steps."""

    rid: str
    prompt_len: int
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    output_top: list[list[list[Any]]] = field(default_factory=list)
    input_logprobs: list[float | None] = field(default_factory=list)
    finish: dict[str, Any] | None = None
    cached_tokens: int = 0
    weight_version: str = "default"
    weight_spans: list[list[Any]] = field(default_factory=list)  # [version, start, end) over output indexes
    created: float = field(default_factory=time.perf_counter)

    def apply(self, u: StepUpdate) -> None:
        if u.new_ids:
            n = len(self.output_ids)
            if self.weight_spans and self.weight_spans[-1][0] == u.weight_version:
                self.weight_spans[-1][2] = n + len(u.new_ids)
            else:
                self.weight_spans.append([u.weight_version, n, n + len(u.new_ids)])
        self.output_ids.extend(u.new_ids)
        self.output_logprobs.extend(u.new_logprobs)
        if u.new_top:
            self.output_top.extend(u.new_top)
        if u.input_logprobs:
            self.input_logprobs.extend(u.input_logprobs)
        self.finish = u.finish
        self.cached_tokens = u.cached_tokens
        self.weight_version = u.weight_version


class CpuEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        if config.threads:
            torch.set_num_threads(config.threads)
        source = resolve_model(config.preset, config.model_cache)
        # The weights mapped from the checkpoint file, not copied: the engines of a run share its pages.
        if config.checkpoint is not None:
            model, version = load_checkpoint(Path(config.checkpoint), share=True)
        else:
            model, version = source.load(seed=config.seed, weight_version=config.weight_version, share=True)
        self.model = model
        self.model_path = str(config.checkpoint or source.checkpoint or f"preset:{config.preset}")
        self.tokenizer_path = str(source.tokenizer_dir)
        self.codec = ChatCodec(load_tokenizer(self.tokenizer_path))
        self.runner = ModelRunner(model, projections=config.projections)
        cfg: LlamaConfig = model.config
        eos = {self.codec.eos_id}
        if isinstance(cfg.eos_token_id, int):
            eos.add(cfg.eos_token_id)
        self.context_length = int(config.context_length or cfg.max_position_embeddings)
        self.scheduler = Scheduler(
            self.runner,
            eos_ids=frozenset(eos),
            # Stop strings match the decoded text only: a special token's spelling is not text.
            decode_tail=lambda ids: self.codec.decode(ids),
            weight_version=version,
            max_running=config.max_running,
            prefill_chunk=config.prefill_chunk,
            context_length=self.context_length,
            prefix_cache_tokens=config.prefix_cache_tokens,
            request_log_size=config.request_log_size,
        )
        self.paused = False
        self._digest: str | None = None  # the sha256 of the weights, once asked for (reset by a reload)
        self._started = False
        self._vocabulary: TokenVocabulary | None = None

    def constraint(self, pattern: str) -> TokenConstraint:
        """A fresh decoding constraint for one request (the token texts are gathered on first use)."""
        if self._vocabulary is None:
            self._vocabulary = TokenVocabulary(self.codec, self.vocab_size)
        return TokenConstraint(regex.compile(pattern), self._vocabulary, self.scheduler.eos_ids)

    @property
    def weight_version(self) -> str:
        return self.scheduler.weight_version

    def weights_sha256(self) -> str:
        """The digest of the weights being served (engine thread: computed once per loaded version)."""
        if self._digest is None:
            self._digest = weights_digest(self.model)
        return self._digest

    @property
    def vocab_size(self) -> int:
        return self.runner.vocab_size

    def start(self) -> None:
        if not self._started:
            self.scheduler.start()
            self._started = True

    def stop(self) -> None:
        if self._started:
            self.scheduler.stop()
            self._started = False

    async def generate(
        self,
        input_ids: list[int],
        params: SamplingParams,
        *,
        rid: str | None = None,
        return_logprob: bool = False,
        logprob_start_len: int = -1,
        top_logprobs_num: int = 0,
    ) -> AsyncGenerator[Generation, None]:
        """Yield the cumulative state after every step until the request finishes.

        Closing the iterator early (a client went away) aborts the request on the engine.
        """
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[StepUpdate] = asyncio.Queue()
        rid = rid or uuid.uuid4().hex
        req = EngineRequest(
            rid=rid,
            input_ids=list(input_ids),
            params=params,
            on_update=lambda u: _mailbox(loop).post(queue, u),
            return_logprob=return_logprob,
            logprob_start_len=logprob_start_len,
            top_logprobs_num=top_logprobs_num,
            constraint=self.constraint(params.constraint) if params.constraint is not None else None,
        )
        gen = Generation(rid=rid, prompt_len=len(input_ids), weight_version=self.weight_version)
        self.scheduler.submit(req)
        done = False
        try:
            while not done:
                u = await queue.get()
                gen.apply(u)
                # Coalesce what is already queued: a slow reader gets fewer, larger chunks.
                while not queue.empty() and gen.finish is None:
                    gen.apply(queue.get_nowait())
                done = gen.finish is not None
                yield gen
        finally:
            if not done:
                with contextlib.suppress(Exception):
                    self.scheduler.abort(rid)

    def abort(self, rid: str, abort_all: bool = False) -> None:
        self.scheduler.abort(rid, abort_all)

    async def update_weights_from_disk(
        self, model_path: str, weight_version: str | None = None, *, abort_all_requests: bool = False
    ) -> str:
        """Hot-reload a safetensors checkpoint between two steps; returns the new weight version.

        The weights are verified against the checkpoint's digest first: a corrupt or unverifiable checkpoint is
        refused (``CheckpointError``) and the engine keeps serving what it served, under the same version."""

        def load() -> str:
            # mapped, not copied in place: engines reloading the same published checkpoint share it again
            version = load_weights(self.model, Path(model_path), verify=True, share=True)
            self.runner.weights_changed()  # the packed projections are copies of the old weights
            self._digest = None
            self.scheduler.weight_version = weight_version or version
            self.scheduler.prefix_cache.clear()  # cached keys and values came from the old weights
            self.model_path = model_path
            return self.scheduler.weight_version

        if abort_all_requests:
            self.scheduler.abort("", abort_all=True)
        return await asyncio.wrap_future(self.scheduler.call(load))

    async def set_weight_version(self, version: str) -> None:
        def setv() -> None:
            self.scheduler.weight_version = version

        await asyncio.wrap_future(self.scheduler.call(setv))

    async def flush_cache(self) -> None:
        await asyncio.wrap_future(self.scheduler.call(self.scheduler.prefix_cache.clear))

    def request_log(self, rid: str | None = None) -> list[RequestRecord]:
        records = list(self.scheduler.request_log)
        return [r for r in records if rid is None or r.rid == rid or r.rid.startswith(rid)]


class _Mailbox:
    """Step updates for one event loop, handed over in bulk: one wake-up of the loop per scheduler step (not one
    per request), so the engine thread does not wait on a busy loop thread for each request it updates."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._pending: list[tuple[asyncio.Queue[StepUpdate], StepUpdate]] = []

    def post(self, queue: asyncio.Queue[StepUpdate], u: StepUpdate) -> None:
        with self._lock:
            self._pending.append((queue, u))
            if len(self._pending) > 1:
                return  # a drain is scheduled already and will take this one too
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is closed: nobody is waiting for these updates any more
            with self._lock:
                self._pending.clear()

    def _drain(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for queue, u in pending:
            queue.put_nowait(u)


_mailboxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Mailbox] = weakref.WeakKeyDictionary()
_mailboxes_lock = threading.Lock()


def _mailbox(loop: asyncio.AbstractEventLoop) -> _Mailbox:
    with _mailboxes_lock:
        box = _mailboxes.get(loop)
        if box is None:
            box = _mailboxes[loop] = _Mailbox(loop)
        return box
