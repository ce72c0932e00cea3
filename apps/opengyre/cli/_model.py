"""`opengyre model export`: a model or a trained checkpoint as a Hugging Face folder for GPU engines."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from opengyre.console import console, fail

__all__ = ["register"]


def export_cmd(
    out: Annotated[Path, typer.Argument(help="Folder to write (must not exist)")],
    model: Annotated[
        str, typer.Option(help="tiny, small, smollm2-135m, a model folder or a .gguf: its weights and tokenizer")
    ] = "smollm2-135m",
    checkpoint: Annotated[
        Path | None, typer.Option(help="A trained checkpoint of that model (a published step) instead of its weights")
    ] = None,
    model_cache: Annotated[Path | None, typer.Option(help="Pretrained models' conversion cache")] = None,
) -> None:
    """Export to an HF-format folder (safetensors, config.json, tokenizer files, generation config)."""
    from opengyre.models import CheckpointError, export_hf, resolve_model

    try:
        source = resolve_model(model, model_cache, log=console.print)
        weights = checkpoint or source.checkpoint
        if weights is None:
            raise fail(f"{model} is a preset built from a seed: pass --checkpoint with trained weights of it")
        export_hf(weights, out, source.tokenizer_dir)
    except (CheckpointError, FileExistsError, ValueError) as exc:
        raise fail(str(exc)) from exc
    console.print(f"exported {weights} to {out}")


def register(app: typer.Typer) -> None:
    model_app = typer.Typer(help="Models: export for GPU engines", no_args_is_help=True)
    model_app.command("export")(export_cmd)
    app.add_typer(model_app, name="model")
