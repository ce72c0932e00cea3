"""``make docker-check``: one Harbor task run end to end in the Docker sandbox backend.

The task (``scripts/docker-check-task``, or one given as the argument) is checked as Harbor-shaped by synth's
importer, its ``environment/Dockerfile`` built FROM the local base image, its workspace (the image's /app) copied
out to a host directory; then the agent command (the task's ``solution/solve.sh``) runs in a fresh container
against that workspace at /app, reaching a tool service on the host's loopback only through the sandbox's egress
bridge (the container has --network none), and the verifier (``tests/test.sh``) grades it in another container,
writing /logs/verifier/reward.json. Controls, which must fail: the verifier on the untouched workspace (reward 0),
the agent without the egress endpoint (the tool service is out of reach), a Dockerfile FROM a registry image
(refused, naming the line). Exit 0 only when all of that holds.
"""

from __future__ import annotations

import argparse
import http.server
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from opengyre.sandbox import (
    BASE_IMAGE,
    DockerfileError,
    DockerSandbox,
    Mount,
    SandboxLimits,
    build_image,
    check_dockerfile,
    docker_unavailable,
)
from opengyre.synth import import_task

HERE = Path(__file__).resolve().parent


class _Tool(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"product\n" if self.path == "/operation" else b"unknown\n"
        self.send_response(200 if self.path == "/operation" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def _step(what: str, start: float) -> None:
    print(f"  {what} ({time.monotonic() - start:.2f} s)")


def _verify(image: str, task: Path, ws: Path, limits: SandboxLimits) -> tuple[float, str]:
    logs = Path(tempfile.mkdtemp(prefix="og-check-logs-"))
    try:
        mounts = [Mount(ws, "/app", True), Mount(task / "tests", "/tests"), Mount(logs, "/logs", True)]
        with DockerSandbox(limits, image=image, mounts=mounts) as sb:
            r = sb.run(["bash", "/tests/test.sh"], cwd="/app")
        if not r.ok:
            raise SystemExit(f"verifier failed (exit {r.exit_code}): {r.stderr}")
        reward = json.loads((logs / "verifier" / "reward.json").read_text())["reward"]
        return float(reward), r.stdout.strip()
    finally:
        shutil.rmtree(logs, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("task", nargs="?", type=Path, default=HERE / "docker-check-task")
    ap.add_argument("--keep-image", action="store_true", help="leave the task's image built")
    args = ap.parse_args()
    why = docker_unavailable(BASE_IMAGE)
    if why is not None:
        print(f"docker-check: {why}", file=sys.stderr)
        return 1
    task = import_task(args.task.resolve())  # Harbor-shaped (task.toml, instruction.md, tests/test.sh, Dockerfile)
    print(f"docker-check: task {task.name} ({task.path})")
    tag = f"og-task-{task.task_id.lower()}:check"
    env_dir = task.path / "environment"
    limits = SandboxLimits(timeout_s=120, memory_mb=None, group_memory_mb=512, max_processes=256, disk_mb=1024)

    t = time.monotonic()
    built = build_image(env_dir, tag)
    _step(f"built {tag} FROM {', '.join(check_dockerfile(env_dir / 'Dockerfile'))}: {built.size_bytes} bytes", t)
    tool = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Tool)
    threading.Thread(target=tool.serve_forever, daemon=True).start()
    endpoint = f"127.0.0.1:{tool.server_address[1]}"
    ws_root = Path(tempfile.mkdtemp(prefix="og-check-ws-"))
    ok = True
    try:
        ws = ws_root / "app"
        ws.mkdir()
        t = time.monotonic()
        with DockerSandbox(limits, image=tag, mounts=[Mount(ws, "/out", True)]) as sb:
            copied = sb.run(["cp", "-a", "/app/.", "/out/"])
        if not copied.ok:
            raise SystemExit(f"copying the image's /app out failed: {copied.stderr}")
        _step(f"workspace from the image's /app: {sorted(p.name for p in ws.iterdir())}", t)

        t = time.monotonic()
        reward0, _ = _verify(tag, task.path, ws, limits)
        _step(f"control: the verifier on the untouched workspace: reward {reward0}", t)
        ok &= reward0 == 0.0

        agent_mounts = [Mount(ws, "/app", True), Mount(task.path / "solution", "/solution")]
        env = {"TOOL_URL": f"http://{endpoint}"}
        t = time.monotonic()
        with DockerSandbox(limits, image=tag, mounts=agent_mounts) as sb:
            cut_off = sb.run(["bash", "/solution/solve.sh"], cwd="/app", env=env)
        last = cut_off.stderr.strip().splitlines()[-1:]
        _step(f"control: the agent without egress: exit {cut_off.exit_code} ({last[0] if last else ''})", t)
        ok &= not cut_off.ok and not (ws / "result.json").exists()

        t = time.monotonic()
        with DockerSandbox(limits, image=tag, mounts=agent_mounts, egress=[endpoint]) as sb:
            agent = sb.run(["bash", "/solution/solve.sh"], cwd="/app", env=env)
        _step(f"agent (egress to {endpoint} only): exit {agent.exit_code}: {agent.stdout.strip()}", t)
        ok &= agent.ok

        t = time.monotonic()
        reward, said = _verify(tag, task.path, ws, limits)
        _step(f"verifier: {said}", t)
        ok &= reward == 1.0

        bad = Path(tempfile.mkdtemp(prefix="og-check-bad-"))
        (bad / "Dockerfile").write_text("# a synth task's substrate, from a registry\nFROM python:3.12-slim\n")
        try:
            build_image(bad, "og-never:check")
            print("  control: a Dockerfile FROM a registry image was BUILT (must be refused)")
            ok = False
        except DockerfileError as exc:
            print(f"  control: refused: {exc}")
        finally:
            shutil.rmtree(bad, ignore_errors=True)
    finally:
        tool.shutdown()
        shutil.rmtree(ws_root, ignore_errors=True)
        if not args.keep_image:
            subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True, check=False)
    print(f"docker-check: {'PASS' if ok else 'FAIL'}: reward {reward} in the docker backend")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
