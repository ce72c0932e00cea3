"""What the sandbox adds to the demo's rollout: the demo's own episodes, harness side, in the namespace sandbox
(bubblewrap, egress through the relay) against the process backend (``none``, the launcher before it), alternated
in one process.

    .venv/bin/python bench/rollout_sandbox_bench.py [--rounds 4] [--concurrency 6]

The demo's tasks (its three skills at level 0, built by svc-synth here), each episode the reference harness
(``opengyre.harness``, the demo's options) in a fresh copy of the task's workspace, against a scripted OpenAI chat
server on loopback that answers the task's reference solution (``opengyre.loop.reference_messages``: run the
solution, then submit) — so both backends run the same episode, command for command, and the model's time, which
the sandbox cannot change, is zero. What is measured is everything the sandbox is on the path of: starting it,
the harness's Python start and imports inside it, every model call through the egress relay, the solution's
command, the teardown. ``--concurrency`` episodes run at once (the demo runs 12 on its 2 cells).

Per episode: wall time, and CPU time of this process and everything it started (a cgroup v1 ``cpuacct`` group:
rusage misses the namespace's processes — ``bench/sandbox_bench.py``). The demo's rollout phase is the model's
time plus this; the bench prints the added CPU per episode against the demo's rollout figures given with
``--demo-rollout-s`` / ``--demo-episodes`` (docs/benchmarks.md has a run's).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

from sandbox_bench import CpuMeter

from opengyre.harness import HarnessTarget, builtin_spec, run_harness
from opengyre.loop import TaskRef, reference_messages
from opengyre.synth import GateLimits, Synthesizer, ingest

ROOT = Path(__file__).resolve().parents[1]
# The demo's skills and its harness options (`opengyre demo`: apps/opengyre/cli/_demo.py).
DEMO_SKILLS = ("csv-report", "text-cleanup", "log-triage")
DEMO_HARNESS = ("--max-turns", "3", "--max-tokens", "256", "--command-timeout", "20", "--temperature", "0.7")


class _Script(BaseHTTPRequestHandler):
    """``POST /v1/chat/completions``: the next assistant turn of the task's reference episode (by how many
    assistant turns the request already holds), as a Chat Completions response."""

    replies: ClassVar[dict[str, list[dict[str, Any]]]] = {}

    def log_message(self, *_: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        msgs = body["messages"]
        instruction = next(m["content"] for m in msgs if m["role"] == "user")
        turns = self.replies[instruction]
        done = sum(m["role"] == "assistant" for m in msgs)
        reply = turns[min(done, len(turns) - 1)]
        out = {
            "id": f"chatcmpl-{done}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": None, "tool_calls": reply["tool_calls"]},
                    "finish_reason": "tool_calls",
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
        data = json.dumps(out).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _tasks(root: Path) -> list[TaskRef]:
    skills = [s for s in ingest(ROOT / "svc-synth" / "skills", root / "skills").accepted if s.name in DEMO_SKILLS]
    synth = Synthesizer(root / "store", GateLimits(), workers=2)
    builds = synth.synthesize_many([(s, 7) for s in skills], level=0)
    bad = [b.blueprint.task_id for b in builds if not b.ok]
    if bad or len(builds) != len(DEMO_SKILLS):
        raise SystemExit(f"the demo's tasks did not build: {bad or len(builds)}")
    return [TaskRef(b.blueprint.task_id, 1, b.task_dir, (b.task_dir / "instruction.md").read_text()) for b in builds]


def _episode(task: TaskRef, base_url: str, backend: str, scratch: Path) -> tuple[float, str]:
    ws = Path(tempfile.mkdtemp(dir=scratch)) / "app"
    src = task.task_dir / "environment" / "workspace"
    shutil.copytree(src, ws, symlinks=True) if src.is_dir() else ws.mkdir()
    target = HarnessTarget(base_url=base_url, api_key="bench", model="m", workdir=ws, instruction=task.instruction)
    t0 = time.perf_counter()
    out = run_harness(builtin_spec(*DEMO_HARNESS), target, backend=backend)
    wall = time.perf_counter() - t0
    shutil.rmtree(ws.parent, ignore_errors=True)
    return wall, out.finish_reason


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=4, help="rounds of each backend, alternated")
    ap.add_argument("--concurrency", type=int, default=6, help="episodes at once")
    ap.add_argument("--demo-rollout-s", type=float, default=None, help="a demo run's rollout phase, seconds")
    ap.add_argument("--demo-episodes", type=int, default=36, help="that run's episodes")
    args = ap.parse_args()
    logging.getLogger("opengyre.sandbox").setLevel(logging.ERROR)  # the none backend's warning per sandbox
    meter = CpuMeter()
    scratch = Path(tempfile.mkdtemp(prefix="og-rollout-bench-"))
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Script)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        tasks = _tasks(scratch)
        _Script.replies = {t.instruction: [m for m in reference_messages(t) if m["role"] == "assistant"] for t in tasks}
        base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        print(
            f"CPU by {meter.how}; load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; {len(tasks)} tasks, "
            f"{args.rounds} rounds x {args.concurrency} episodes per backend, alternated"
        )
        walls: dict[str, list[float]] = {"none": [], "namespace": []}
        cpu: dict[str, float] = {"none": 0.0, "namespace": 0.0}
        reasons: dict[str, set[str]] = {"none": set(), "namespace": set()}
        with ThreadPoolExecutor(args.concurrency) as pool:
            for backend in walls:  # warm: page cache, probes
                list(pool.map(lambda t, b=backend: _episode(t, base_url, b, scratch), tasks))
            for r in range(args.rounds):
                for backend in ("none", "namespace") if r % 2 == 0 else ("namespace", "none"):
                    batch = [tasks[i % len(tasks)] for i in range(args.concurrency)]
                    c0 = meter.now()
                    got = list(pool.map(lambda t, b=backend: _episode(t, base_url, b, scratch), batch))
                    cpu[backend] += meter.now() - c0
                    walls[backend] += [w for w, _ in got]
                    reasons[backend] |= {why for _, why in got}
        n = args.rounds * args.concurrency
        base_w, base_c = statistics.median(walls["none"]), cpu["none"] / n
        print(
            f"{'backend':<10} {'episodes':>8} {'wall s (median)':>16} {'cpu s / episode':>16} {'wall x':>7} {'cpu x':>7}"
        )
        for b in walls:
            w, c = statistics.median(walls[b]), cpu[b] / n
            print(f"{b:<10} {n:8d} {w:16.3f} {c:16.3f} {w / base_w:7.2f} {c / base_c:7.2f}  ends: {sorted(reasons[b])}")
        added = cpu["namespace"] / n - base_c
        print(
            f"the namespace sandbox adds {added * 1000:.0f} ms CPU and {statistics.median(walls['namespace']) - base_w:+.3f} s wall per episode"
        )
        if args.demo_rollout_s:
            share = added * args.demo_episodes / (args.demo_rollout_s * (os.cpu_count() or 1))
            print(
                f"against a demo rollout of {args.demo_rollout_s:.0f} s with {args.demo_episodes} episodes on "
                f"{os.cpu_count()} CPUs: {share:.2%} of the rollout's CPU time"
            )
    finally:
        server.shutdown()
        meter.close()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
