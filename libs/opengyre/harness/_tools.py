"""The agent's tools: run a shell command, read a file, write a file (submit and spawn_agent are the loop's).

Every fault of a call — arguments that are not a JSON object, a missing or mistyped field, a path outside the
workspace, a command that times out — comes back to the model as the tool's text, never as an exception out
of the loop: a policy learns from its mistakes only if the episode goes on.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opengyre.sandbox import LocalSandbox, Mount, SandboxError, SandboxLimits

__all__ = ["ToolError", "Toolbox", "function_schema", "parse_arguments"]


class ToolError(Exception):
    """A tool call the model got wrong; its text goes back to the model."""


def function_schema(name: str, description: str, props: dict[str, dict[str, str]], required: list[str]) -> Any:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": props, "required": required},
        },
    }


def parse_arguments(raw: str, required: dict[str, type], optional: dict[str, type] | None = None) -> dict[str, Any]:
    """The arguments of a call as the model wrote them, checked against the tool's fields."""
    try:
        args = json.loads(raw) if raw.strip() else {}
    except ValueError as exc:
        raise ToolError(f"the arguments are not valid JSON ({exc}): {raw[:200]!r}") from None
    if not isinstance(args, dict):
        raise ToolError(f"the arguments must be a JSON object, got {type(args).__name__}")
    fields = {**required, **(optional or {})}
    unknown = sorted(set(args) - fields.keys())
    if unknown:
        raise ToolError(f"unknown argument(s) {', '.join(unknown)}; this tool takes {', '.join(fields)}")
    for key, kind in fields.items():
        if key not in args:
            if key in required:
                raise ToolError(f"missing argument {key!r}")
            continue
        if not isinstance(args[key], kind) or isinstance(args[key], bool) is not (kind is bool):
            raise ToolError(f"argument {key!r} must be a {kind.__name__}")
    return args


def _clip(text: str, limit: int) -> str:
    """Head and tail of a long text: errors tend to sit at the end, context at the start."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"


@dataclass
class Toolbox:
    """The workspace tools of one episode; commands run in a ``LocalSandbox`` with the workspace as cwd (each
    command in a sandbox of its own; nested, limits and reaper only, when the harness runs in a namespace one)."""

    workdir: Path
    command_timeout_s: float = 60.0
    max_output_chars: int = 16_000
    command_network: bool = False
    _sandbox: LocalSandbox | None = field(default=None, init=False, repr=False)
    _time_left_s: float | None = field(default=None, init=False, repr=False)

    SCHEMAS = (
        function_schema(
            "run_command",
            "Run a bash command in the workspace and return its exit code and output.",
            {"command": {"type": "string", "description": "the bash command line"}},
            ["command"],
        ),
        function_schema(
            "read_file",
            "Read a text file of the workspace.",
            {"path": {"type": "string", "description": "path relative to the workspace"}},
            ["path"],
        ),
        function_schema(
            "write_file",
            "Write (create or replace) a text file in the workspace.",
            {"path": {"type": "string"}, "content": {"type": "string"}},
            ["path", "content"],
        ),
    )

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir).resolve()
        self._handlers: dict[str, Callable[[str], str]] = {
            "run_command": self.run_command,
            "read_file": self.read_file,
            "write_file": self.write_file,
        }

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._handlers)

    def __enter__(self) -> Toolbox:
        limits = SandboxLimits(
            timeout_s=self.command_timeout_s, max_output_bytes=4 * self.max_output_chars, network=self.command_network
        )
        # The workspace at its own path: the model's commands and the file tools name the same files. Inside the
        # harness's own namespace sandbox these sandboxes are nested ones (the outer isolation holds there).
        mounts = [Mount(self.workdir, str(self.workdir), writable=True)]
        self._sandbox = LocalSandbox(limits, prefix="og-harness-", mounts=mounts).open()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._sandbox is not None:
            self._sandbox.close()
            self._sandbox = None

    def handles(self, name: str) -> bool:
        return name in self._handlers

    def call(self, name: str, raw_arguments: str, *, time_left_s: float | None = None) -> str:
        self._time_left_s = time_left_s
        return self._handlers[name](raw_arguments)

    def _path(self, rel: str) -> Path:
        path = (self.workdir / rel).resolve()
        if path != self.workdir and self.workdir not in path.parents:
            raise ToolError(f"{rel!r} is outside the workspace")
        return path

    def run_command(self, raw: str) -> str:
        command = parse_arguments(raw, {"command": str})["command"]
        assert self._sandbox is not None, "the toolbox is not open"
        timeout = self.command_timeout_s
        if self._time_left_s is not None:
            timeout = max(min(timeout, self._time_left_s), 0.001)
        limits = dataclasses.replace(self._sandbox.limits, timeout_s=timeout)
        try:
            result = self._sandbox.run(["bash", "-c", command], cwd=self.workdir, limits=limits)
        except SandboxError as exc:
            raise ToolError(str(exc)) from None
        head = f"command timed out after {timeout:g} s and was killed" if result.timed_out else ""
        head = head or f"exit code {result.exit_code}"
        return _clip(f"{head}\n{result.output}", self.max_output_chars)

    def read_file(self, raw: str) -> str:
        path = self._path(parse_arguments(raw, {"path": str})["path"])
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ToolError(f"cannot read {path.relative_to(self.workdir)}: {exc.strerror}") from None
        return _clip(data.decode("utf-8", errors="replace"), self.max_output_chars)

    def write_file(self, raw: str) -> str:
        args = parse_arguments(raw, {"path": str, "content": str})
        path = self._path(args["path"])
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(args["content"])
        except OSError as exc:
            raise ToolError(f"cannot write {args['path']}: {exc.strerror}") from None
        return f"wrote {len(args['content'].encode())} bytes to {path.relative_to(self.workdir)}"
