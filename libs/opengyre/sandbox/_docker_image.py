"""Building a Harbor task's ``environment/Dockerfile`` into a local image, with no image registry.

There is no registry to pull from, and a build must never quietly run on some other image than the one the
Dockerfile names: every ``FROM`` must be a local base image (``opengyre-base:bookworm`` unless told others), an
earlier stage of the same Dockerfile, or ``scratch``; anything else is refused before Docker is asked, with the
file and line. The build itself never pulls and its ``RUN`` steps have no network (``--network none``).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from ._base import SandboxError
from ._docker import BASE_IMAGE, docker_executable

__all__ = ["DockerfileError", "ImageBuild", "build_image", "check_dockerfile"]

_BUILD_TIMEOUT_S = 1800.0


class DockerfileError(ValueError):
    """The Dockerfile cannot be built here as it stands (it names what and where)."""


@dataclass(frozen=True)
class ImageBuild:
    tag: str
    image_id: str
    size_bytes: int
    duration_s: float


def _instructions(text: str) -> list[tuple[int, str]]:
    """(first line number, instruction with its continuation lines joined) for each instruction."""
    out: list[tuple[int, str]] = []
    pending: list[str] = []
    first = 0
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not pending:
            if not line or line.startswith("#"):
                if lineno == 1 and re.match(r"#\s*escape\s*=", line) and not re.match(r"#\s*escape\s*=\s*\\$", line):
                    raise DockerfileError(f"line 1: only the default escape character (\\) is supported: {raw}")
                continue
            first = lineno
        elif not line or line.startswith("#"):
            continue  # comments and blank lines inside a continued instruction are dropped, as Docker does
        if line.endswith("\\"):
            pending.append(line[:-1])
            continue
        pending.append(line)
        out.append((first, " ".join(pending)))
        pending = []
    if pending:
        out.append((first, " ".join(pending)))
    return out


def check_dockerfile(dockerfile: Path, bases: Collection[str] = (BASE_IMAGE,)) -> list[str]:
    """The images the Dockerfile builds ``FROM`` (each one of ``bases``); raises ``DockerfileError`` naming the
    line of a ``FROM`` that is anything else (a registry image, a variable, a flag)."""
    path = Path(dockerfile)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise DockerfileError(f"{path}: cannot be read: {exc}") from exc
    stages: set[str] = set()
    used: list[str] = []
    for lineno, ins in _instructions(text):
        words = ins.split()
        if words[0].upper() != "FROM":
            continue
        where = f"{path}:{lineno}: {ins}"
        args = words[1:]
        if not args or any(a.startswith("--") for a in args):
            raise DockerfileError(f"{where}: FROM takes one image (flags such as --platform are not supported)")
        image = args[0]
        if len(args) not in (1, 3) or (len(args) == 3 and args[1].upper() != "AS"):
            raise DockerfileError(f"{where}: expected FROM IMAGE [AS NAME]")
        if "$" in image:
            raise DockerfileError(f"{where}: the image is a build variable; it must name a local base image")
        if image.lower() in stages or image == "scratch":
            pass
        elif image in bases:
            used.append(image)
        else:
            raise DockerfileError(
                f"{where}: {image} is not a local base image; there is no image registry here, so a task's "
                f"Dockerfile must build FROM one of {sorted(bases)} (make sandbox-image builds it)"
            )
        if len(args) == 3:
            stages.add(args[2].lower())
    if not used and not stages:
        raise DockerfileError(f"{path}: no FROM instruction")
    return used


def build_image(
    context: Path, tag: str, *, dockerfile: Path | None = None, bases: Collection[str] = (BASE_IMAGE,)
) -> ImageBuild:
    """``docker build`` the context (``dockerfile`` default ``context/Dockerfile``) as ``tag``, after
    ``check_dockerfile``; a base image that is not built is a ``SandboxError`` saying so."""
    context = Path(context)
    dockerfile = Path(dockerfile) if dockerfile is not None else context / "Dockerfile"
    used = check_dockerfile(dockerfile, bases)
    exe = docker_executable()
    for image in sorted(set(used)):
        if subprocess.run([exe, "image", "inspect", image], capture_output=True, check=False).returncode != 0:
            raise SandboxError(f"{dockerfile}: base image {image} is not built here (make sandbox-image)")
    # The classic builder: it never pulls an image that exists locally, and --network none reaches its RUN steps.
    env = {**os.environ, "DOCKER_BUILDKIT": "0"}
    cmd = [exe, "build", "--pull=false", "--network", "none", "--quiet", "-t", tag, "-f", str(dockerfile), str(context)]
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=_BUILD_TIMEOUT_S, check=False)
    duration = time.monotonic() - start
    if proc.returncode != 0:
        raise SandboxError(f"docker build of {dockerfile} failed: {proc.stderr.strip()[-4000:]}")
    info = subprocess.run(
        [exe, "image", "inspect", "-f", "{{.Id}} {{.Size}}", tag], capture_output=True, text=True, check=False
    )
    if info.returncode != 0:
        raise SandboxError(f"docker build of {dockerfile} made no image {tag}: {info.stderr.strip()}")
    image_id, size = info.stdout.split()
    return ImageBuild(tag, image_id, int(size), duration)
