"""The proxy service process: the HTTP gateway, the trajectory-store projection, cell watching, gRPC."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from opengyre.config import PROXY_HTTP
from opengyre.projection import Projection
from opengyre.runtime import Service, ServiceContext
from opengyre.v1 import proxy_pb2_grpc

from .recording._store import SealedFinishes, TrajectoryProjection

if TYPE_CHECKING:
    from .engines._cells import CellWatcher
    from .gateway import Gateway, GatewayConfig

__all__ = ["ProxyService"]

log = logging.getLogger(__name__)

# How often the outbox forgets the seals the log now holds: the outbox file keeps executions in progress only.
PRUNE_EVERY_S = 30.0


def _env_list(name: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in os.environ.get(name, "").split(",") if x.strip())


class ProxyService(Service):
    name = "proxy"
    summary = "QwenGyre token-in/token-out model gateway with trajectory trees"
    capabilities = (
        "status",
        "openai-chat",
        "openai-completions",
        "openai-responses",
        "anthropic-messages",
        "tito",
        "trajectory-tree",
        "atif-export",
        "engine-pool",
        "reroute-on-drain",
        "cpu-engine",
    )
    not_implemented = ("kv-rdma-migration",)

    def __init__(self, config: GatewayConfig | None = None, engines: Sequence[str] = ()) -> None:
        self._config = config
        self._static = list(engines)  # else the settings' proxy_engines (`up --engine`, OPENGYRE_PROXY_ENGINES)
        self.gateway: Gateway | None = None
        self._cells: CellWatcher | None = None
        self._pruner: asyncio.Task[None] | None = None

    def projections(self) -> Sequence[Projection]:
        return (TrajectoryProjection(),)

    async def notes(self, ctx: ServiceContext) -> Sequence[str]:
        """The served context and where it comes from, and the calls refused as longer: a harness whose prompt
        does not fit (Claude Code's system prompt and tools alone pass a small model's window) shows its vendor's
        error, and this says why."""
        if self.gateway is None:
            return ()
        served, stats = self.gateway.served_context(), self.gateway.stats
        out = [
            f"serves a context of {served.tokens} tokens, from {served.source}; a longer prompt gets its dialect's "
            "context error (Anthropic: 'prompt is too long', OpenAI: context_length_exceeded)"
        ]
        if stats.over_context:
            out.append(
                f"{stats.over_context} call(s) refused as longer than the served context; the last: "
                f"{stats.last_over_context}"
            )
        return out

    def _gateway_config(self, ctx: ServiceContext) -> GatewayConfig:
        from ._keys import load_or_create_secret
        from .gateway import GatewayConfig

        s = ctx.settings
        cfg = self._config or GatewayConfig()
        secret = cfg.secret
        if secret is None:
            env = os.environ.get("OPENGYRE_PROXY_SECRET")
            secret = bytes.fromhex(env) if env else load_or_create_secret(s.data_dir / "proxy.secret")
        models = _env_list("OPENGYRE_PROXY_MODELS") or cfg.models
        patterns = _env_list("OPENGYRE_PROXY_MODEL_PATTERNS") or cfg.model_patterns
        # The served model's tokenizer (a folder): the proxy records token ids in its vocabulary.
        tokenizer = os.environ.get("OPENGYRE_PROXY_TOKENIZER") or cfg.tokenizer_path
        # The served context, where the engines' own report (SGLang's /model_info) should not be what counts.
        ctx_env = os.environ.get("OPENGYRE_PROXY_CONTEXT_LENGTH")
        if ctx_env is not None and (not ctx_env.isdigit() or int(ctx_env) < 1):
            raise ValueError(f"OPENGYRE_PROXY_CONTEXT_LENGTH must be a positive integer, got {ctx_env!r}")
        context_length = int(ctx_env) if ctx_env else cfg.context_length
        port = cfg.port if self._config is not None else s.proxy_http_port
        # A default port that is taken falls back to a free one (proxy.url tells harnesses where); a port the
        # user set (OPENGYRE_PROXY_HTTP_PORT) that is taken is an error.
        fallback = PROXY_HTTP not in s.explicit_ports
        # Answered calls wait here for the log, surviving a crash of this process (see docs/proxy.md).
        outbox = cfg.outbox_path or str(s.data_dir / "proxy-outbox.sqlite3")
        return replace(
            cfg,
            host=s.host,
            port=port,
            secret=secret,
            models=models,
            model_patterns=patterns,
            tokenizer_path=tokenizer,
            context_length=context_length,
            port_fallback=fallback,
            outbox_path=outbox,
            # The stack's HTTP limits (OPENGYRE_HTTP_*), unless a config was handed in (tests, embedding).
            http=cfg.http if self._config is not None else s.http,
        )

    async def start(self, ctx: ServiceContext) -> None:
        from opengyre.tito import ExecutionTrajectory

        from ._grpc import resolve_contexts
        from .engines._cells import CellWatcher
        from .gateway import Gateway
        from .recording._restore import restore_trajectory
        from .recording._trees import load_execution

        async def restore(execution_id: str) -> ExecutionTrajectory | None:
            calls = await load_execution(ctx.engine, ctx.log, execution_id)
            if not calls or self.gateway is None:
                return None
            contexts = await resolve_contexts(ctx.log, calls)
            return restore_trajectory(execution_id, self.gateway.codec, calls, contexts)

        config = replace(self._gateway_config(ctx), freeze_startup_heap=True)  # this is its process
        self.gateway = Gateway(config, event_log=ctx.log, restore=restore, sealed=SealedFinishes(ctx.engine))
        for i, url in enumerate(self._static or ctx.settings.proxy_engines):
            await self.gateway.pool.add(f"static-{i}", url)
        await self.gateway.start()
        # Where harnesses find the gateway (the port may differ from the configured one if that was taken).
        await asyncio.to_thread(_write_url, ctx.settings.data_dir / "proxy.url", self.gateway.url)
        self._cells = CellWatcher(ctx.log, self.gateway.pool)
        await self._cells.start()
        self._pruner = asyncio.create_task(_prune_sealed(self.gateway), name="proxy-prune-seals")

    async def stop(self) -> None:
        if self._pruner is not None:
            self._pruner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pruner
            self._pruner = None
        if self._cells is not None:
            await self._cells.stop()
            self._cells = None
        if self.gateway is not None:
            await self.gateway.stop()
            self.gateway = None

    def add_to_server(self, server: grpc.aio.Server, ctx: ServiceContext) -> Sequence[str]:
        from ._grpc import ProxyServicer

        if self.gateway is None:
            raise RuntimeError("the proxy gateway must be started before its gRPC service")
        proxy_pb2_grpc.add_ProxyServiceServicer_to_server(ProxyServicer(self, ctx, self.gateway), server)
        return ("opengyre.v1.ProxyService",)


async def _prune_sealed(gateway: Gateway) -> None:
    while True:
        await asyncio.sleep(PRUNE_EVERY_S)
        try:
            pruned = await gateway.recorder.prune_sealed()
        except Exception:
            log.exception("pruning the outbox's seals failed; trying again in %.0f s", PRUNE_EVERY_S)
            continue
        if pruned:
            log.info("the outbox forgot %d seals the log holds", pruned)


def _write_url(path: Path, url: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(url + "\n")
    tmp.replace(path)
