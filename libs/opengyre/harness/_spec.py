"""A harness as a command template: argv and environment with ``{placeholder}`` fields.

Every harness — the built-in one, Claude Code, OpenCode, Codex, a user's own — is started the same way: the
launcher fills the template with the execution's base URL and key (and the workspace, the task) and runs it in
the task's sandbox. A template that names an unknown field is refused when the spec is made, not at run time.
"""

from __future__ import annotations

import posixpath
import string
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["PLACEHOLDERS", "HarnessSpec", "builtin_spec"]

# What a template may name, and what each is filled with.
PLACEHOLDERS: dict[str, str] = {
    "base_url": "the OpenAI-compatible base URL of the execution: http://proxy/x/<execution>/v1",
    "anthropic_base_url": "the Anthropic base URL of the execution: http://proxy/x/<execution>",
    "api_key": "the execution's key (og1.<execution>.<role>.<mac>)",
    "model": "the model name to ask for",
    "context_length": "the context the proxy serves, in tokens (so the harness compacts before the proxy refuses)",
    "workdir": "the task's workspace (absolute); also the command's working directory",
    "instruction": "the task's instruction, as text",
    "instruction_file": "a file holding the instruction",
    "summary_file": "where the harness may write its JSON summary (finish_reason, turns, ...)",
    "python": "this Python interpreter (for harnesses written in Python)",
}


def _fields(template: str) -> list[str]:
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ValueError(f"bad template {template!r}: {exc}") from None
    out = []
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if name not in PLACEHOLDERS:
            raise ValueError(f"unknown placeholder {{{name}}} in {template!r}; known: {', '.join(PLACEHOLDERS)}")
        if spec or conversion:
            raise ValueError(f"placeholder {{{name}}} in {template!r} takes no format spec or conversion")
        out.append(name)
    return out


@dataclass(frozen=True)
class HarnessSpec:
    """``argv`` and ``env`` templates. ``{{`` and ``}}`` are literal braces. ``mounts``: host paths the harness
    needs beyond the system's and the Python install (its own install dir, e.g. a CLI in a user's node prefix),
    each shown read-only at its target inside the sandbox (``{host: inside}``, both absolute). Under the process
    backend (``none``) the harness sees the host's paths as they are, so there a target must be its host path."""

    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    mounts: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a harness spec needs a name")
        if not self.argv or not self.argv[0]:
            raise ValueError(f"harness {self.name!r}: argv is empty")
        object.__setattr__(self, "argv", tuple(self.argv))
        object.__setattr__(self, "env", dict(self.env))
        object.__setattr__(self, "mounts", dict(self.mounts))
        for host, inside in self.mounts.items():
            for what, path in (("host path", host), ("target", inside)):
                if not path.startswith("/") or posixpath.normpath(path) != path or path == "/":
                    raise ValueError(
                        f"harness {self.name!r}: mount {what} {path!r} must be a normalised absolute path other than /"
                    )
        for part in (*self.argv, *self.env.values()):
            _fields(part)

    @property
    def placeholders(self) -> frozenset[str]:
        return frozenset(f for part in (*self.argv, *self.env.values()) for f in _fields(part))

    def render(self, values: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
        missing = sorted(self.placeholders - values.keys())
        if missing:
            raise ValueError(f"harness {self.name!r}: no value for {', '.join(missing)}")
        return [a.format_map(values) for a in self.argv], {k: v.format_map(values) for k, v in self.env.items()}

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> HarnessSpec:
        """From ``{"name": ..., "argv": [...], "env": {...}, "mounts": {...}}`` (a TOML table, a JSON object)."""
        unknown = sorted(set(data) - {"name", "argv", "env", "mounts"})
        if unknown:
            raise ValueError(f"unknown harness spec keys: {', '.join(unknown)} (known: name, argv, env, mounts)")
        argv, env, mounts = data.get("argv"), data.get("env", {}), data.get("mounts", {})
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
            raise ValueError("harness spec: argv must be a list of strings")
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise ValueError("harness spec: env must be a table of strings")
        strings = isinstance(mounts, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in mounts.items())
        if not strings:
            raise ValueError("harness spec: mounts must be a table of strings (host path = path inside)")
        name = data.get("name")
        if not isinstance(name, str):
            raise ValueError("harness spec: name must be a string")
        return cls(name, tuple(argv), env, mounts)

    @classmethod
    def from_toml(cls, path: Path) -> HarnessSpec:
        return cls.from_mapping(tomllib.loads(Path(path).read_text()))


def builtin_spec(*options: str) -> HarnessSpec:
    """The reference harness (``opengyre harness run``) as a template; ``options`` are extra CLI flags
    (``"--max-turns", "20"``). The key travels in the environment, not on the command line."""
    argv = (
        "{python}",
        "-m",
        "opengyre.harness",
        "--base-url",
        "{base_url}",
        "--model",
        "{model}",
        "--workdir",
        "{workdir}",
        "--task-file",
        "{instruction_file}",
        "--summary-file",
        "{summary_file}",
        *options,
    )
    return HarnessSpec("opengyre", argv, {"OPENAI_API_KEY": "{api_key}"})
