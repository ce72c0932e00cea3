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
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
from prometheus_client.core import CounterMetricFamily, Metric
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

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
    subject_token,
)
from opengyre.models import load_tokenizer
from opengyre.tito import ExecutionTrajectory, Plan
from opengyre.trajectory import PayloadUnavailable
from opengyre.wire import DONE, ApiError, GenRequest, Outcome, Turn, assemble, sse, structured_sampling
from opengyre.wire import anthropic as anthropic_api
from opengyre.wire import openai as openai_api

from ._keys import ROLES, ExecutionKeys, KeyClaim
from ._metrics import counter, gauge, render_metrics
from ._temperature import DEFAULT_TEMPERATURE, logprob_temperature
from .dialects._dialects import ANTHROPIC, CHAT, COMPLETIONS, RESPONSES, Dialect
from .engines._client import EngineOptions
from .engines._dispatch import Dispatch
from .engines._pool import EnginePool, NoCapacity
from .recording._recorder import ExecutionSealed, Recorder, RecorderFull, RecordFailed

if TYPE_CHECKING:
    from .recording._store import SealedFinishes

__all__ = ["Gateway", "GatewayConfig", "ServedContext"]

log = logging.getLogger(__name__)

_dec = msgspec.json.Decoder()

ROLE_HEADER = "x-opengyre-role"


@dataclass(frozen=True)
class GatewayConfig:
    host: str = "127.0.0.1"
    port: int = 0
    secret: bytes | None = None  # HMAC secret of execution keys (None: a random one per process)
    require_key: bool = True
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
    infer_roles: bool = True  # without a role claim, tell sub-agent conversations apart (see _infer_role)


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
        dialect = CHAT if head is not None and not _head_speaks_anthropic(head) else ANTHROPIC
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

    @staticmethod
    def _presented_key(request: Request) -> str | None:
        auth = request.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            return auth[7:].strip()
        return request.headers.get("x-api-key")

    def _authorize(self, request: Request) -> tuple[str, TrajectoryRole, bool]:
        """The execution, the caller's role, and whether the role was claimed (a header, or a non-main key)."""
        path_eid = request.path_params.get("execution_id")
        if path_eid is not None:
            try:
                subject_token(path_eid)
            except ValueError:
                raise ApiError(404, "not_found", f"no execution {path_eid!r}") from None
        key = self._presented_key(request)
        claim: KeyClaim | None = None
        if key is None:
            if self.config.require_key:
                raise ApiError(401, "authentication", "missing API key: send Authorization: Bearer <key> or x-api-key")
        else:
            claim = self.keys.verify(key)
            if claim is None and self.config.require_key:
                raise ApiError(401, "authentication", "invalid API key")
        if claim is not None and path_eid is not None and claim.execution_id != path_eid:
            raise ApiError(403, "permission", "this API key belongs to another execution")
        eid = path_eid or (claim.execution_id if claim else None)
        if eid is None:
            raise ApiError(404, "not_found", "no execution: use /x/{execution_id}/v1 or an execution key")
        role: TrajectoryRole = claim.role if claim else "main"
        header = request.headers.get(ROLE_HEADER)
        if header:
            if header not in ROLES:
                raise ApiError.invalid(f"{ROLE_HEADER} must be one of {', '.join(ROLES)}")
            role = header  # type: ignore[assignment]
        return eid, role, bool(header) or role != "main"

    @staticmethod
    def _infer_role(traj: ExecutionTrajectory, plan: Plan) -> TrajectoryRole:
        """The role of a call whose caller did not say, from what the conversation is, not from which came first.

        A continuation takes its parent's conversation's role. A new conversation is the main agent's when it
        is under the main system prompt, else a sub-agent's (Claude Code runs its sub-agents with the same key; a
        compaction keeps the main system prompt). The main system prompt is that of the execution's first main
        conversation that has tools, else its first main one. Before any main exists, a tool-less one-shot
        helper call (a title generator: OpenCode sends it before the agent's first call) is not taken for the
        main agent; and a conversation with tools that arrives when every main so far had none is the main
        agent (the earlier one was a helper that was not recognised).
        """
        if plan.parent_call_id is not None:
            parent = traj.nodes.get(plan.parent_call_id)
            if parent is not None and parent.role in ("sub-agent", "sub-agent-summary"):
                return "sub-agent"
            return "main"
        if not plan.messages:
            return "main"
        system = _system_of(plan.messages)
        has_tools = plan.tools_key != "[]"
        mains = [n for n in traj.nodes.values() if n.parent_node is None and n.role == "main"]
        if not mains:
            if not has_tools and system is not None and _HELPER_PROMPT.search(system):
                return "sub-agent"
            return "main"
        tooled = [n for n in mains if n.tools_key != "[]"]
        if has_tools and not tooled:
            return "main"
        ref = (tooled or mains)[0]
        return "main" if system == _system_of(ref.conv_after) else "sub-agent"

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
        eid: str | None = None
        try:
            eid, role, claimed = self._authorize(request)
            try:
                self.recorder.check_open(eid)
            except ExecutionSealed as exc:
                raise _record_error(exc) from exc
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
                role = self._infer_role(traj, plan)
            room = self._check_context(plan, req, dialect)
            if req.n > 1:
                if not dialect.multi:
                    raise ApiError.invalid("'n' is not supported by this API", param="n")
                return await self._samples(dialect, eid, role, req, traj, plan, room)
            call_id = uuid.uuid4().hex
            dispatch = Dispatch(
                self.pool,
                plan.prompt_ids,
                self._sampling(req, room),
                rid=call_id,
                affinity=eid,
                stream=req.stream or self.config.engine_streaming,
                max_attempts=self.config.max_attempts,
                top_logprobs=req.top_logprobs if req.logprobs else 0,
            )
            try:
                await dispatch.start()
            except NoCapacity as exc:
                raise ApiError(429, "rate_limit", f"no rollout capacity: {exc}", retry_after=exc.retry_after) from exc
        except ApiError as err:
            return self._error(err, dialect, eid)

        async def on_turn(turn: Turn) -> None:
            await self._record(eid, traj, call_id, role, req, plan, dispatch, turn)

        prompt = plan.prompt_ids
        if req.stream:
            source = _guard(dispatch.deltas(), dispatch.outcome)
            stream = dialect.stream(req, self.codec, source, lambda: dispatch.outcome, prompt, call_id, on_turn)
            return _CallStream(
                _stream_errors(stream, dispatch.outcome, dialect, lambda status: self._count_failure(eid, status)),
                dispatch,
                media_type="text/event-stream",
                headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
            )
        try:
            async for _ in dispatch.deltas():
                pass
        except ApiError as err:
            return self._error(err, dialect, eid)
        out = dispatch.outcome
        if out.kind == "abort":
            msg = str((out.finish or {}).get("message", "the generation was aborted"))
            return self._error(ApiError(dialect.overloaded_status, "overloaded", msg), dialect, eid)
        turn = assemble(
            self.codec,
            out,
            dialect.tool_prefix,
            parse_tools=dialect.parse_tools,
            forced_calls=req.tool_choice.forced,
        )
        try:
            await on_turn(turn)
        except RecordFailed as exc:
            return self._error(_record_error(exc), dialect, eid)
        return Json(dialect.respond(req, self.codec, out, turn, prompt, call_id))

    async def _samples(
        self,
        dialect: Dialect,
        eid: str,
        role: TrajectoryRole,
        req: GenRequest,
        traj: ExecutionTrajectory,
        plan: Plan,
        room: int,
    ) -> Response:
        """``n`` independent samples of one prompt: ``n`` calls planned alike, so each is recorded as its own
        branch (siblings under the same parent, sharing the prompt's prefix), answered as ``n`` choices."""
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

        def on_turn(d: Dispatch) -> Callable[[Turn], Awaitable[None]]:
            async def record(turn: Turn) -> None:
                await self._record(eid, traj, d.rid, role, req, plan, d, turn)

            return record

        prompt = plan.prompt_ids
        if req.stream:
            streams = [
                _stream_errors(
                    dialect.stream(
                        req, self.codec, _guard(d.deltas(), d.outcome), _outcome_of(d), prompt, d.rid, on_turn(d)
                    ),
                    d.outcome,
                    dialect,
                    lambda status: self._count_failure(eid, status),
                )
                for d in dispatches
            ]
            return _CallStream(
                _merge_choices(streams, req.include_usage),
                *dispatches,
                media_type="text/event-stream",
                headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
            )

        async def drain(d: Dispatch) -> None:
            async for _ in d.deltas():
                pass

        try:
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
                return self._error(_record_error(exc), dialect, eid)
            bodies.append(dialect.respond(req, self.codec, d.outcome, turn, prompt, d.rid))
        merged = bodies[0]
        merged["choices"] = [{**b["choices"][0], "index": i} for i, b in enumerate(bodies)]
        out_tokens = sum(b["usage"]["completion_tokens"] for b in bodies)
        merged["usage"] = {**merged["usage"], "completion_tokens": out_tokens}
        merged["usage"]["total_tokens"] = merged["usage"]["prompt_tokens"] + out_tokens
        return Json(merged)

    # --- routes -------------------------------------------------------------------------------------------

    def _build_app(self) -> Starlette:
        def call_route(dialect: Dialect) -> Callable[[Request], Awaitable[Response]]:
            async def route(request: Request) -> Response:
                return await self._call(request, dialect)

            return route

        chat, completions, messages = call_route(CHAT), call_route(COMPLETIONS), call_route(ANTHROPIC)
        responses = call_route(RESPONSES)

        async def count_tokens(request: Request) -> Response:
            try:
                eid, _, _ = self._authorize(request)
                req = anthropic_api.count_tokens_request(await self._body(request))
                if not self._known_model(req.model):
                    raise ApiError(404, "not_found", f"model: {req.model}")
                plan = (await self.trajectory(eid)).plan(req.messages or [], req.tools)
            except ApiError as err:
                return self._error(err, ANTHROPIC)
            return Json({"input_tokens": len(plan.prompt_ids)})

        async def models(request: Request) -> Response:
            anthropic = _speaks_anthropic(request)
            try:
                self._authorize(request)
            except ApiError as err:
                return self._error(err, ANTHROPIC if anthropic else CHAT)
            names = self.model_names()
            if anthropic:
                data = [
                    {"type": "model", "id": n, "display_name": n, "created_at": "2026-01-01T00:00:00Z"} for n in names
                ]
                return Json(
                    {
                        "data": data,
                        "has_more": False,
                        "first_id": names[0] if names else None,
                        "last_id": names[-1] if names else None,
                    }
                )
            return Json(openai_api.models_body(names))

        async def model(request: Request) -> Response:
            anthropic = _speaks_anthropic(request)
            try:
                self._authorize(request)
                name = request.path_params["model"]
                if not self._known_model(name):
                    raise ApiError(404, "not_found", f"The model `{name}` does not exist", code="model_not_found")
            except ApiError as err:
                return self._error(err, ANTHROPIC if anthropic else CHAT)
            if anthropic:
                return Json({"type": "model", "id": name, "display_name": name, "created_at": "2026-01-01T00:00:00Z"})
            return Json({"id": name, "object": "model", "created": 0, "owned_by": "opengyre"})

        async def health(request: Request) -> Response:
            engines = [h for h in self.pool.engines() if h.state == "active"]
            return Json({"status": "ok", "engines": len(engines), "waiting": self.pool.waiting})

        async def metrics(request: Request) -> Response:
            sources = (self._call_metrics, self.pool.metrics, self.recorder.metrics, self._execution_metrics)
            return Response(render_metrics(sources), media_type="text/plain; version=0.0.4")

        routes: list[Route] = [Route("/health", health, methods=["GET"]), Route("/metrics", metrics, methods=["GET"])]
        for base in ("/x/{execution_id}/v1", "/v1"):
            routes += [
                Route(f"{base}/chat/completions", chat, methods=["POST"]),
                Route(f"{base}/completions", completions, methods=["POST"]),
                Route(f"{base}/responses", responses, methods=["POST"]),
                Route(f"{base}/messages", messages, methods=["POST"]),
                Route(f"{base}/messages/count_tokens", count_tokens, methods=["POST"]),
                Route(f"{base}/models", models, methods=["GET"]),
                Route(f"{base}/models/{{model:path}}", model, methods=["GET"]),
            ]

        async def unknown(request: Request, exc: Exception) -> Response:
            """No such route (or method): the dialect's JSON error, never a plain-text page."""
            status = getattr(exc, "status_code", 404)
            anthropic = _speaks_anthropic(request) or request.url.path.endswith(("/messages", "/count_tokens"))
            what = "method" if status == 405 else "route"
            err = ApiError(
                status,
                "not_found" if status == 404 else "invalid_request",
                f"no {what} {request.method} {request.url.path} on this server",
                code="unknown_url" if status == 404 else None,
            )
            return self._error(err, ANTHROPIC if anthropic else CHAT)

        return Starlette(routes=routes, exception_handlers={HTTPException: unknown})


# System prompts of one-shot helper calls harnesses make beside the agent (OpenCode 1.18: "You are a title
# generator. You output ONLY a thread title."), recognised so that they are not taken for the main agent.
_HELPER_PROMPT = re.compile(r"\byou are a title generator\b|\bgenerate a (?:brief |short |concise )?title\b", re.I)


def _system_of(messages: list[dict[str, Any]]) -> str | None:
    if messages and messages[0].get("role") == "system":
        content = messages[0].get("content")
        return content if isinstance(content, str) else None
    return None


class _CallStream(StreamingResponse):
    """A streamed call that gives its engine slots back even if the client leaves before the body starts."""

    def __init__(self, content: AsyncIterator[bytes], *dispatches: Dispatch, **kw: Any) -> None:
        super().__init__(content, **kw)
        self._dispatches = dispatches

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            for d in self._dispatches:
                await d.release_if_unstarted()


def _speaks_anthropic(request: Request) -> bool:
    """A request from an Anthropic client (the two APIs share ``/v1``): its version header, or its key header
    (OpenAI clients send ``Authorization: Bearer``)."""
    return "anthropic-version" in request.headers or "x-api-key" in request.headers


def _head_speaks_anthropic(head: RequestHead) -> bool:
    """``_speaks_anthropic`` for a request the HTTP server refused before the app saw it (its path counts too)."""
    names = {name for name, _ in head.headers}
    return b"anthropic-version" in names or b"x-api-key" in names or head.path.endswith(("/messages", "/count_tokens"))


def _outcome_of(d: Dispatch) -> Callable[[], Outcome]:
    return lambda: d.outcome


async def _merge_choices(streams: list[AsyncIterator[bytes]], include_usage: bool) -> AsyncIterator[bytes]:
    """n OpenAI SSE streams as one: sample i's chunks carry choice index i, as they come; one usage chunk
    (completion tokens summed) and one ``[DONE]`` at the end; the first error frame ends the whole stream."""
    queue: asyncio.Queue[tuple[int, bytes | None]] = asyncio.Queue()

    async def pump(i: int, s: AsyncIterator[bytes]) -> None:
        try:
            async for frame in s:
                await queue.put((i, frame))
        finally:
            await queue.put((i, None))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    usage: dict[str, Any] | None = None
    head: dict[str, Any] | None = None
    running = len(tasks)
    try:
        while running:
            i, frame = await queue.get()
            if frame is None:
                running -= 1
                continue
            for block in frame.split(b"\n\n"):
                if not block.startswith(b"data: ") or block + b"\n\n" == DONE:
                    continue
                obj = _dec.decode(block[6:])
                if "error" in obj:
                    yield sse(obj) + DONE
                    return
                if not obj.get("choices"):  # a usage chunk: summed into the one at the end
                    u = obj.get("usage") or {}
                    if usage is None:
                        usage, head = dict(u), {k: v for k, v in obj.items() if k not in ("choices", "usage")}
                    else:
                        usage["completion_tokens"] += u.get("completion_tokens", 0)
                        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
                    continue
                for c in obj["choices"]:
                    c["index"] = i
                yield sse(obj)
        if include_usage and usage is not None and head is not None:
            yield sse({**head, "choices": [], "usage": usage})
        yield DONE
    finally:
        for t in tasks:
            t.cancel()


async def _guard(
    source: AsyncIterator[tuple[list[int], list[float]]], outcome: Outcome
) -> AsyncIterator[tuple[list[int], list[float]]]:
    """Turn an engine refusal in mid-stream into an aborted outcome (the stream then ends with an error)."""
    try:
        async for item in source:
            yield item
    except ApiError as err:
        outcome.finish = {"type": "abort", "message": err.message, "status_code": err.status}


def _not_recorded(exc: RecordFailed) -> str:
    return f"the call could not be recorded, so it is not answered (nothing was recorded): {exc}"


def _record_error(exc: RecordFailed) -> ApiError:
    """A sealed execution is the caller's error (403: its rollout ended); any other failure to record is ours."""
    if isinstance(exc, ExecutionSealed):
        return ApiError(403, "permission", str(exc), code="execution_sealed")
    return ApiError(500, "api_error", _not_recorded(exc))


async def _stream_errors(
    stream: AsyncIterator[bytes], outcome: Outcome, dialect: Dialect, failed_with: Callable[[int], None]
) -> AsyncIterator[bytes]:
    """Pass the dialect's stream through, but end it with the dialect's error event if generation aborted.

    The dialect streams stop before their final frames when the outcome is an abort, so no client
    mistakes a failed generation for a complete answer (and nothing is recorded for it). A call whose event
    could not be made durable ends the same way, before its final frames.
    """
    failed: ApiError | None = None
    try:
        async for chunk in stream:
            yield chunk
    except RecordFailed as exc:
        # Refused at recording (a seal landed while it generated: 403 ``execution_sealed``) or not durable (500):
        # the error the same call gets unstreamed.
        failed = _record_error(exc)
        outcome.finish = {"type": "abort", "message": failed.message, "status_code": failed.status}
    if failed is None and outcome.kind == "abort" and outcome.finish is not None:
        msg = str(outcome.finish.get("message", "the generation was aborted"))
        # No engine could finish (503/529) is an overload; anything else (a bad engine reply) is not.
        if outcome.finish.get("status_code") in (None, 503, 529):
            failed = ApiError(dialect.overloaded_status, "overloaded", msg, code="engine_unavailable")
        else:
            failed = ApiError(502, "api_error", msg, code="engine_error")
    if failed is not None:
        failed_with(failed.status)
        yield dialect.stream_error(failed)
