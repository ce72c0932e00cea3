"""``opengyre engine`` / ``python -m opengyre.engine``: serve the CPU engine."""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

__all__ = ["engine_command"]


def engine_command(
    preset: Annotated[
        str,
        typer.Option(
            "--model", "--preset", help="tiny, small, smollm2-135m, a model folder or a .gguf file (opengyre.models)"
        ),
    ] = "tiny",
    checkpoint: Annotated[Path | None, typer.Option(help="load weights from a save_checkpoint folder")] = None,
    model_cache: Annotated[Path | None, typer.Option(help="pretrained models' conversion cache")] = None,
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="0 picks a free port")] = 30000,
    served_model_name: Annotated[str | None, typer.Option(help="default opengyre-<preset>")] = None,
    weight_version: Annotated[str, typer.Option()] = "default",
    seed: Annotated[int, typer.Option(help="initial weights' seed when no checkpoint is given")] = 0,
    api_key: Annotated[str | None, typer.Option(help="require Authorization: Bearer <key>")] = None,
    max_running: Annotated[int, typer.Option(help="requests decoded together")] = 256,
    prefill_chunk: Annotated[int, typer.Option(help="prompt tokens prefilled per step")] = 1024,
    context_length: Annotated[int | None, typer.Option()] = None,
    threads: Annotated[int | None, typer.Option(help="torch threads")] = None,
    projections: Annotated[
        str,
        typer.Option(
            help="generation's GEMM kernel: onednn (float32), onednn-bf16 (the layers in bfloat16, as GPU RL "
            "engines serve; its mismatch with the trainer in docs/benchmarks.md) or exact (the trainer's)"
        ),
    ] = "onednn",
    incremental_streaming_output: Annotated[bool, typer.Option(help="stream deltas, not cumulative chunks")] = False,
    keep_alive: Annotated[
        float | None,
        typer.Option(
            help="seconds an idle keep-alive connection stays open [default: 75, or OPENGYRE_HTTP_KEEP_ALIVE_S]"
        ),
    ] = None,
    port_file: Annotated[Path | None, typer.Option(help="write the URL here once serving")] = None,
) -> None:
    """Serve the built-in CPU engine (SGLang native API + OpenAI routes)."""
    from opengyre.config import HttpLimits

    from ._engine import EngineConfig
    from ._launch import serve_forever

    logging.basicConfig(level=logging.WARNING)
    cfg = EngineConfig(
        preset=preset,
        checkpoint=checkpoint,
        model_cache=model_cache,
        seed=seed,
        weight_version=weight_version,
        served_model_name=served_model_name,
        host=host,
        port=port,
        api_key=api_key,
        max_running=max_running,
        prefill_chunk=prefill_chunk,
        context_length=context_length,
        threads=threads,
        projections=projections,
        incremental_streaming_output=incremental_streaming_output,
        # The other HTTP limits: OPENGYRE_HTTP_* (docs/security.md).
        http=None if keep_alive is None else replace(HttpLimits.from_env(os.environ), keep_alive_s=keep_alive),
    )
    asyncio.run(serve_forever(cfg, port_file))
