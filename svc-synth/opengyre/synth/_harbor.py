"""Harbor task directories: export a built task, import one from elsewhere (ours round-trip to the same blueprint;
a foreign one is checked against Harbor's own rules, multi-step tasks included, and says what it needs of a
container that the host sandbox cannot give: ``_harbor_rules``)."""

from __future__ import annotations

import re
import shutil
import tomllib
from dataclasses import dataclass
from pathlib import Path

from ._blueprint import Blueprint, load_blueprint
from ._build import BuiltTask, write_task
from ._harbor_rules import container_needs, task_problems

__all__ = ["HarborTask", "export_task", "import_task"]

_TASK_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9._-]*/[a-zA-Z0-9][a-zA-Z0-9._-]*$")


@dataclass(frozen=True)
class HarborTask:
    task_id: str  # a subject-safe id
    name: str  # task.toml's [task] name (org/name)
    version: int
    instruction: str
    path: Path
    blueprint: Blueprint | None  # ours carry it under tests/; a foreign task has none
    has_solution: bool
    steps: tuple[str, ...] = ()  # a multi-step task's steps, in order (instruction: the first step's)
    # Why the host sandbox cannot run it (empty: it can); run_solution refuses it with these
    container_needs: tuple[str, ...] = ()


def export_task(task: BuiltTask, out_dir: Path) -> Path:
    return write_task(task, out_dir)


def import_task(src: Path, dest: Path | None = None) -> HarborTask:
    """Check a Harbor task directory and (with ``dest``) copy it there. Raises ``ValueError`` saying what is wrong."""
    src = Path(src)
    toml_path = src / "task.toml"
    if not toml_path.is_file():
        raise ValueError(f"{src}: no task.toml")
    try:
        conf = tomllib.loads(toml_path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{src}: task.toml does not parse: {exc}") from None
    problems = task_problems(src, conf)
    if problems:
        raise ValueError(f"{src}: Harbor refuses this task: {'; '.join(problems)}")
    env = conf.get("environment", {})
    if (
        not (src / "environment" / "Dockerfile").is_file()
        and not env.get("docker_image")
        and not (src / "environment" / "docker-compose.yaml").is_file()
    ):
        raise ValueError(f"{src}: no environment/Dockerfile, docker-compose.yaml or [environment] docker_image")
    for p in src.rglob("*"):
        if p.is_symlink() and not p.resolve().is_relative_to(src.resolve()):
            raise ValueError(f"{src}: {p.relative_to(src)} links out of the task")
    task = conf.get("task", {})
    name = str(task.get("name") or f"imported/{src.name}")
    if not _TASK_NAME.match(name) or ".." in name:
        raise ValueError(f"{src}: [task] name {name!r} is not org/name")
    meta = conf.get("metadata", {})
    if not isinstance(meta, dict):
        raise ValueError(f"{src}: [metadata] is not a table")
    try:
        version = int(meta.get("task_version", 1))
    except (TypeError, ValueError):
        raise ValueError(f"{src}: [metadata] task_version {meta.get('task_version')!r} is not an integer") from None
    bp_path = src / "tests" / "blueprint.json"
    bp = load_blueprint(bp_path.read_bytes()) if bp_path.is_file() else None
    task_id = bp.task_id if bp else re.sub(r"[^A-Za-z0-9_-]", "-", name.replace("/", "--"))[:120]
    where = src
    if dest is not None:
        if Path(dest).exists():
            raise FileExistsError(f"{dest} exists")
        shutil.copytree(src, dest, symlinks=True)
        where = Path(dest)
    steps = tuple(str(st["name"]) for st in conf.get("steps") or ())
    first = src / "steps" / steps[0] / "instruction.md" if steps else src / "instruction.md"
    solved = (src / "solution" / "solve.sh").is_file() or any(
        (src / "steps" / st / "solution" / "solve.sh").is_file() for st in steps
    )
    return HarborTask(task_id, name, version, first.read_text(), where, bp, solved, steps, container_needs(src, conf))
