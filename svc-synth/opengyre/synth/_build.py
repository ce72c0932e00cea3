"""From one blueprint, jointly: instruction, execution substrate (Dockerfile, runtime), initial workspace, rubric
evaluator and reference solution, laid out as a Harbor task directory (byte-identical for the same blueprint)."""

from __future__ import annotations

import hashlib
import os
import stat
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import msgspec

from opengyre.harness import SKILLS_DIR  # where a harness sees the task's skills (task.toml's skills_dir)

from ._blueprint import Blueprint, materials
from ._grade import GRADER_SOURCE, TEST_SH
from ._toml import dumps_toml

__all__ = ["BuiltTask", "build_task", "skill_digests", "task_skill_files", "write_task"]


_APT = {"unzip": "unzip", "git": "git", "jq": "jq", "sqlite3": "sqlite3"}  # bins python:3.12-slim lacks
_BASE_BINS = {"bash", "python3", "tar", "gzip", "sed", "grep", "awk", "sort", "cat"}


@dataclass(frozen=True)
class BuiltTask:
    blueprint: Blueprint
    files: dict[str, bytes]  # task-dir relative path -> content
    executables: frozenset[str]
    bins: tuple[str, ...]

    @property
    def workspace(self) -> dict[str, bytes]:
        pre = "environment/workspace/"
        return {p[len(pre) :]: b for p, b in self.files.items() if p.startswith(pre)}


def skill_digests(files: Mapping[str, bytes]) -> dict[str, str]:
    """A skill's files as a blueprint names them: skill-relative path -> sha256."""
    return {rel: hashlib.sha256(data).hexdigest() for rel, data in sorted(files.items())}


def task_skill_files(task_dir: Path, bp: Blueprint) -> dict[str, bytes]:
    """The skill's files as a task directory holds them (``environment/skills/<skill>/``): regular files only, not
    followed through a symlink (what a rebuild from the blueprint then checks against its digests)."""
    root = Path(task_dir) / "environment" / "skills" / bp.skill_name
    out: dict[str, bytes] = {}
    if root.is_dir() and not root.is_symlink():
        for p in sorted(root.rglob("*")):
            if stat.S_ISREG(p.lstat().st_mode):
                out[p.relative_to(root).as_posix()] = p.read_bytes()
    return out


def _skill_part(bp: Blueprint, skill: Mapping[str, bytes] | None) -> dict[str, bytes]:
    if not bp.skill_files:
        if skill:
            raise ValueError(f"blueprint {bp.task_id} names no skill files, and was given {len(skill)}")
        return {}
    if skill is None:
        raise ValueError(f"blueprint {bp.task_id} ships its skill {bp.skill_name!r}: build it with the skill's files")
    have = skill_digests(skill)
    if have != bp.skill_files:
        differ = sorted(set(have) ^ set(bp.skill_files) | {r for r in have if bp.skill_files.get(r) != have[r]})
        raise ValueError(f"the skill's files are not the ones blueprint {bp.task_id} names: {', '.join(differ)}")
    return {f"environment/skills/{bp.skill_name}/{rel}": data for rel, data in skill.items()}


def build_task(bp: Blueprint, skill: Mapping[str, bytes] | None = None) -> BuiltTask:
    """``skill``: the skill's files by skill-relative path, where the blueprint ships them (``skill_files``); they
    must be exactly those (a ``ValueError`` names the ones that differ)."""
    bp.validate()
    mats = materials(bp)
    files: dict[str, bytes] = _skill_part(bp, skill)
    executables: set[str] = {"solution/solve.sh", "tests/test.sh"}
    bins: set[str] = set()
    parts = [f"# {bp.goal}\n", "Work in `/app` (the current directory). Paths below are relative to it.\n"]
    if files:
        md = next((n for n in ("SKILL.md", "skill.md", "skills.md") if n in bp.skill_files), "SKILL.md")
        parts.append(
            f"The `{bp.skill_name}` skill this task exercises is in `{SKILLS_DIR}/{bp.skill_name}/` (read-only): "
            f"read its `{md}` first.\n"
        )
    solve = ["import json, os\n"]
    for i, (c, m) in enumerate(mats):
        for rel, data in m.files.items():
            files[f"environment/workspace/{rel}"] = data
        executables |= {f"environment/workspace/{e}" for e in m.executables}
        bins |= set(m.bins)
        parts.append(f"\n## Part {i + 1}\n\n{m.instruction}\n")
        solve.append(f"\ndef _{c.cid}():\n{textwrap.indent(m.solution, '    ')}\n\n_{c.cid}()\n")
    files["instruction.md"] = "".join(parts).encode()
    files["solution/solve.py"] = "".join(solve).encode()
    files["solution/solve.sh"] = (
        b'#!/bin/bash\n# Reference solution.\nset -e\nhere="$(cd "$(dirname "$0")" && pwd)"\n'
        b'cd "${APP_DIR:-/app}"\npython3 "$here/solve.py"\n'
    )
    files["tests/test.sh"] = TEST_SH.encode()
    files["tests/grade.py"] = GRADER_SOURCE.lstrip().encode()
    files["tests/rubric.json"] = (
        msgspec.json.format(
            msgspec.json.encode({"pass_threshold": bp.pass_threshold, "items": bp.acceptance}), indent=2
        )
        + b"\n"
    )
    files["tests/blueprint.json"] = msgspec.json.format(bp.encode(), indent=2) + b"\n"
    extra = sorted(_APT[b] for b in bins - _BASE_BINS if b in _APT)
    docker = ["FROM python:3.12-slim\n"]
    if extra:
        docker.append(
            f"RUN apt-get update && apt-get install -y --no-install-recommends {' '.join(extra)} "
            "&& rm -rf /var/lib/apt/lists/*\n"
        )
    docker += ["WORKDIR /app\n", "COPY workspace/ /app/\n"]
    environment: dict[str, object] = {"network_mode": "no-network", "workdir": "/app", "cpus": 1, "memory_mb": 1024}
    if bp.skill_files:
        docker.append(f"COPY skills/ {SKILLS_DIR}/\n")
        environment["skills_dir"] = SKILLS_DIR  # Harbor copies it into the agent's own skills directory
    files["environment/Dockerfile"] = "".join(docker).encode()
    files["task.toml"] = dumps_toml(
        {
            "schema_version": "1.3",
            "source": "opengyre-synth",
            "task": {
                "name": f"opengyre/{bp.task_id}",
                "description": bp.goal,
                "keywords": sorted({c.pattern_id for c in bp.challenges}),
            },
            "metadata": {
                "skill": bp.skill_name,
                "skill_id": bp.skill_id,
                "task_version": bp.version,
                "blueprint_digest": bp.digest(),
                "pass_threshold": bp.pass_threshold,
                "capabilities": dict(sorted(bp.capabilities.items())),
                "runtime_bins": sorted(bins),
            },
            "verifier": {"timeout_sec": 60.0},
            "agent": {"timeout_sec": 900.0},
            "environment": environment,
        }
    ).encode()
    return BuiltTask(bp, dict(sorted(files.items())), frozenset(executables), tuple(sorted(bins)))


def write_task(task: BuiltTask, out_dir: Path) -> Path:
    """Write the task directory (refusing a non-empty target, so nothing stale mixes in)."""
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise FileExistsError(f"{out_dir} exists and is not empty")
    for rel, data in task.files.items():
        path = out_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        os.chmod(path, 0o755 if rel in task.executables else 0o644)
    return out_dir
