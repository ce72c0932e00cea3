"""Start a harness (any ``HarnessSpec``) in the task's sandbox, against one execution of the proxy.

The harness runs in a sandbox of the selected backend (``opengyre.sandbox``; clean environment, private home and
tmp, time, memory, process and disk limits, its whole tree killed at the end) with the workspace as its working
directory, mounted writable at ``/app`` (Harbor's convention), so the workspace is preserved in place for the
evaluator. The proxy is its only way out: under the namespace backend (the default) the execution's base URL
(``http://127.0.0.1:<port>/x/<execution>/v1``) is the sandbox's one egress endpoint, reached at the same address
inside, and nothing else of the host's network is; the process backend (``none``, chosen explicitly) cannot
bridge one endpoint alone and gives the harness the host's network.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from opengyre.sandbox import LocalSandbox, Mount, SandboxLimits, selected_backend

from ._spec import HarnessSpec

__all__ = ["SKILLS_DIR", "HarnessOutcome", "HarnessTarget", "egress_of", "run_harness"]

log = logging.getLogger(__name__)
DEFAULT_LIMITS = SandboxLimits(timeout_s=1800.0, memory_mb=8192)
WORKSPACE = "/app"  # where the harness sees the task's workspace (Harbor's convention)
SKILLS_DIR = "/skills"  # where it sees the task's skills, read-only (a Harbor task's ``skills_dir``)


@dataclass(frozen=True)
class HarnessTarget:
    """What a harness is given: the execution's endpoint and key, the model name, the workspace, the task."""

    base_url: str
    api_key: str
    model: str
    workdir: Path
    instruction: str
    # The context the proxy serves, in tokens (``ExecutionAccess.context_length``); a template naming
    # ``{context_length}`` is refused without it.
    context_length: int | None = None
    # The task's skills (``environment/skills/``: a folder per skill, each with its SKILL.md), shown read-only
    # at ``SKILLS_DIR``; None: the task ships none.
    skills: Path | None = None


@dataclass(frozen=True)
class HarnessOutcome:
    """How the harness ended. ``finish_reason``: the harness's own from its summary file where it wrote a valid
    one (the built-in one: submitted / max-turns / timeout / model-error); else ``timeout`` when the sandbox
    killed it at its time limit, ``exited`` (exit 0) or ``crashed`` (any other exit)."""

    exit_code: int
    finish_reason: str
    summary: dict[str, Any] | None
    timed_out: bool
    stdout: str
    stderr: str
    duration_s: float
    signal: int | None = None  # the signal that ended the harness when no limit of the sandbox did
    isolation: str = ""  # the sandbox's backend that ran it (``SandboxResult.isolation``)
    oom_kills: int | None = None  # OOM kills the kernel counted while it ran (``SandboxResult.oom_kills``)


def _anthropic_base(base_url: str) -> str:
    # The Anthropic SDK appends /v1/messages itself: the execution's root, without the OpenAI /v1.
    return base_url.rstrip("/").removesuffix("/v1")


_SUMMARY_LIMIT = 1 << 20


def _read_summary(path: Path) -> dict[str, Any] | None:
    # The harness wrote it (or planted something else there): not through a symlink, only a regular file of bounded
    # size, opened without blocking. A FIFO read with ``read_text`` would wait for a writer that never comes.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None  # none written, or a symlink: the exit status is all there is
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > _SUMMARY_LIMIT:
            return None
        data = json.loads(os.read(fd, _SUMMARY_LIMIT))
    except (OSError, ValueError):
        return None  # garbage: the exit status is all there is
    finally:
        os.close(fd)
    return data if isinstance(data, dict) and isinstance(data.get("finish_reason"), str) else None


def egress_of(base_url: str) -> str:
    """The proxy's ``host:port`` from an execution's base URL: the sandbox's one way out (loopback only)."""
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"the base URL {base_url!r} is not an http(s) URL")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.hostname}:{port}"


def run_harness(
    spec: HarnessSpec, target: HarnessTarget, limits: SandboxLimits | None = None, *, backend: str | None = None
) -> HarnessOutcome:
    """Run ``spec`` to its end (blocking; ``asyncio.to_thread`` from async code). ``backend``: the sandbox's
    (None: ``$OPENGYRE_SANDBOX``, else the namespace one)."""
    lim = limits or DEFAULT_LIMITS
    name = selected_backend(backend)
    if lim.network:
        raise ValueError(
            "a harness reaches the proxy through its sandbox's egress, and nothing else: run it with "
            "SandboxLimits(network=False)"
        )
    egress = [egress_of(target.base_url)]
    if name == "none":
        # The process backend has no network namespace to bridge one endpoint into: the host's network it is.
        lim, egress = dataclasses.replace(lim, network=True), []
    workdir = Path(target.workdir).resolve()
    if not workdir.is_dir():
        raise ValueError(f"the workspace {workdir} is not a directory")
    mounts = [Mount(workdir, WORKSPACE, writable=True)]
    for host, inside in spec.mounts.items():
        if not Path(host).exists():
            raise ValueError(f"harness {spec.name!r}: its mount {host} does not exist")
        if name == "none" and inside != host:
            raise ValueError(
                f"harness {spec.name!r}: under the process backend (none) it sees {host} at its host path, not at "
                f"{inside}: mount it at its own path"
            )
        mounts.append(Mount(Path(host), inside, writable=False))
    if target.skills is not None:
        if Path(target.skills).is_symlink() or not Path(target.skills).is_dir():
            # A link could name anything the caller can read (a task's tests/ or solution/): never followed.
            raise ValueError(f"the task's skills {target.skills} are not a directory (a link is not followed)")
        skills = Path(target.skills).resolve()
        if name == "none":
            # No mount namespace to show them at SKILLS_DIR: the instruction's path is then missing, said here.
            log.warning("the process backend (none) cannot show the task's skills at %s", SKILLS_DIR)
        else:
            mounts.append(Mount(skills, SKILLS_DIR, writable=False))
    with LocalSandbox(lim, prefix="og-harness-run-", mounts=mounts, egress=egress, backend=name) as sb:
        instruction_file = sb.root / "instruction.md"
        instruction_file.write_text(target.instruction)
        summary_file = sb.root / "harness-summary.json"
        known = {} if target.context_length is None else {"context_length": str(target.context_length)}
        argv, env = spec.render(
            {
                **known,
                "base_url": target.base_url,
                "anthropic_base_url": _anthropic_base(target.base_url),
                "api_key": target.api_key,
                "model": target.model,
                "workdir": sb.inside(workdir),
                "instruction": target.instruction,
                "instruction_file": sb.inside(instruction_file),
                "summary_file": sb.inside(summary_file),
                "python": sys.executable,
            }
        )
        result = sb.run(argv, cwd=workdir, env=env)
        summary = _read_summary(summary_file)
    if summary is not None:
        reason = str(summary["finish_reason"])
    elif result.timed_out:
        reason = "timeout"
    else:
        reason = "exited" if result.exit_code == 0 else "crashed"
    return HarnessOutcome(
        result.exit_code,
        reason,
        summary,
        result.timed_out,
        result.stdout,
        result.stderr,
        result.duration_s,
        result.signal,
        result.isolation,
        result.oom_kills,
    )
