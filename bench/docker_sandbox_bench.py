"""What one sandboxed execution costs to start: ``true`` run through each backend, in this one process.

Backends: ``docker`` (a fresh container per command: docker run, then rm), ``namespace`` (bubblewrap), ``none``
(the process sandbox), plus the floor under the Docker backend, a bare ``docker run --rm --network none IMAGE
true`` from the CLI, and for scale ``docker exec`` into one kept container. Prints per-execution wall time (median, p90) and each backend's ratio to the namespace one.

    .venv/bin/python bench/docker_sandbox_bench.py --runs 20
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from collections.abc import Callable

from opengyre.sandbox import BASE_IMAGE, DockerSandbox, LocalSandbox, SandboxError, SandboxLimits, docker_unavailable


class _InlineRemoval(DockerSandbox):
    """The backend removing each container before ``run`` returns: the baseline for its removal beside the next."""

    def _remove_later(self, name: str) -> None:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)


def _times(fn: Callable[[], object], runs: int) -> list[float]:
    fn()  # warm: the first start pays for page cache and, for docker, the image's layers
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def _backend(name: str, runs: int) -> list[float] | None:
    try:
        with LocalSandbox(SandboxLimits(timeout_s=60), backend=name) as sb:

            def once() -> None:
                r = sb.run(["true"])
                assert r.ok, r.stderr

            return _times(once, runs)
    except SandboxError as exc:
        print(f"{name}: unavailable: {exc}")
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    why = docker_unavailable(BASE_IMAGE)
    if why is not None:
        raise SystemExit(f"docker backend: {why}")
    results: dict[str, list[float]] = {}
    for name in ("namespace", "none", "docker"):
        got = _backend(name, args.runs)
        if got is not None:
            results[name] = got
    with _InlineRemoval(SandboxLimits(timeout_s=60)) as sb:
        results["docker, rm before returning"] = _times(lambda: sb.run(["true"]), args.runs)
    bare = ["docker", "run", "--rm", "--network", "none", BASE_IMAGE, "true"]
    results["docker run --rm (CLI, bare)"] = _times(lambda: subprocess.run(bare, check=True), args.runs)
    # For scale, not a backend: a command exec'd into one kept container (what a container per task would cost).
    kept = subprocess.run(
        ["docker", "run", "-d", "--rm", "--network", "none", "--init", BASE_IMAGE, "sleep", "3600"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    try:
        run_in = ["docker", "exec", kept, "true"]
        results["docker exec (a kept container)"] = _times(lambda: subprocess.run(run_in, check=True), args.runs)
    finally:
        subprocess.run(["docker", "rm", "-f", kept], capture_output=True, check=False)
    base = statistics.median(results["namespace"]) if "namespace" in results else None
    print(f"{'backend':<30} {'median ms':>10} {'p90 ms':>8} {'vs namespace':>13}   ({args.runs} runs of `true`)")
    for name, ts in results.items():
        med = statistics.median(ts)
        p90 = sorted(ts)[int(0.9 * (len(ts) - 1))]
        ratio = f"{med / base:.1f}x" if base else "-"
        print(f"{name:<30} {med * 1000:>10.1f} {p90 * 1000:>8.1f} {ratio:>13}")


if __name__ == "__main__":
    main()
