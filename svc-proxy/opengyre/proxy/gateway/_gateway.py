"""The harness-facing gateway: OpenAI and Anthropic routes per execution, TITO, recording, rerouting.

``/x/{execution_id}/v1/...`` is an execution's base URL (``/v1/...`` works too: the key names the
execution). Every call is rendered to tokens here, generated on a rollout engine through the pool, and
recorded as a ``ModelCallRecorded`` event once its output is complete, before the last bytes go out.
Rejected calls (bad JSON, unknown model, bad key, too large, over the context, no capacity) record nothing.
"""

from __future__ import annotations

import asyncio
import collections
import fnmatch
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
from prometheus_client.core import CounterMetricFamily, Metric
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from opengyre.asgi import HttpServer, Json, Refusal, RequestHead
from opengyre.chat import ChatCodec
from opengyre.config import HttpLimits
from opengyre.eventlog import EventLog
from opengyre.events import (
    CallTimings,
    ModelCallRecorded,
    ToolCallPayload,
    TrajectoryRole,
    WeightSpan,
)
from opengyre.models import load_tokenizer
from opengyre.tito import ExecutionTrajectory, Plan
from opengyre.trajectory import PayloadUnavailable
from opengyre.wire import ApiError, GenRequest, Turn, assemble, structured_sampling
from opengyre.wire import anthropic as anthropic_api

from .._heap import freeze_startup_heap
from .._keys import ExecutionKeys
from .._metrics import counter, gauge, render_metrics
from .._temperature import DEFAULT_TEMPERATURE, logprob_temperature
from ..dialects._dialects import ANTHROPIC, CHAT, Dialect
from ..engines._client import EngineOptions
from ..engines._dispatch import Dispatch
from ..engines._pool import EnginePool, NoCapacity
from ..recording._recorder import ExecutionSealed, Recorder, RecorderFull, RecordFailed
from ._auth import authorize, infer_role
from ._routes import build_app, head_speaks_anthropic, model_body, models_body, speaks_anthropic
from ._streams import CallStream, guard, merge_choices, outcome_of, record_error, stream_errors

if TYPE_CHECKING:
    from ..recording._store import SealedFinishes

__all__ = ["Gateway", "GatewayConfig", "ServedContext"]

log = logging.getLogger(__name__)

_dec = msgspec.json.Decoder()

_CAPACITY = (429, 503, 529)  # no capacity: the pool's queue, an engine's overload, Anthropic's overloaded


@dataclass(frozen=True)
class GatewayConfig:
    host: str = "127.0.0.1"
    port: int = 0
    secret: bytes | None = None  # HMAC secret of execution keys (None: a random one per process)
    require_key: bool = True
    # Freeze the process's startup heap out of the cyclic collector (``_heap``): a process-wide setting, so the
    # proxy's own process asks for it (the service, the bench's server); a gateway inside another process does not.
    freeze_startup_heap: bool = False
    models: tuple[str, ...] = ("opengyre-tiny", "opengyre-small")
    model_patterns: tuple[str, ...] = ()  # fnmatch patterns also accepted, e.g. "claude-*" for Claude Code
    tokenizer_path: str | None = None  # the served model's tokenizer (default: the shipped byte-level one)
    # The served context. None: what the engines report (SGLang's /model_info context_length), and only where
    # none does, the tokenizer's model_max_length (often a tokenizer default, not the model's window).
    context_length: int | None = None
    default_max_tokens: int = 4096
    # Header size and count, body size (32 MiB: Anthropic's cap on Messages requests), timeouts, connections.
    http: HttpLimits = field(default_factory=HttpLimits)
    max_executions: int = 10_000  # live TITO states kept in memory (least recently used go)
    engine_streaming: bool = False  # stream from engines even for non-streamed calls (a drain works either way)
    max_attempts: int = 8
    max_inflight_per_engine: int = 256
    # Requests one execution may hold at a time (in flight or queued); one past it gets 429 at once, and an
    # execution that went past it has no capacity failure (429, 503, 529) counted in ``failed_calls``: it could
    # flood the engines, then say "the model failed". 16: one call of the most samples (n) fits. None: no bound.
    own_excess_inflight: int | None = 16
    max_queue: int = 1024
    queue_timeout_s: float = 30.0
    retry_after_s: float = 2.0
    engine_api_key: str | None = None
    # Pooled engine connections idle longer than this are closed, not reused: below the engine's keep-alive
    # (SGLang and vLLM run uvicorn with timeout_keep_alive=5; the CPU engine keeps 75 s).
    engine_idle_timeout_s: float = 4.0
    # The longest an engine may stay silent mid-response; a non-streamed generation is silent until it ends.
    engine_read_timeout_s: float = 600.0
    engine_transport: str = "http1"  # "httpx": the hot path through httpx (the benchmark's baseline)
    # Where answered calls wait for the log (SQLite, fsync'd); None keeps them in memory (lost if the process dies).
    outbox_path: str | None = None
    outbox_fsync: bool = True  # False: survives the process dying, not the machine (no fsync per call)
    outbox_max_events: int = 100_000  # past either bound new calls get 503 (Anthropic: 529) with Retry-After
    outbox_max_bytes: int = 2 << 30
    outbox_retry_after_s: float = 5.0
    stop_drain_timeout_s: float = 30.0  # how long stop() waits for the log to take the outbox
    port_fallback: bool = False  # if ``port`` is taken, serve on a free one (the embedded stack's behaviour)
    infer_roles: bool = True  # without a role claim, tell sub-agent conversations apart (see _auth.infer_role)


@dataclass
class GatewayStats:
    calls: int = 0
    rejected: dict[str, int] = field(default_factory=lambda: collections.defaultdict(int))
    drift: int = 0
    rerouted: int = 0
    over_context: int = 0  # calls refused as longer than the served context (counted in ``rejected`` too)
    last_over_context: str = ""  # the last of them: its dialect and its error's message


@dataclass(frozen=True)
class ServedContext:
    """The context a call can count on, and where that figure comes from (``opengyre status`` says both)."""

    tokens: int
    source: str


class Gateway:
    def __init__(
        self,
        config: GatewayConfig | None = None,
        *,
        event_log: EventLog | None = None,
        pool: EnginePool | None = None,
        restore: Callable[[str], Awaitable[ExecutionTrajectory | None]] | None = None,
        sealed: SealedFinishes | None = None,
    ) -> None:
        """``restore(execution_id)`` rebuilds an execution's TITO state not held in memory (from the store);
        ``sealed``: the executions whose sealed finish the log holds (the store), what lets the outbox forget
        their seals (``Recorder.prune_sealed``)."""
        self.config = c = config or GatewayConfig()
        self.restore = restore
        self._restoring: dict[str, asyncio.Future[ExecutionTrajectory | None]] = {}
        self.codec = ChatCodec(load_tokenizer(c.tokenizer_path))
        # The fallback when neither the setting nor any engine says (see effective_context).
        self.context_length = int(c.context_length or self.codec.context_limit or 32768)
        self.keys = ExecutionKeys(c.secret or uuid.uuid4().bytes + uuid.uuid4().bytes)
        self.pool = pool or EnginePool(
            max_inflight_per_engine=c.max_inflight_per_engine,
            max_queue=c.max_queue,
            queue_timeout_s=c.queue_timeout_s,
            retry_after_s=c.retry_after_s,
            own_excess_inflight=c.own_excess_inflight,
            engine_options=EngineOptions(
                api_key=c.engine_api_key,
                idle_timeout_s=c.engine_idle_timeout_s,
                read_timeout_s=c.engine_read_timeout_s,
                transport=c.engine_transport,
            ),
        )
        self.recorder = Recorder(
            event_log,
            outbox_path=Path(c.outbox_path) if c.outbox_path else None,
            outbox_fsync=c.outbox_fsync,
            max_events=c.outbox_max_events,
            max_bytes=c.outbox_max_bytes,
            retry_after_s=c.outbox_retry_after_s,
            sealed=sealed,
            secret=c.secret,
        )
        self.stats = GatewayStats()
        self._executions: collections.OrderedDict[str, ExecutionTrajectory] = collections.OrderedDict()
        # Per execution, its calls this process answered with a server-side failure (5xx: no engine could finish, an
        # engine's bad reply, a call that could not be recorded): what a harness's "the model failed" is checked by.
        self._failed: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._http: HttpServer | None = None
        self.app = self._build_app()

    # --- lifecycle ----------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        if self._http is None:
            raise RuntimeError("the gateway is not serving")
        return self._http.url

    def base_url(self, execution_id: str) -> str:
        """What a harness is given as its base URL (OpenAI SDKs add ``/chat/completions``; Anthropic's SDK
        adds ``/v1/messages`` to the URL without ``/v1``)."""
        return f"{self.url}/x/{execution_id}/v1"

    async def start(self) -> Gateway:
        if self.config.freeze_startup_heap:  # the imports' and the tokenizer's: no full collection walks them again
            freeze_startup_heap()
        await self.recorder.start()  # drains what a previous run left in the outbox
        try:
            self._http = self._server(self.config.port)
        except OSError:
            if not self.config.port_fallback or self.config.port == 0:
                raise
            log.warning("port %d is taken: the gateway serves on a free port instead", self.config.port)
            self._http = self._server(0)
        await self._http.start()
        return self

    def _server(self, port: int) -> HttpServer:
        return HttpServer(self.app, self.config.host, port, limits=self.config.http, render=self._refusal_body)

    def _refusal_body(self, refusal: Refusal, head: RequestHead | None) -> bytes:
        """A refusal the HTTP server answers itself (431, 413, 408, 503), in the dialect's error shape where the
        request's head was read; before that, Anthropic's (which OpenAI's SDKs read as well: ``error.message``)."""
        err = ApiError(refusal.status, refusal.kind, refusal.message)
        self.stats.rejected[f"{err.status}"] += 1
        dialect = CHAT if head is not None and not head_speaks_anthropic(head) else ANTHROPIC
        return msgspec.json.encode(dialect.error_body(err))

    async def stop(self) -> None:
        if self._http is not None:
            await self._http.stop()
            self._http = None
        await self.recorder.stop(self.config.stop_drain_timeout_s)
        await self.pool.close()

    async def seal_execution(self, execution_id: str) -> int:
        """End the execution's calls: refuse new ones (durably), wait until the log holds every recorded one, and
        return how many there are (what its ``execution-finished`` carries). Idempotent; SealUnavailable without a
        log. A call still generating when the seal lands is refused when it would be recorded."""
        await self.recorder.seal(execution_id)
        self._executions.pop(execution_id, None)  # its live state is no longer needed
        return await self.recorder.sealed_calls(execution_id)

    def failed_calls(self, execution_id: str) -> int:
        """How many of the execution's calls this process answered with a failure of its own or its engines' (a
        5xx or 429, in-stream errors included). A harness that ends saying the model failed is believed only when this
        says so: its summary is written where the policy's commands can write too (docs/sandbox.md)."""
        return self._failed.get(execution_id, 0)

    def _count_failure(self, execution_id: str | None, status: int) -> None:
        # 4xx is the caller's request, but 429: no rollout capacity (the engines', like a 503).
        if execution_id is None or (status < 500 and status != 429):
            return
        if status in _CAPACITY and self.pool.exceeded_own(execution_id):
            return  # past its own bound: the capacity it lacked may be what its own flood took
        self._failed[execution_id] = self._failed.get(execution_id, 0) + 1
        self._failed.move_to_end(execution_id)
        while len(self._failed) > 4 * self.config.max_executions:
            self._failed.popitem(last=False)

    def issue_key(self, execution_id: str, role: TrajectoryRole = "main") -> str:
        return self.keys.issue(execution_id, role)

    def execution(self, execution_id: str) -> ExecutionTrajectory:
        t = self._executions.get(execution_id)
        if t is None:
            return self._keep(execution_id, ExecutionTrajectory(execution_id, self.codec))
        self._executions.move_to_end(execution_id)
        return t

    def _keep(self, execution_id: str, traj: ExecutionTrajectory) -> ExecutionTrajectory:
        """Hold ``traj`` as the execution's live state, most recently used, within ``max_executions``."""
        self._executions[execution_id] = traj
        self._executions.move_to_end(execution_id)
        while len(self._executions) > self.config.max_executions:
            self._executions.popitem(last=False)
        return traj

    async def trajectory(self, execution_id: str) -> ExecutionTrajectory:
        """The execution's TITO state, restored from the store on first use after a restart."""
        if execution_id not in self._executions and self.restore is not None:
            fut = self._restoring.get(execution_id)
            if fut is None:
                fut = asyncio.ensure_future(self.restore(execution_id))
                self._restoring[execution_id] = fut
                fut.add_done_callback(lambda _f: self._restoring.pop(execution_id, None))
            try:
                restored = await asyncio.shield(fut)
            except PayloadUnavailable as exc:
                if exc.reason == "payload-compacted":  # training consumed it long ago: it cannot be extended
                    raise ApiError.invalid(
                        f"execution {execution_id} cannot continue: retention compacted its recorded calls "
                        f"after a training step consumed them ({exc})"
                    ) from exc
                raise ApiError(
                    503, "api_error", f"execution {execution_id}: its recorded calls cannot be read ({exc})"
                ) from exc
            if restored is not None and execution_id not in self._executions:
                return self._keep(execution_id, restored)
        return self.execution(execution_id)

    def _call_metrics(self) -> Iterator[Metric]:
        """The gateway's own figures for ``/metrics``: calls answered, refused by status, drift, reroutes."""
        st = self.stats
        yield counter("opengyre_proxy_calls_total", "Model calls answered and recorded.", st.calls)
        rejected = CounterMetricFamily(
            "opengyre_proxy_rejected_total", "Calls refused, by HTTP status.", labels=["status"]
        )
        for status, n in sorted(st.rejected.items()):
            rejected.add_metric([str(status)], n)
        yield rejected
        yield counter("opengyre_proxy_drift_total", "Calls whose re-rendered prompt differed.", st.drift)
        yield counter("opengyre_proxy_rerouted_total", "Engine attempts re-issued elsewhere.", st.rerouted)
        refused = CounterMetricFamily(
            "opengyre_proxy_http_refused_total",
            "Requests and connections the HTTP server refused itself (HttpLimits), by reason.",
            labels=["reason"],
        )
        for reason, n in sorted((self._http.refused if self._http else {}).items()):
            refused.add_metric([reason], n)
        yield refused

    def _execution_metrics(self) -> Iterator[Metric]:
        yield gauge("opengyre_proxy_executions", "Executions with live TITO state.", len(self.executions()))

    def executions(self) -> list[ExecutionTrajectory]:
        return list(self._executions.values())

    def model_names(self) -> list[str]:
        return list(self.config.models)

    # --- request plumbing -----------------------------------------------------------------------------

    def _known_model(self, model: str) -> bool:
        return model in self.config.models or any(fnmatch.fnmatchcase(model, p) for p in self.config.model_patterns)

    async def _body(self, request: Request) -> Any:
        # Its size is bounded by the HTTP server (HttpLimits.max_body_bytes: 413 before the app sees it).
        try:
            raw = await request.body()
        except ClientDisconnect:  # gone, or cut by the server (a body over the limit, stalled): nobody reads this
            raise ApiError(400, "invalid_request", "the client left before its body was read") from None
        try:
            return _dec.decode(raw)
        except msgspec.DecodeError as exc:
            raise ApiError.invalid(f"malformed JSON body: {exc}") from None
        except RecursionError:  # msgspec's own bound on nesting (~1,000 levels): a body no API takes
            raise ApiError.invalid("the JSON body is nested too deeply") from None

    def _error(self, err: ApiError, dialect: Dialect, execution_id: str | None = None) -> Response:
        self.stats.rejected[f"{err.status}"] += 1
        self._count_failure(execution_id, err.status)
        # Every refusal is in the log with its reason: a harness that fails on its first call is diagnosed here.
        log.warning("refused a %s call: %d %s: %s", dialect.name, err.status, err.kind, err.message)
        body = dialect.error_body(err)
        headers = {}
        if err.retry_after is not None:
            headers["retry-after"] = str(max(1, round(err.retry_after)))
            headers["x-should-retry"] = "true"
        return Json(body, status_code=err.status, headers=headers)

    # --- the call path ----------------------------------------------------------------------------------

    def _plan(self, traj: ExecutionTrajectory, req: GenRequest) -> Plan:
        if req.messages is not None:
            return traj.plan(req.messages, req.tools)
        ids = req.prompt_ids if req.prompt_ids is not None else self.codec.encode(req.prompt_text or "")
        if not ids:
            raise ApiError.invalid("the prompt is empty", param="prompt")
        return traj.plan_tokens(ids)

    def effective_context(self) -> int:
        """The context a call can count on: the engines' own (the least any active engine reports), capped by
        the ``context_length`` setting when one is given; the tokenizer's ``model_max_length`` only when neither
        is known (a tokenizer's limit is often its library's default, not the model's window)."""
        return self.served_context().tokens

    def served_context(self) -> ServedContext:
        """``effective_context`` with where it comes from: the setting, the engine reporting the least, or the
        tokenizer's ``model_max_length`` (no active engine has reported one)."""
        known = sorted(
            (h.context_length, h.engine_id) for h in self.pool.engines() if h.state == "active" and h.context_length
        )
        engine = (
            f"engine {known[0][1]}'s own (its /model_info context_length; the least of {len(known)} active)"
            if known
            else ""
        )
        setting = self.config.context_length
        if setting and (not known or setting <= known[0][0]):
            reported = f"; the engines report {known[0][0]}" if known else ""
            return ServedContext(setting, f"the context_length setting (OPENGYRE_PROXY_CONTEXT_LENGTH){reported}")
        if known:
            return ServedContext(known[0][0], engine)
        return ServedContext(
            self.context_length,
            f"the tokenizer's model_max_length ({self.config.tokenizer_path or 'the shipped tokenizer'}): no active "
            "engine has reported its context yet",
        )

    def _check_context(self, plan: Plan, req: GenRequest, dialect: Dialect) -> int:
        """Room left for output; a call that can never fit is refused before anything is sent (400)."""
        n = len(plan.prompt_ids)
        context = self.effective_context()
        err: ApiError | None = None
        if n >= context:
            err = dialect.context_error(n, context, None)
        elif req.max_tokens is not None and req.max_tokens_explicit and n + req.max_tokens > context:
            err = dialect.context_error(n, context, req.max_tokens)
        if err is not None:
            self.stats.over_context += 1
            self.stats.last_over_context = f"{dialect.name}: {err.message}"
            raise err
        return context - n

    def _sampling(self, req: GenRequest, room: int) -> dict[str, Any]:
        sp = dict(req.sampling)
        sp.setdefault("temperature", DEFAULT_TEMPERATURE)  # the dialects' default, never the engine's own
        sp["max_new_tokens"] = min(req.max_tokens or self.config.default_max_tokens, room)
        if req.stop:
            sp["stop"] = list(req.stop)
        structured_sampling(sp, req.tools, req.tool_choice, req.json_schema, self.codec.tool_start)
        return sp

    async def _record(
        self,
        eid: str,
        traj: ExecutionTrajectory,
        call_id: str,
        role: TrajectoryRole,
        req: GenRequest,
        plan: Plan,
        dispatch: Dispatch,
        turn: Turn,
    ) -> None:
        """Make the call's event durable, then add the call to the execution's live state.

        In that order: a child call can only be planned on a committed parent, so the outbox (and the log)
        always has a parent before its children; and a call that could not be recorded (RecordFailed) is not
        there for a later call to extend. The live state follows the write even if the caller leaves meanwhile.
        """
        out = dispatch.outcome
        response = turn.message() if req.messages is not None else None
        context = dict(plan.context)
        if response is not None:
            context["response"] = response
        context["request"] = {"model": req.model, "sampling": self._sampling(req, 1 << 30), "stream": req.stream}
        if req.no_effect:  # accepted as the vendor accepts them, with no effect here (docs/proxy.md)
            context["request"]["no_effect"] = dict(req.no_effect)
        if req.prompt_text is not None:
            context["prompt_text"] = req.prompt_text
        event = ModelCallRecorded(
            execution_id=eid,
            call_id=call_id,
            parent_call_id=plan.parent_call_id,
            prefix_len=plan.prefix_len,
            prompt_delta_ids=plan.delta_ids,
            output_ids=list(out.output_ids),
            output_logprobs=list(out.output_logprobs),
            role=role,
            model=req.model,
            engine_id=",".join(dispatch.engines),
            weight_version=out.weight_version,
            finish_reason=turn.finish,
            dialect=req.dialect,
            tool_calls=[ToolCallPayload(id=t.id, name=t.name, arguments=t.arguments) for t in turn.tool_calls],
            timings=CallTimings(queued_ms=dispatch.queued_ms, ttft_ms=dispatch.ttft_ms, total_ms=dispatch.total_ms),
            drift=plan.drift,
            attempts=dispatch.attempts,
            context=context,
            branch=plan.branch,
            # Spans only when the weights changed during the call; one version is weight_version alone.
            weight_versions=[WeightSpan(version=v, start=a, end=b) for v, a, b in out.weight_spans]
            if len({v for v, _, _ in out.weight_spans}) > 1
            else [],
            temperature=logprob_temperature(dispatch.sampling, raw_logprobs=dispatch.raw_logprobs),
        )

        def commit(written: asyncio.Future[None] | None = None) -> None:
            if written is not None and (written.cancelled() or written.exception() is not None):
                return
            # The state the call was planned on (its parent is there), even if it was evicted while the call ran.
            traj.commit(plan, call_id, out.output_ids, response, role)
            if eid not in self._executions:
                self._keep(eid, traj)
            if plan.drift is not None:
                self.stats.drift += 1
            self.stats.calls += 1
            self.stats.rerouted += dispatch.attempts - 1

        written = self.recorder.record(event)  # RecordFailed if it could not be committed
        if written is None:  # durable already
            commit()
            return
        written.add_done_callback(commit)  # runs before this coroutine resumes: the state is there first
        await asyncio.shield(written)  # shielded: a caller that leaves does not cancel what the others share

    async def _call(self, request: Request, dialect: Dialect) -> Response:
        """One call, ``n`` samples of it included: checked, planned, dispatched ``n`` times, answered and recorded.

        Each of ``n`` samples is a call of its own, planned alike: recorded as its own branch (siblings under the
        same parent, sharing the prompt's prefix) and answered as choice ``i``."""
        eid: str | None = None
        try:
            eid, role, claimed = authorize(request, self.keys, require_key=self.config.require_key)
            try:
                self.recorder.check_open(eid)
            except ExecutionSealed as exc:
                raise record_error(exc) from exc
            body = await self._body(request)
            req = dialect.parse(body)
            beta = request.headers.get("anthropic-beta")
            if beta and dialect is ANTHROPIC:
                # Each beta's features arrive as the fields it enables, and are handled (or refused) as those.
                req.no_effect["anthropic-beta"] = beta
            if not self._known_model(req.model):
                raise ApiError(
                    404,
                    "not_found",
                    f"The model `{req.model}` does not exist or you do not have access to it.",
                    param="model",
                    code="model_not_found",
                )
            try:
                self.recorder.admit()  # a call is answered only if it can be recorded
            except RecorderFull as exc:
                raise ApiError(
                    dialect.overloaded_status, "overloaded", f"recording is behind: {exc}", retry_after=exc.retry_after
                ) from exc
            traj = await self.trajectory(eid)
            if dialect.resolve is not None:
                dialect.resolve(req, traj)
            plan = self._plan(traj, req)
            if not claimed and self.config.infer_roles:
                role = infer_role(traj, plan)
            room = self._check_context(plan, req, dialect)
            if req.n > 1 and not dialect.multi:
                raise ApiError.invalid("'n' is not supported by this API", param="n")
            dispatches = await self._dispatch(eid, req, plan, room)
        except ApiError as err:
            return self._error(err, dialect, eid)
        except RecursionError:  # within the decoder's bound, deeper than the checks walk (a tool's schema)
            return self._error(ApiError.invalid("the request is nested too deeply"), dialect, eid)

        def on_turn(d: Dispatch) -> Callable[[Turn], Awaitable[None]]:
            async def record(turn: Turn) -> None:
                await self._record(eid, traj, d.rid, role, req, plan, d, turn)

            return record

        prompt = plan.prompt_ids
        if req.stream:
            streams = [
                stream_errors(
                    dialect.stream(
                        req, self.codec, guard(d.deltas(), d.outcome), outcome_of(d), prompt, d.rid, on_turn(d)
                    ),
                    d.outcome,
                    dialect,
                    lambda status: self._count_failure(eid, status),
                )
                for d in dispatches
            ]
            return CallStream(
                streams[0] if len(streams) == 1 else merge_choices(streams, req.include_usage),
                *dispatches,
                media_type="text/event-stream",
                headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
            )

        async def drain(d: Dispatch) -> None:
            async for _ in d.deltas():
                pass

        try:
            if len(dispatches) == 1:  # the usual call: no task of its own to drain in (~2 % of its CPU)
                await drain(dispatches[0])
            else:
                await asyncio.gather(*(drain(d) for d in dispatches))
        except ApiError as err:
            return self._error(err, dialect, eid)
        for d in dispatches:
            if d.outcome.kind == "abort":
                msg = str((d.outcome.finish or {}).get("message", "the generation was aborted"))
                return self._error(ApiError(dialect.overloaded_status, "overloaded", msg), dialect, eid)
        bodies = []
        for d in dispatches:
            turn = assemble(
                self.codec,
                d.outcome,
                dialect.tool_prefix,
                parse_tools=dialect.parse_tools,
                forced_calls=req.tool_choice.forced,
            )
            try:
                await on_turn(d)(turn)
            except RecordFailed as exc:
                return self._error(record_error(exc), dialect, eid)
            bodies.append(dialect.respond(req, self.codec, d.outcome, turn, prompt, d.rid))
        if len(bodies) == 1:
            return Json(bodies[0])
        merged = bodies[0]
        merged["choices"] = [{**b["choices"][0], "index": i} for i, b in enumerate(bodies)]
        out_tokens = sum(b["usage"]["completion_tokens"] for b in bodies)
        merged["usage"] = {**merged["usage"], "completion_tokens": out_tokens}
        merged["usage"]["total_tokens"] = merged["usage"]["prompt_tokens"] + out_tokens
        return Json(merged)

    async def _dispatch(self, eid: str, req: GenRequest, plan: Plan, room: int) -> list[Dispatch]:
        """The call's ``n`` generations, started (engine slots taken); 429 without capacity for all of them."""
        dispatches: list[Dispatch] = []
        for i in range(req.n):
            sp = self._sampling(req, room)
            if "sampling_seed" in sp:  # one seed, n different samples (vLLM seeds sample i with seed + i)
                sp["sampling_seed"] += i
            d = Dispatch(
                self.pool,
                plan.prompt_ids,
                sp,
                rid=uuid.uuid4().hex,
                affinity=eid,
                stream=req.stream or self.config.engine_streaming,
                max_attempts=self.config.max_attempts,
                top_logprobs=req.top_logprobs if req.logprobs else 0,
            )
            try:
                await d.start()
            except NoCapacity as exc:
                for started in dispatches:
                    await started.release_if_unstarted()
                raise ApiError(429, "rate_limit", f"no rollout capacity: {exc}", retry_after=exc.retry_after) from exc
            dispatches.append(d)
        return dispatches

    # --- routes -------------------------------------------------------------------------------------------

    def _authorize(self, request: Request) -> tuple[str, TrajectoryRole, bool]:
        return authorize(request, self.keys, require_key=self.config.require_key)

    async def _count_tokens(self, request: Request) -> Response:
        try:
            eid, _, _ = self._authorize(request)
            req = anthropic_api.count_tokens_request(await self._body(request))
            if not self._known_model(req.model):
                raise ApiError(404, "not_found", f"model: {req.model}")
            plan = (await self.trajectory(eid)).plan(req.messages or [], req.tools)
        except ApiError as err:
            return self._error(err, ANTHROPIC)
        return Json({"input_tokens": len(plan.prompt_ids)})

    async def _models(self, request: Request) -> Response:
        anthropic = speaks_anthropic(request)
        try:
            self._authorize(request)
        except ApiError as err:
            return self._error(err, ANTHROPIC if anthropic else CHAT)
        return Json(models_body(self.model_names(), anthropic=anthropic))

    async def _model(self, request: Request) -> Response:
        anthropic = speaks_anthropic(request)
        try:
            self._authorize(request)
            name = request.path_params["model"]
            if not self._known_model(name):
                raise ApiError(404, "not_found", f"The model `{name}` does not exist", code="model_not_found")
        except ApiError as err:
            return self._error(err, ANTHROPIC if anthropic else CHAT)
        return Json(model_body(name, anthropic=anthropic))

    async def _health(self, request: Request) -> Response:
        engines = [h for h in self.pool.engines() if h.state == "active"]
        return Json({"status": "ok", "engines": len(engines), "waiting": self.pool.waiting})

    async def _metrics(self, request: Request) -> Response:
        sources = (self._call_metrics, self.pool.metrics, self.recorder.metrics, self._execution_metrics)
        return Response(render_metrics(sources), media_type="text/plain; version=0.0.4")

    def _build_app(self) -> Starlette:
        return build_app(
            call=self._call,
            count_tokens=self._count_tokens,
            models=self._models,
            model=self._model,
            health=self._health,
            metrics=self._metrics,
            error=self._error,
        )
