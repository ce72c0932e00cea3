"""Building a task's Dockerfile with no image registry: every FROM is the local base image or an earlier stage,
anything else refused with its line before Docker is asked; and the Docker sandbox's refusals of bad settings.

The checks need no daemon; the build runs where a daemon answers and the base image is built (else skipped,
with the reason).
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

from opengyre.sandbox import (
    BASE_IMAGE,
    DockerfileError,
    DockerSandbox,
    Mount,
    SandboxError,
    build_image,
    check_dockerfile,
    docker_unavailable,
)


def _dockerfile(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "Dockerfile"
    path.write_text(text)
    return path


def test_the_local_base_and_earlier_stages_are_accepted(tmp_path: Path) -> None:
    text = (
        "# syntax comment\n"
        f"FROM {BASE_IMAGE} AS build\n"
        "RUN echo hi > /x\n"
        "FROM build\n"
        "COPY --from=build /x /y\n"
        "FROM scratch\n"
    )
    assert check_dockerfile(_dockerfile(tmp_path, text)) == [BASE_IMAGE]


@pytest.mark.parametrize(
    ("text", "line", "says"),
    [
        ("FROM python:3.12-slim\nWORKDIR /app\n", 1, "python:3.12-slim is not a local base image"),
        (f"FROM {BASE_IMAGE} AS a\nRUN true\nFROM \\\n  debian:bookworm\n", 3, "debian:bookworm is not a local"),
        ("ARG BASE=x\nFROM $BASE\n", 2, "build variable"),
        (f"FROM --platform=linux/amd64 {BASE_IMAGE}\n", 1, "flags"),
        (f"FROM {BASE_IMAGE} junk\n", 1, "FROM IMAGE"),
        ("FROM opengyre-base\n", 1, "opengyre-base is not a local base image"),  # :latest, which is not built
    ],
)
def test_anything_else_is_refused_naming_its_line(tmp_path: Path, text: str, line: int, says: str) -> None:
    path = _dockerfile(tmp_path, text)
    with pytest.raises(DockerfileError, match=says) as err:
        check_dockerfile(path)
    assert f"{path}:{line}:" in str(err.value)


def test_a_dockerfile_without_from_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DockerfileError, match="no FROM"):
        check_dockerfile(_dockerfile(tmp_path, "RUN true\n"))


def test_a_refused_dockerfile_is_never_built(tmp_path: Path) -> None:
    """The check comes before any docker call: with no daemon at all the refusal is still the Dockerfile's."""
    _dockerfile(tmp_path, "FROM ubuntu:24.04\n")
    with pytest.raises(DockerfileError, match=r"ubuntu:24\.04"):
        build_image(tmp_path, "og-never:1")


def test_bad_sandbox_settings_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="root"):
        DockerSandbox(user="0:0")
    with pytest.raises(ValueError, match="uid:gid"):
        DockerSandbox(user="nobody")
    with pytest.raises(ValueError, match="absolute"):
        DockerSandbox(mounts=[Mount(tmp_path, "app")])
    with pytest.raises(ValueError, match="share a target"):
        DockerSandbox(mounts=[Mount(tmp_path, "/app"), Mount(tmp_path / "x", "/app")])
    with pytest.raises(ValueError, match="container's own places"):
        DockerSandbox(mounts=[Mount(tmp_path, "/tmp/x")])
    with pytest.raises(ValueError, match="cpus"):
        DockerSandbox(cpus=0)
    with pytest.raises(SandboxError, match="not open"):
        DockerSandbox().run(["true"])


_WHY = docker_unavailable(BASE_IMAGE)


@pytest.mark.skipif(_WHY is not None, reason=f"docker sandbox: {_WHY}")
def test_a_task_dockerfile_builds_on_the_base_and_runs(tmp_path: Path) -> None:
    (tmp_path / "workspace").mkdir()
    (tmp_path / "workspace" / "data.txt").write_text("in the image\n")
    _dockerfile(tmp_path, f"FROM {BASE_IMAGE}\nWORKDIR /app\nCOPY workspace/ /app/\nRUN echo built > /built\n")
    tag = f"og-test-build:{uuid.uuid4().hex[:8]}"
    try:
        built = build_image(tmp_path, tag)
        assert built.tag == tag and built.size_bytes > 0 and built.image_id.startswith("sha256:")
        with DockerSandbox(image=tag) as sb:
            r = sb.run(["sh", "-c", "cat /built /app/data.txt"], cwd="/app")
        assert r.ok and r.stdout == "built\nin the image\n"
    finally:
        subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True, check=False)


@pytest.mark.skipif(_WHY is not None, reason=f"docker sandbox: {_WHY}")
def test_a_build_step_has_no_network(tmp_path: Path) -> None:
    _dockerfile(tmp_path, f"FROM {BASE_IMAGE}\nRUN ls /sys/class/net > /nets\n")
    tag = f"og-test-build:{uuid.uuid4().hex[:8]}"
    try:
        build_image(tmp_path, tag)
        with DockerSandbox(image=tag) as sb:
            r = sb.run(["cat", "/nets"])
        assert r.ok and r.stdout == "lo\n"  # the RUN step saw only a loopback: no bridge, no eth0
    finally:
        subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True, check=False)
