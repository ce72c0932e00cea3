"""What an idle scheduler costs, by history: its process CPU while nothing happens, with N executions in the log.

    .venv/bin/python svc-scheduler/bench/idle_cpu.py --baseline 191a30f
    .venv/bin/python svc-scheduler/bench/idle_cpu.py --sizes 100,10000 --window 20

For each N (100, 10k, 100k) a simulated elastic run of about N executions (cells registered, dispatched and
finished executions, role changes, training steps: the simulator's recorded events, ``record_events``) is
appended to a real JetStream stream on a nats-server of the bench's own, with its monitoring endpoint (the
service checks the log's health there, as under ``opengyre up``). Then, for each tree (today's, and each
``--baseline`` commit's ``svc-scheduler`` and ``libs``, extracted with ``git archive`` and put first on the
service's import path), the real service process (``opengyre service run scheduler``, fresh data dir, SQLite)
is started against that stream; the bench waits until its status says the projection folded the whole stream
(a poll of ``GetStatus``, before the window; the first tree's service folds the stream, the others start
from a copy of its store, as a restarted service would: the same stream, the same schema), attaches a ``WatchState`` client as a dashboard would, waits
for the view of the last event, and reads the process's CPU (utime + stime of ``/proc/<pid>/stat``, all its
threads) over an idle window. The machine is shared: CPU-seconds are the figure, not wall time.

Printed per N and tree: CPU-seconds over the window, the share of a core, the ratio to N = 100 and to
today's; views the watcher received during the window (nothing happened: 0).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TREES = ("svc-scheduler", "libs")  # a baseline's scheduler and kernel (projection runner, runtime)
TOKEN = "idle-cpu-bench-token"
GROUP_SIZE = 16
GROUPS_PER_STEP = 4  # 64 executions a step: N = 100 is two steps


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def _cpu_s(pid: int) -> float:
    """utime + stime of the process (every thread), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _events(n: int) -> list[object]:
    """A recorded elastic run of about ``n`` executions (whole steps), on 4 cells."""
    from opengyre.scheduler import LoopConfig
    from opengyre.scheduler.policies import make_policy
    from opengyre.scheduler.sim import ClusterConfig, CostConfig, SimConfig, Simulator

    per_step = GROUPS_PER_STEP * GROUP_SIZE
    loop = LoopConfig(steps=max(1, round(n / per_step)), groups_per_step=GROUPS_PER_STEP, group_size=GROUP_SIZE)
    cfg = SimConfig(
        loop=loop,
        cluster=ClusterConfig(cells=4, nodes_per_cell=1, gpus_per_node=8, slots_per_cell=32),
        costs=CostConfig(micro_step_s=300.0, step_overhead_s=30.0),
        seed=1,
        record_events=True,
    )
    sim = Simulator(cfg, make_policy("elastic"))
    sim.run()
    return list(sim.events)


@dataclass
class Result:
    tree: str
    cpu_s: float
    window_s: float
    catch_up_s: float
    views: int
    load: str

    @property
    def share(self) -> float:
        return self.cpu_s / self.window_s


async def _fill(url: str, stream: str, n: int) -> tuple[int, int]:
    """Append the run's events; (executions, last stream seq)."""
    from opengyre.eventlog import EventLog, LogConfig
    from opengyre.events import Event, ExecutionDispatched

    events = [e for e in _events(n) if isinstance(e, Event)]
    log = await EventLog.connect(url, LogConfig(stream=stream, prefix=f"{stream.lower()}.ev"))
    try:
        acks = await log.append_many(events)
    finally:
        await log.close()
    return sum(isinstance(e, ExecutionDispatched) for e in events), acks[-1].seq


async def _watch_idle(port: int, pid: int, last_seq: int, window_s: float) -> tuple[float, int, float]:
    """Caught up (status), a watcher attached and at ``last_seq``; then (CPU-s, views received, catch-up s)."""
    from opengyre.runtime import grpc_channel
    from opengyre.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc

    t0 = time.perf_counter()
    channel = grpc_channel(f"127.0.0.1:{port}", TOKEN)
    stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
    try:
        while True:  # the service's own account of its projection: folded up to the stream's last event
            st = await stub.GetStatus(common_pb2.StatusRequest())
            p = st.projections[0]
            if p.error:
                raise SystemExit(f"the scheduler's projection refuses the log: {p.error}")
            if p.position >= last_seq and p.pending == 0:
                break
            await asyncio.sleep(0.5)
        catch_up = time.perf_counter() - t0
        watch = stub.WatchState(scheduler_pb2.WatchStateRequest())
        views = 0
        first = asyncio.get_running_loop().create_future()

        async def follow() -> None:
            nonlocal views
            async for view in watch:
                views += 1
                if view.seq >= last_seq and not first.done():
                    first.set_result(None)

        reader = asyncio.create_task(follow())
        await asyncio.wait_for(first, 60)
        seen = views
        c0 = _cpu_s(pid)
        await asyncio.sleep(window_s)  # the idle window being measured (nothing is appended meanwhile)
        cpu = _cpu_s(pid) - c0
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await reader
        return cpu, views - seen, catch_up
    finally:
        await channel.close()


def _serve(tree: Path | None, url: str, monitor: str, stream: str, data: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    if tree is not None:
        paths = [str(tree / t) for t in TREES]
        env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(
        OPENGYRE_NATS_URL=url, OPENGYRE_NATS_MONITOR_URL=monitor, OPENGYRE_STREAM=stream,
        OPENGYRE_SUBJECT_PREFIX=f"{stream.lower()}.ev", OPENGYRE_GRPC_TOKEN=TOKEN,
        OPENGYRE_SCHEDULER_PROXY_ADDR="none", OPENGYRE_SCHEDULER_POLICY="elastic",
        OPENGYRE_SCHEDULER_GROUPS_PER_STEP=str(GROUPS_PER_STEP), OPENGYRE_SCHEDULER_GROUP_SIZE=str(GROUP_SIZE),
    )  # fmt: skip
    for k in ("OPENGYRE_DB_URL", "OPENGYRE_SUPERVISOR_PID"):
        env.pop(k, None)
    argv = [sys.executable, __file__, "--serve", "--data-dir", str(data)]
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=(data / "service.log").open("wb"))


def _measure(tree_name: str, tree: Path | None, url: str, monitor: str, stream: str, last_seq: int,
             window_s: float, tmp: Path, folded: Path | None) -> Result:  # fmt: skip
    """``folded``: a data dir whose store already folded the stream (copied: the catch-up is not measured)."""
    data = tmp / f"data-{stream}-{tree_name}"
    data.mkdir(parents=True)
    if folded is not None:
        shutil.copytree(folded / "db", data / "db")
    port_file = data / "port"
    proc = _serve(tree, url, monitor, stream, data)
    try:
        while not port_file.exists():  # written once the service serves (its own start, then the bind)
            if proc.poll() is not None:
                raise SystemExit(f"the service exited: {(data / 'service.log').read_text()[-2000:]}")
            time.sleep(0.2)
        port = int(port_file.read_text())
        load = _load()
        cpu, views, catch_up = asyncio.run(_watch_idle(port, proc.pid, last_seq, window_s))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    lines = (data / "service.log").read_text().splitlines()
    for package in ("scheduler", "projection"):  # a baseline's, from its extracted tree; today's otherwise
        where = next((ln.split(": ", 1)[1] for ln in lines if ln.startswith(f"{package} package: ")), "")
        if (tree is not None) != where.startswith(str(tree or "/nonexistent")):
            raise SystemExit(f"the service ran the wrong {package} package: {where!r}")
    return Result(tree_name, cpu, window_s, catch_up, views, load)


def _serve_main(data_dir: str) -> None:
    """The child: today's or the baseline's scheduler (whichever the import path finds) as ``service run``."""
    import opengyre.projection
    import opengyre.scheduler

    print(f"scheduler package: {Path(opengyre.scheduler.__file__ or '').parent}", file=sys.stderr, flush=True)
    print(f"projection package: {Path(opengyre.projection.__file__ or '').parent}", file=sys.stderr, flush=True)
    from opengyre.cli import main

    port_file = str(Path(data_dir) / "port")
    sys.argv = ["opengyre", "service", "run", "scheduler", "--port", "0", "--port-file", port_file]
    sys.argv += ["--data-dir", data_dir]
    main()


def _extract(rev: str, where: Path) -> Path:
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", rev, *TREES], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        t.extractall(where, filter="data")
    return where


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", action="append", default=[], help="git commit to compare with (repeatable)")
    ap.add_argument("--sizes", default="100,10000,100000", help="executions in the log, comma-separated")
    ap.add_argument("--window", type=float, default=30.0, help="seconds of idle measured per run")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--data-dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        _serve_main(args.data_dir)
        return
    from opengyre.runtime import EmbeddedNats

    sizes = [int(x) for x in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="idle-cpu-") as tmp_s:
        tmp = Path(tmp_s)
        trees: list[tuple[str, Path | None]] = [("today", None)]
        for rev in args.baseline:
            trees.append((rev, _extract(rev, tmp / f"tree-{rev}")))
        nats = EmbeddedNats(tmp / "nats")
        nats.start()
        try:
            print(f"idle scheduler CPU over {args.window:.0f} s, a WatchState client attached; elastic, 4 cells, "
                  f"{GROUPS_PER_STEP}x{GROUP_SIZE} executions a step; trees: {', '.join(n for n, _ in trees)}",
                  flush=True)  # fmt: skip
            first: dict[str, Result] = {}
            for i, n in enumerate(sizes):
                stream = f"IDLE{i}"
                executions, last_seq = asyncio.run(_fill(nats.url, stream, n))
                results: dict[str, Result] = {}
                folded: Path | None = None  # the first tree folds the stream; the others start from its store
                for name, tree in trees if i % 2 == 0 else trees[::-1]:  # the load changes: alternate who goes first
                    results[name] = _measure(
                        name, tree, nats.url, nats.monitor_url, stream, last_seq, args.window, tmp, folded
                    )
                    folded = folded or tmp / f"data-{stream}-{name}"
                for name, _ in trees:
                    r = results[name]
                    first.setdefault(name, r)
                    line = (f"N = {executions:7,d} executions ({last_seq:,} events), {name:>8}: {r.cpu_s:6.2f} CPU-s "
                            f"= {100 * r.share:5.2f} % of a core, x{r.share / first[name].share:5.2f} of its "
                            f"smallest N; {r.views} views sent while idle; caught up in {r.catch_up_s:.0f} s "
                            f"(load {r.load})")  # fmt: skip
                    if name != "today":
                        line += f"; x{r.share / results['today'].share:.1f} today's"
                    print(line, flush=True)
        finally:
            nats.stop()


if __name__ == "__main__":
    main()
