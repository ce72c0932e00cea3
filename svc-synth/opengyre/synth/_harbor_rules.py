"""Harbor's task rules as Harbor applies them (its task.toml schema and directory layout), and what a task needs of
a container that the host sandbox cannot give it.

``task_problems`` lists what Harbor itself would refuse: a value its config model does not take (a network mode
it does not know, a timeout that is not a number, ``[task]`` without a ``name``, a step without a name or
folder), or a layout it cannot load (single-step: ``instruction.md`` and ``tests/test.sh``; multi-step:
``steps/<name>/instruction.md`` and a ``test.sh`` of the step's or the task's). Harbor coerces a numeric string
to a number (its models are lax), so ``"60"`` is a timeout and ``"soon"`` is not.

``container_needs`` says why a valid task cannot run on the host sandbox (which runs one solution in a copy of
``environment/workspace`` at ``/app`` and the task's ``tests/test.sh`` apart): a Dockerfile that builds something
(``RUN`` other than installing packages the host has, ``COPY`` of anything but the workspace, ``ENV``, ``USER``,
...), an image or compose file, a separate verifier environment, several steps in one shared container,
Windows, GPUs. Such a task is refused there with these reasons, never run without what it needs and scored.
"""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path
from typing import Any

from opengyre.harness import SKILLS_DIR

__all__ = ["NETWORK_MODES", "container_needs", "task_problems"]

NETWORK_MODES = ("public", "no-network", "allowlist")
_ENV_MODES = ("shared", "separate")
_STEP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# Dockerfile instructions the host sandbox stands in for: the base image (the host's own tools), metadata, the
# working directory /app, and the workspace copied to /app.
_HARMLESS = {"FROM", "LABEL", "MAINTAINER", "ARG", "EXPOSE", "CMD", "ENTRYPOINT", "STOPSIGNAL", "HEALTHCHECK"}
_APT_INSTALL = re.compile(r"^apt-get update\s*&&\s*apt-get install -y (?:--no-install-recommends )?([\w.+\- ]+?)"
                          r"(?:\s*&&\s*rm -rf /var/lib/apt/lists/\*)?$")  # fmt: skip


def _number(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def _table(conf: dict[str, Any], key: str, where: str, problems: list[str]) -> dict[str, Any]:
    value = conf.get(key, {})
    if not isinstance(value, dict):
        problems.append(f"{where}{key} is not a table")
        return {}
    return value


def _phase(section: dict[str, Any], where: str, problems: list[str]) -> None:
    """The keys the phase and environment tables share: timeouts, a network mode with its hosts, resources."""
    for key in ("timeout_sec", "build_timeout_sec"):
        if key in section and _number(section[key]) is None:
            problems.append(f"{where}.{key} = {section[key]!r} is not a number")
        elif key in section and _number(section[key]) <= 0:  # type: ignore[operator]
            problems.append(f"{where}.{key} = {section[key]!r} is not a positive number of seconds")
    mode = section.get("network_mode")
    if mode is not None and mode not in NETWORK_MODES:
        problems.append(f"{where}.network_mode = {mode!r} is not one of {', '.join(NETWORK_MODES)}")
    hosts = section.get("allowed_hosts")
    if hosts is not None and not (isinstance(hosts, list) and all(isinstance(h, str) for h in hosts)):
        problems.append(f"{where}.allowed_hosts is not a list of host names")
    if "allow_internet" in section and not isinstance(section["allow_internet"], bool):
        problems.append(f"{where}.allow_internet = {section['allow_internet']!r} is not true or false")
    for key in ("cpus", "memory_mb", "storage_mb", "gpus"):
        if key in section and (_number(section[key]) is None or _number(section[key]) < 0):  # type: ignore[operator]
            problems.append(f"{where}.{key} = {section[key]!r} is not a non-negative number")
    if "os" in section and section["os"] not in ("linux", "windows"):
        problems.append(f"{where}.os = {section['os']!r} is not linux or windows")


def _verifier(section: dict[str, Any], where: str, problems: list[str]) -> None:
    _phase(section, where, problems)
    mode = section.get("environment_mode")
    if mode is not None and mode not in _ENV_MODES:
        problems.append(f"{where}.environment_mode = {mode!r} is not shared or separate")
    env = section.get("environment")
    if env is not None:
        if not isinstance(env, dict):
            problems.append(f"{where}.environment is not a table")
        else:
            if mode == "shared":
                problems.append(f"{where}.environment_mode = 'shared' with a {where}.environment table")
            _phase(env, f"{where}.environment", problems)
    if "env" in section and not isinstance(section["env"], dict):
        problems.append(f"{where}.env is not a table")


def task_problems(src: Path, conf: dict[str, Any]) -> list[str]:
    """What Harbor would refuse in this task directory and its parsed ``task.toml`` (empty: nothing)."""
    problems: list[str] = []
    if "schema_version" in conf and not isinstance(conf["schema_version"], str):
        problems.append(f"schema_version = {conf['schema_version']!r} is not a string")
    if "task" in conf:
        task = _table(conf, "task", "", problems)
        if isinstance(conf["task"], dict) and not isinstance(task.get("name"), str):
            problems.append("[task] has no name (Harbor requires [task] name = 'org/name' when [task] is given)")
    _phase(_table(conf, "environment", "", problems), "environment", problems)
    _phase(_table(conf, "agent", "", problems), "agent", problems)
    _verifier(_table(conf, "verifier", "", problems), "verifier", problems)
    if "artifacts" in conf and not (
        isinstance(conf["artifacts"], list) and all(isinstance(a, str | dict) for a in conf["artifacts"])
    ):
        problems.append("artifacts is not a list of paths")
    steps = conf.get("steps")
    if steps is None:
        if not (src / "instruction.md").is_file():
            problems.append("no instruction.md (nor [[steps]] with steps/<name>/instruction.md)")
        if not (src / "tests" / "test.sh").is_file():
            problems.append("no tests/test.sh (the verifier)")
        return problems
    if not isinstance(steps, list) or not steps or not all(isinstance(s, dict) for s in steps):
        return [*problems, "steps is not a non-empty array of [[steps]] tables"]
    seen: set[str] = set()
    for i, step in enumerate(steps):
        name = step.get("name")
        where = f"steps[{i}]"
        if not isinstance(name, str) or not _STEP_NAME.match(name):
            problems.append(f"{where} has no valid name (got {name!r})")
            continue
        if name in seen:
            problems.append(f"{where}: step name {name!r} repeats")
        seen.add(name)
        if "min_reward" in step and _number(step["min_reward"]) is None and not isinstance(step["min_reward"], dict):
            problems.append(f"{where}.min_reward = {step['min_reward']!r} is not a number")
        _phase(_table(step, "agent", f"{where}.", problems), f"{where}.agent", problems)
        _verifier(_table(step, "verifier", f"{where}.", problems), f"{where}.verifier", problems)
        folder = src / "steps" / name
        if not (folder / "instruction.md").is_file():
            problems.append(f"step {name!r}: no steps/{name}/instruction.md")
        if not (folder / "tests" / "test.sh").is_file() and not (src / "tests" / "test.sh").is_file():
            problems.append(f"step {name!r}: no steps/{name}/tests/test.sh nor a task-level tests/test.sh")
    return problems


def _dockerfile_needs(path: Path) -> list[str]:
    needs = []
    text = re.sub(r"\\\n", " ", path.read_text(errors="replace"))  # continuation lines joined
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        op, _, rest = line.partition(" ")
        op, rest = op.upper(), rest.strip()
        if op in _HARMLESS:
            continue
        if op == "WORKDIR" and rest in ("/app", "/app/"):
            continue
        words = rest.split()
        # What the host does: the workspace copied to /app, the task's skills shown at /skills.
        if op in ("COPY", "ADD") and [w.rstrip("/") for w in words] in (["workspace", "/app"], ["workspace", "."]):
            continue
        if op in ("COPY", "ADD") and [w.rstrip("/") for w in words] == ["skills", SKILLS_DIR]:
            continue
        if op == "RUN":
            m = _APT_INSTALL.match(rest)
            if m:
                missing = [p for p in shlex.split(m.group(1)) if shutil.which(p) is None]
                if not missing:
                    continue  # packages whose binaries the host has (what our tasks install)
                needs.append(f"Dockerfile line {n} installs {', '.join(missing)}, which the host lacks")
                continue
        needs.append(f"Dockerfile line {n} ({line[:80]}) builds what the host sandbox cannot")
    return needs


def container_needs(task_dir: Path, conf: dict[str, Any]) -> tuple[str, ...]:
    """Why this (valid) task cannot run on the host sandbox; empty: it can."""
    task_dir = Path(task_dir)
    needs: list[str] = []
    env = conf.get("environment") if isinstance(conf.get("environment"), dict) else {}
    assert isinstance(env, dict)
    dockerfile = task_dir / "environment" / "Dockerfile"
    if dockerfile.is_file():
        needs += _dockerfile_needs(dockerfile)
    if env.get("docker_image"):
        needs.append(f"[environment] docker_image = {env['docker_image']!r}: the task runs in that image")
    for name in ("docker-compose.yaml", "docker-compose.yml"):
        if (task_dir / "environment" / name).is_file():
            needs.append(f"environment/{name}: services in containers of their own")
    if env.get("os") == "windows":
        needs.append("[environment] os = 'windows'")
    if (_number(env.get("gpus", 0)) or 0) > 0:
        needs.append(f"[environment] gpus = {env['gpus']}")
    verifier = conf.get("verifier") if isinstance(conf.get("verifier"), dict) else {}
    assert isinstance(verifier, dict)
    if verifier.get("environment_mode") == "separate" or isinstance(verifier.get("environment"), dict):
        needs.append("[verifier] runs in a separate environment built from tests/ (its own image)")
    steps = conf.get("steps")
    if isinstance(steps, list) and steps:
        needs.append(f"{len(steps)} steps share one container across agent turns; the host runs one solution")
    return tuple(needs)
