"""`opengyre bench ...` as a user runs it: against the CPU engine over HTTP, publishing to a real event log."""

from __future__ import annotations

import asyncio
import csv
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from opengyre.bench import Profile
from opengyre.cli import app
from opengyre.engine import EngineConfig, EngineServer
from opengyre.eventlog import EventLog
from opengyre.events import BenchRunCompleted
from opengyre.runtime import EmbeddedNats

from ._configs import LLAMA_31_8B

runner = CliRunner()


def og(*args: str) -> tuple[int, str]:
    r = runner.invoke(app, list(args), env={"COLUMNS": "200"})
    return r.exit_code, r.output + (repr(r.exception) if r.exception and r.exit_code not in (0, 2) else "")


@pytest.fixture(scope="module")
def engine_url() -> Iterator[tuple[str, str]]:
    """The CPU engine on its own loop in a thread, so the CLI's asyncio.run can drive load against it."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    stop = asyncio.Event()
    info: dict[str, str] = {}

    async def serve() -> None:
        async with EngineServer(EngineConfig(port=0, threads=1)) as srv:
            info["url"], info["model"] = srv.url, srv.engine.config.model_name
            started.set()
            await stop.wait()

    t = threading.Thread(target=lambda: loop.run_until_complete(serve()), daemon=True)
    t.start()
    assert started.wait(120), "engine did not start"
    yield info["url"], info["model"]
    loop.call_soon_threadsafe(stop.set)
    t.join(60)


def test_profiles_and_roofline(tmp_path: Path) -> None:
    code, out = og("bench", "profiles")
    assert code == 0 and "coding" in out and "9995" in out
    cfg = tmp_path / "Llama-3.1-8B" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(json.dumps(LLAMA_31_8B))
    code, out = og(
        "bench",
        "roofline",
        str(cfg),
        "--hardware",
        "H100",
        "--profile",
        "coding",
        "--mem-util",
        "1",
        "--out",
        str(tmp_path / "r"),
    )
    assert code == 0, out
    doc = json.loads((tmp_path / "r" / "roofline.json").read_text())
    assert doc["prefill"]["components"]["mlp"]["bound"] == "compute"
    assert doc["decode"]["components"]["mlp"]["bound"] == "memory"
    assert (tmp_path / "r" / "roofline.png").stat().st_size > 0
    cfg.write_text(json.dumps({k: v for k, v in LLAMA_31_8B.items() if k != "intermediate_size"}))
    code, out = og("bench", "roofline", str(cfg))
    assert code == 2 and "missing: intermediate_size" in out
    code, out = og("bench", "roofline", str(cfg), "--hardware", "TPU")
    assert code == 2 and "unknown hardware 'TPU'" in out and '"unknown' not in out and "'unknown" not in out


def test_roofline_options_are_checked_in_the_users_words(tmp_path: Path) -> None:
    cfg = tmp_path / "Llama-3.1-8B" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(json.dumps(LLAMA_31_8B))  # 32 attention heads, 8 KV heads
    for opt, value in (("--tp", "0"), ("--mem-util", "0"), ("--mem-util", "1.5"), ("--isl", "0"), ("--batch", "0")):
        code, out = og("bench", "roofline", str(cfg), opt, value)
        assert code == 2 and opt in out, out
        assert "memory_utilisation" not in out and "context must" not in out, out
    code, out = og("bench", "roofline", str(cfg), "--tp", "3")
    assert code == 2 and "tensor-parallel degree of 3" in out, out
    code, out = og("bench", "roofline", str(cfg), "--tp", "16")  # past the 8 KV heads: each rank a replica
    assert code == 0 and "--tp" not in out, out


def test_fit_a_sharegpt_trace_and_refuse_a_malformed_one(tmp_path: Path) -> None:
    trace = tmp_path / "t.json"
    convs = [
        {
            "id": str(i),
            "conversations": [{"from": "human", "value": "q" * (10 + i)}, {"from": "gpt", "value": "a" * (5 + i)}],
        }
        for i in range(6)
    ]
    trace.write_text(json.dumps(convs))
    code, out = og(
        "bench", "fit", str(trace), "--format", "sharegpt", "--name", "mine", "--out", str(tmp_path / "p.json")
    )
    assert code == 0, out
    prof = Profile.from_dict(json.loads((tmp_path / "p.json").read_text()))
    assert prof.name == "mine" and prof.turns.mean == 1 and 7 < prof.output.mean < 9
    trace.write_text("[{")
    code, out = og("bench", "fit", str(trace), "--format", "sharegpt")
    assert code == 2 and "not valid JSON" in out


def test_run_replay_and_synthetic_publish_and_compare(
    engine_url: tuple[str, str], nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    url, model = engine_url
    trace = tmp_path / "t.json"
    convs = [
        {
            "id": str(i),
            "conversations": [
                {"from": "human", "value": f"question {i} " * 4},
                {"from": "gpt", "value": "x" * 6},
                {"from": "human", "value": "and then?"},
                {"from": "gpt", "value": "y" * 4},
            ],
        }
        for i in range(3)
    ]
    trace.write_text(json.dumps(convs))

    async def make_stream() -> None:  # the stream is the stack's (`up` creates it); a client only looks it up
        await (await EventLog.connect(nats_server.url)).close()

    asyncio.run(make_stream())
    code, out = og(
        "bench",
        "run",
        "--url",
        url,
        "--model",
        model,
        "--trace",
        str(trace),
        "--format",
        "sharegpt",
        "-c",
        "2",
        "--out",
        str(tmp_path / "replay"),
        "--publish",
        "--nats-url",
        nats_server.url,
    )
    assert code == 0, out
    doc = json.loads((tmp_path / "replay" / "run.json").read_text())
    assert doc["summary"]["requests_ok"] == 6 and doc["summary"]["tokenizer_check"]["mismatched"] == 0
    assert doc["workload"]["form"] == "replay" and doc["workload"]["trace"] == "t.json"

    def run(out: str, *extra: str) -> None:
        code, text = og("bench", "run", "--url", url, "--model", model, *extra, "--out", str(tmp_path / out))
        assert code == 0, text

    # the synthetic form of the same trace: sessions drawn from the profile fitted to it, as many as it has
    run("synth", "--trace", str(trace), "--form", "synthetic", "-c", "2")
    sdoc = json.loads((tmp_path / "synth" / "run.json").read_text())
    assert sdoc["workload"]["source"] == doc["workload"]["source"] and sdoc["config"]["sessions"] == 3
    assert sdoc["profile"]["turns"]["mean"] == 2
    with (tmp_path / "synth" / "requests.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert rows and all(r["ok"] == "True" and float(r["ttft"]) > 0 for r in rows)
    code, out = og("bench", "compare", str(tmp_path / "replay"), str(tmp_path / "synth"))
    assert code == 0 and "per_turn_mape" in out and "synthetic vs replay: E2EL MAPE per turn index" in out, out

    # not two forms of one workload under one load: refused, the difference named
    code, out = og("bench", "fit", str(trace), "--format", "sharegpt", "--out", str(tmp_path / "p.json"))
    assert code == 0
    run("profile", "--profile", str(tmp_path / "p.json"), "--sessions", "3", "-c", "2")
    code, out = og("bench", "compare", str(tmp_path / "replay"), str(tmp_path / "profile"))
    assert code == 2 and "forms of different workloads" in out, out
    run("replay-c1", "--trace", str(trace), "-c", "1")
    code, out = og("bench", "compare", str(tmp_path / "replay"), str(tmp_path / "replay-c1"))
    assert code == 2 and "differ in concurrency: A 2, B 1" in out, out
    code, out = og("bench", "compare", str(tmp_path / "replay"), str(tmp_path / "nothing"))
    assert code == 2 and "cannot read run" in out, out
    code, out = og("bench", "run", "--url", url, "--model", model, "--trace", str(trace), "--form", "exact")
    assert code == 2 and "form must be one of replay, shadow, synthetic" in out, out
    code, out = og("bench", "run", "--url", url, "--model", model, "--profile", "chat", "--form", "replay")
    assert code == 2 and "a profile has only the synthetic form; replay needs a trace" in out, out

    async def published() -> list[BenchRunCompleted]:
        log = await EventLog.connect(nats_server.url)
        try:
            return [e async for _, e in log.events(BenchRunCompleted)]
        finally:
            await log.close()

    [ev] = asyncio.run(published())
    assert ev.profile == "replay:t.json" and ev.concurrency == 2 and ev.metrics["requests_ok"] == 6
    assert ev.metrics["partial"] == 0.0 and ev.metrics["ttft_p50_s"] > 0


def test_run_against_an_unreachable_server_is_a_marked_partial_result(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        code, out = og(
            "bench",
            "run",
            "--url",
            f"http://127.0.0.1:{port}",
            "--model",
            "m",
            "--profile",
            "chat",
            "--length-scale",
            "0.05",
            "--sessions",
            "2",
            "-c",
            "1",
            "--out",
            str(tmp_path),
        )
    assert code == 1 and "partial result" in out and "server unreachable" in out  # a failed run, not bad input
    doc = json.loads((tmp_path / "run.json").read_text())
    assert doc["summary"]["partial"] and doc["summary"]["requests_failed"] == 2
